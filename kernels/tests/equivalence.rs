//! Every fast kernel, at every instruction-set level this CPU supports, equals the scalar
//! reference bit for bit, for every dtype × op, random lengths and unaligned offsets.
//! (The one allowance: where both results are NaN, the payload may differ.)

use ferroccl_kernels::simd::{self, Isa};
use ferroccl_kernels::{reference, DataType, ElemOp, Fp8E4M3, Fp8E5M2};
use half::{bf16, f16};
use proptest::prelude::*;

/// Whether one element's bytes encode a NaN.
fn is_nan(dtype: DataType, e: &[u8]) -> bool {
    match dtype {
        DataType::Float16 => f16::from_ne_bytes([e[0], e[1]]).is_nan(),
        DataType::Bfloat16 => bf16::from_ne_bytes([e[0], e[1]]).is_nan(),
        DataType::Float32 => f32::from_ne_bytes([e[0], e[1], e[2], e[3]]).is_nan(),
        DataType::Float64 => f64::from_ne_bytes(e.try_into().expect("8 bytes")).is_nan(),
        DataType::Float8E4M3 => Fp8E4M3(e[0]).is_nan(),
        DataType::Float8E5M2 => Fp8E5M2(e[0]).is_nan(),
        _ => false,
    }
}

fn assert_same(what: &str, isa: Isa, dtype: DataType, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len());
    let s = dtype.size();
    for (i, (g, w)) in got.chunks_exact(s).zip(want.chunks_exact(s)).enumerate() {
        assert!(
            g == w || (is_nan(dtype, g) && is_nan(dtype, w)),
            "{what} {dtype} isa {}: element {i} of {}: got {g:02x?}, reference {w:02x?}",
            isa.name(),
            got.len() / s
        );
    }
}

/// A byte buffer with `len` bytes of `data` starting at byte offset `off` (so misaligned).
struct Buf {
    bytes: Vec<u8>,
    off: usize,
    len: usize,
}

impl Buf {
    fn new(data: &[u8], off: usize) -> Buf {
        let mut bytes = vec![0xa5u8; off + data.len() + 7];
        bytes[off..off + data.len()].copy_from_slice(data);
        Buf {
            bytes,
            off,
            len: data.len(),
        }
    }
    fn get(&self) -> &[u8] {
        &self.bytes[self.off..self.off + self.len]
    }
    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.off..self.off + self.len]
    }
    /// Bytes outside the window must never change.
    fn check_guard(&self) {
        let outside = self.bytes[..self.off]
            .iter()
            .chain(&self.bytes[self.off + self.len..]);
        assert!(
            outside.into_iter().all(|&b| b == 0xa5),
            "kernel wrote outside its buffer"
        );
    }
}

/// Element values: either raw random bits (NaNs, infinities, subnormals, huge and tiny values)
/// or small, mostly exact values, converted per dtype.
fn values(dtype: DataType, n: usize, raw: bool, seed: &[u8], small: &[i16]) -> Vec<u8> {
    if raw {
        return seed
            .iter()
            .copied()
            .cycle()
            .take(n * dtype.size())
            .collect();
    }
    let mut out = Vec::with_capacity(n * dtype.size());
    for i in 0..n {
        let v = f64::from(small[i % small.len()]) / 4.0;
        let bytes: Vec<u8> = match dtype {
            DataType::Int8 => (v as i8).to_ne_bytes().to_vec(),
            DataType::Uint8 => (v as u8).to_ne_bytes().to_vec(),
            DataType::Int32 => (v as i32).to_ne_bytes().to_vec(),
            DataType::Uint32 => (v as u32).to_ne_bytes().to_vec(),
            DataType::Int64 => (v as i64).to_ne_bytes().to_vec(),
            DataType::Uint64 => (v as u64).to_ne_bytes().to_vec(),
            DataType::Float16 => f16::from_f64(v).to_ne_bytes().to_vec(),
            DataType::Bfloat16 => bf16::from_f64(v).to_ne_bytes().to_vec(),
            DataType::Float32 => (v as f32).to_ne_bytes().to_vec(),
            DataType::Float64 => v.to_ne_bytes().to_vec(),
            DataType::Float8E4M3 => vec![Fp8E4M3::from_f64(v).0],
            DataType::Float8E5M2 => vec![Fp8E5M2::from_f64(v).0],
        };
        out.extend_from_slice(&bytes);
    }
    out
}

#[derive(Debug, Clone)]
struct Case {
    dtype: DataType,
    op: ElemOp,
    #[allow(dead_code)] // shown in failure output
    n: usize,
    offs: [usize; 3],
    a: Vec<u8>,
    b: Vec<u8>,
    factor: f64,
    divisor: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let dtype = prop::sample::select(DataType::ALL.to_vec());
    let op = prop::sample::select(ElemOp::ALL.to_vec());
    // Mostly short (every tail length), sometimes long enough for several unrolled iterations.
    let n = prop_oneof![4 => 0usize..80, 1 => 80usize..1200];
    let factor = prop_oneof![
        Just(0.5),
        Just(-3.0),
        Just(1.0 / 3.0),
        -1000.0f64..1000.0,
        any::<f64>(),
    ];
    let divisor = prop_oneof![
        1u64..10,
        1u64..=u64::MAX,
        Just(1u64 << 31),
        Just(1u64 << 63)
    ];
    (
        dtype,
        op,
        n,
        prop::array::uniform3(0usize..8),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 1..64),
        prop::collection::vec(any::<u8>(), 1..64),
        prop::collection::vec(any::<i16>(), 1..32),
        prop::collection::vec(any::<i16>(), 1..32),
        factor,
        divisor,
    )
        .prop_map(
            |(dtype, op, n, offs, raw, sa, sb, va, vb, factor, divisor)| Case {
                dtype,
                op,
                n,
                offs,
                a: values(dtype, n, raw, &sa, &va),
                b: values(dtype, n, raw, &sb, &vb),
                factor,
                divisor,
            },
        )
}

fn check_case(c: &Case) {
    let Case {
        dtype, op, offs, ..
    } = *c;
    for isa in Isa::supported() {
        // reduce_inplace
        let mut want = c.a.clone();
        reference::reduce_inplace(dtype, op, &mut want, &c.b);
        let mut dst = Buf::new(&c.a, offs[0]);
        let src = Buf::new(&c.b, offs[1]);
        simd::reduce_inplace_with(isa, dtype, op, dst.get_mut(), src.get());
        assert_same("reduce_inplace", isa, dtype, dst.get(), &want);
        dst.check_guard();

        // reduce into a third buffer
        let a = Buf::new(&c.a, offs[1]);
        let b = Buf::new(&c.b, offs[2]);
        let mut dst = Buf::new(&vec![0x11; c.a.len()], offs[0]);
        simd::reduce_with(isa, dtype, op, dst.get_mut(), a.get(), b.get());
        assert_same("reduce", isa, dtype, dst.get(), &want);
        dst.check_guard();

        // scale and scale_into
        let mut want = c.a.clone();
        reference::scale(dtype, &mut want, c.factor);
        let mut buf = Buf::new(&c.a, offs[2]);
        simd::scale_with(isa, dtype, buf.get_mut(), c.factor);
        assert_same("scale", isa, dtype, buf.get(), &want);
        buf.check_guard();
        let mut dst = Buf::new(&vec![0x22; c.a.len()], offs[0]);
        simd::scale_into_with(isa, dtype, dst.get_mut(), a.get(), c.factor);
        assert_same("scale_into", isa, dtype, dst.get(), &want);
        dst.check_guard();

        // divide
        let mut want = c.b.clone();
        reference::divide(dtype, &mut want, c.divisor);
        let mut buf = Buf::new(&c.b, offs[1]);
        simd::divide_with(isa, dtype, buf.get_mut(), c.divisor);
        assert_same("divide", isa, dtype, buf.get(), &want);
        buf.check_guard();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn fast_kernels_equal_reference(c in case()) {
        check_case(&c);
    }
}

/// Every dtype × op × length 0..70 at every offset, deterministic (complements the random run).
#[test]
fn exhaustive_small_lengths() {
    let seed: Vec<u8> = (0..61u8)
        .map(|i| i.wrapping_mul(97).wrapping_add(13))
        .collect();
    let small: Vec<i16> = (0..23).map(|i| (i * 37 % 41) - 20).collect();
    for dtype in DataType::ALL {
        for op in ElemOp::ALL {
            for n in 0..70 {
                for raw in [false, true] {
                    let a = values(dtype, n, raw, &seed, &small);
                    let b = values(dtype, n, raw, &seed[7..], &small[3..]);
                    for off in 0..4 {
                        check_case(&Case {
                            dtype,
                            op,
                            n,
                            offs: [off, (off + 1) % 8, (off + 5) % 8],
                            a: a.clone(),
                            b: b.clone(),
                            factor: -2.75,
                            divisor: 3,
                        });
                    }
                }
            }
        }
    }
}

/// The crate-level functions use the cached level and agree with the reference too.
#[test]
fn public_functions_equal_reference() {
    let n = 1001;
    for dtype in DataType::ALL {
        let seed: Vec<u8> = (0..97u8)
            .map(|i| i.wrapping_mul(31).wrapping_add(3))
            .collect();
        let small: Vec<i16> = (0..29).map(|i| i * 5 - 70).collect();
        let a = values(dtype, n, false, &seed, &small);
        let b = values(dtype, n, false, &seed, &small[1..]);
        for op in ElemOp::ALL {
            let mut want = a.clone();
            reference::reduce_inplace(dtype, op, &mut want, &b);
            let mut got = a.clone();
            ferroccl_kernels::reduce_inplace(dtype, op, &mut got, &b);
            assert_same("reduce_inplace", simd::isa(), dtype, &got, &want);
            let mut got = vec![0; a.len()];
            ferroccl_kernels::reduce(dtype, op, &mut got, &a, &b);
            assert_same("reduce", simd::isa(), dtype, &got, &want);
        }
        let mut want = a.clone();
        reference::scale(dtype, &mut want, 1.5);
        let mut got = a.clone();
        ferroccl_kernels::scale(dtype, &mut got, 1.5);
        assert_same("scale", simd::isa(), dtype, &got, &want);
        let mut got = vec![0; a.len()];
        ferroccl_kernels::scale_into(dtype, &mut got, &a, 1.5);
        assert_same("scale_into", simd::isa(), dtype, &got, &want);
        let mut want = a.clone();
        reference::divide(dtype, &mut want, 7);
        let mut got = a.clone();
        ferroccl_kernels::divide(dtype, &mut got, 7);
        assert_same("divide", simd::isa(), dtype, &got, &want);
    }
}
