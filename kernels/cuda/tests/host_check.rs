//! The kernels' element logic and reduce-copy loop (`ferro_reduce.h`, built as host C) against
//! the Rust reference of `ferroccl-kernels`, bit for bit: every dtype × sum, prod, max, min,
//! pre-multiplied sum and average; several sources and destinations; in place; counts 0, 1,
//! primes and odd tails; aligned, equally misaligned, element-unaligned and mixed offsets;
//! 1, 3 and 32 simulated threads. Conversions of f16, bf16 and fp8 are checked exhaustively
//! (narrow to f32) and over a dense sweep of f32 bit patterns (f32 to narrow).

use ferroccl_cuda::check::{cases, expected, same_element, values, Rng, COUNTS};
use ferroccl_cuda::{host, RcArgs};
use ferroccl_kernels::{DataType, Fp8E4M3, Fp8E5M2};
use half::{bf16, f16};

/// A 16-byte aligned byte buffer with guard bytes around the part under test.
struct Buf {
    store: Vec<u128>,
    off: usize,
    len: usize,
}

const GUARD: u8 = 0xa5;

impl Buf {
    fn new(off: usize, bytes: &[u8]) -> Buf {
        let words = (off + bytes.len() + 32).div_ceil(16);
        let mut b = Buf {
            store: vec![u128::from_ne_bytes([GUARD; 16]); words],
            off,
            len: bytes.len(),
        };
        let (o, l) = (b.off, b.len);
        b.all_mut()[o..o + l].copy_from_slice(bytes);
        b
    }
    fn all(&self) -> &[u8] {
        // Viewing u128s as bytes: u8 has no invalid values and alignment 1.
        let p = self.store.as_ptr().cast::<u8>();
        // SAFETY: the Vec owns store.len() * 16 initialised bytes; borrow tied to self.
        unsafe { std::slice::from_raw_parts(p, self.store.len() * 16) }
    }
    fn all_mut(&mut self) -> &mut [u8] {
        let n = self.store.len() * 16;
        let p = self.store.as_mut_ptr().cast::<u8>();
        // SAFETY: as in `all`, with the unique borrow of self.
        unsafe { std::slice::from_raw_parts_mut(p, n) }
    }
    fn bytes(&self) -> &[u8] {
        &self.all()[self.off..self.off + self.len]
    }
    fn addr(&mut self) -> u64 {
        let off = self.off;
        self.all_mut()[off..].as_mut_ptr() as u64
    }
    fn guards_intact(&self) -> bool {
        let all = self.all();
        all[..self.off].iter().all(|&b| b == GUARD)
            && all[self.off + self.len..].iter().all(|&b| b == GUARD)
    }
}

/// Byte offsets of the sources and destinations inside their 16-aligned buffers.
fn layouts(size: usize) -> Vec<(&'static str, Vec<usize>)> {
    let n = 1 + 8 + 8;
    vec![
        ("aligned", vec![0; n]),
        ("same misalignment", vec![size % 16; n]),
        ("element-unaligned", vec![1; n]),
        ("mixed", (0..n).map(|i| (i * size) % 16).collect()),
    ]
}

#[test]
fn reduce_copy_matches_reference_for_every_dtype_and_op() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut checked = 0u64;
    for dtype in DataType::ALL {
        let size = dtype.size();
        for case in cases() {
            for (layout, offs) in layouts(size) {
                for count in COUNTS {
                    let srcs: Vec<Vec<u8>> = (0..case.nsrc)
                        .map(|s| values(dtype, count, s, &mut rng))
                        .collect();
                    let want = expected(dtype, &case, &srcs);
                    for nthreads in [1u64, 3, 32] {
                        let mut sbufs: Vec<Buf> = srcs
                            .iter()
                            .enumerate()
                            .map(|(s, b)| Buf::new(offs[s], b))
                            .collect();
                        let first_dst = case.in_place;
                        let mut dbufs: Vec<Buf> = (first_dst..case.ndst)
                            .map(|k| Buf::new(offs[9 + k], &vec![0x5a; count * size]))
                            .collect();
                        let src_addrs: Vec<u64> = sbufs.iter_mut().map(Buf::addr).collect();
                        let mut dst_addrs: Vec<u64> = src_addrs[..first_dst].to_vec();
                        dst_addrs.extend(dbufs.iter_mut().map(Buf::addr));
                        let mut args = RcArgs::new(&src_addrs, &dst_addrs, count as u64);
                        if case.scale_mask != 0 {
                            args = args.with_scale(dtype, case.scale_mask, case.factor);
                        }
                        if case.divide {
                            args = args.with_divide(dtype, case.nsrc as u64);
                        }
                        // SAFETY: every address is inside a live buffer of `count` elements;
                        // destinations are distinct buffers or exactly the source of their index (in place).
                        unsafe { host::reduce_copy(dtype, case.op, &args, nthreads) };
                        let what = format!(
                            "{dtype} {case:?} count {count} layout {layout} nthreads {nthreads}"
                        );
                        let mut outs: Vec<&Buf> = sbufs[..first_dst].iter().collect();
                        outs.extend(dbufs.iter());
                        for (k, b) in outs.iter().enumerate() {
                            assert!(
                                b.guards_intact(),
                                "{what}: destination {k} written out of range"
                            );
                            if let Some(i) = (0..count).find(|&i| {
                                !same_element(
                                    dtype,
                                    &case,
                                    &b.bytes()[i * size..][..size],
                                    &want[i * size..][..size],
                                )
                            }) {
                                panic!(
                                    "{what}: destination {k} element {i}: got {:02x?}, want {:02x?} \
                                     (sources {:02x?})",
                                    &b.bytes()[i * size..][..size],
                                    &want[i * size..][..size],
                                    srcs.iter().map(|s| &s[i * size..][..size]).collect::<Vec<_>>()
                                );
                            }
                        }
                        for (s, b) in sbufs.iter().enumerate().skip(first_dst) {
                            assert_eq!(b.bytes(), &srcs[s][..], "{what}: source {s} changed");
                        }
                        checked += count as u64;
                    }
                }
            }
        }
    }
    assert!(checked > 1_000_000, "checked only {checked} elements");
}

#[test]
fn narrow_to_f32_conversions_match_exhaustively() {
    for h in 0..=u16::MAX {
        assert_eq!(
            host::f16_to_f32(h).to_bits(),
            f16::from_bits(h).to_f32().to_bits(),
            "f16 {h:#06x}"
        );
        assert_eq!(
            host::bf16_to_f32(h).to_bits(),
            bf16::from_bits(h).to_f32().to_bits(),
            "bf16 {h:#06x}"
        );
    }
    for c in 0..=u8::MAX {
        assert_eq!(
            host::e4m3_to_f32(c).to_bits(),
            Fp8E4M3(c).to_f32().to_bits(),
            "e4m3 {c:#04x}"
        );
        assert_eq!(
            host::e5m2_to_f32(c).to_bits(),
            Fp8E5M2(c).to_f32().to_bits(),
            "e5m2 {c:#04x}"
        );
    }
}

#[test]
fn f32_to_narrow_conversions_match_on_a_dense_sweep() {
    // Every 61st f32 bit pattern (70 million values), plus every pattern near the narrow
    // formats' halfway points and overflow thresholds, which the stride could miss.
    let check = |bits: u32| {
        let f = f32::from_bits(bits);
        assert_eq!(
            host::f32_to_f16(f),
            f16::from_f32(f).to_bits(),
            "f16 of {bits:#010x}"
        );
        assert_eq!(
            host::f32_to_bf16(f),
            bf16::from_f32(f).to_bits(),
            "bf16 of {bits:#010x}"
        );
        assert_eq!(
            host::f32_to_e4m3(f),
            Fp8E4M3::from_f32(f).0,
            "e4m3 of {bits:#010x}"
        );
        assert_eq!(
            host::f32_to_e5m2(f),
            Fp8E5M2::from_f32(f).0,
            "e5m2 of {bits:#010x}"
        );
    };
    let mut bits = 0u32;
    while let Some(next) = bits.checked_add(61) {
        check(bits);
        bits = next;
    }
    // Around every narrow value, the f32 patterns at and next to the midpoints to its neighbour.
    for h in 0..=u16::MAX {
        for f in [f16::from_bits(h).to_f32(), bf16::from_bits(h).to_f32()] {
            let b = f.to_bits();
            for d in [0x1000u32, 0x0fff, 0x1001, 0x8000, 0x7fff, 0x8001] {
                check(b.wrapping_add(d));
                check(b.wrapping_sub(d));
            }
        }
    }
    for c in 0..=u8::MAX {
        for f in [Fp8E4M3(c).to_f32(), Fp8E5M2(c).to_f32()] {
            let b = f.to_bits();
            for d in [
                1u32 << 19,
                (1 << 19) - 1,
                (1 << 19) + 1,
                1 << 20,
                (1 << 20) - 1,
                (1 << 20) + 1,
            ] {
                check(b.wrapping_add(d));
                check(b.wrapping_sub(d));
            }
        }
    }
}
