//! What the kernels are checked against, shared by the host check (`tests/host_check.rs`) and
//! the GPU check (`ferro-gpu-check`): the cases, their inputs (special values first, then
//! random bits) and the Rust reference's answer.

use ferroccl_kernels::{reference, DataType, ElemOp, Fp8E4M3, Fp8E5M2};

use crate::{MAX_DSTS, MAX_SRCS};

/// xorshift64*: reproducible bits.
#[derive(Debug)]
pub struct Rng(pub u64);
impl Rng {
    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Bit patterns every float type must get right: NaNs (quiet, signalling, negative), ±inf, ±0,
/// ±1, the largest finite values, the smallest subnormal, and rounding-sensitive neighbours.
pub fn specials(dtype: DataType) -> Vec<u64> {
    match dtype {
        DataType::Float32 => vec![
            0x7fc0_0000,
            0xffc0_0000,
            0x7f80_0001,
            0x7fa0_0000,
            0x7f80_0000,
            0xff80_0000,
            0,
            0x8000_0000,
            0x3f80_0000,
            0xbf80_0000,
            0x7f7f_ffff,
            0xff7f_ffff,
            1,
            0x8000_0001,
            0x3380_0000,
            0x3f80_0001,
        ],
        DataType::Float64 => vec![
            0x7ff8_0000_0000_0000,
            0xfff8_0000_0000_0000,
            0x7ff0_0000_0000_0001,
            0x7ff0_0000_0000_0000,
            0xfff0_0000_0000_0000,
            0,
            0x8000_0000_0000_0000,
            0x3ff0_0000_0000_0000,
            0xbff0_0000_0000_0000,
            0x7fef_ffff_ffff_ffff,
            1,
            0x8000_0000_0000_0001,
            0x3ca0_0000_0000_0000,
            0x3ff0_0000_0000_0001,
        ],
        DataType::Float16 => vec![
            0x7e00, 0xfe00, 0x7c01, 0x7d00, 0x7c00, 0xfc00, 0, 0x8000, 0x3c00, 0xbc00, 0x7bff,
            0xfbff, 1, 0x8001, 0x1000, 0x3c01, 0x0400, 0x03ff,
        ],
        DataType::Bfloat16 => vec![
            0x7fc0, 0xffc0, 0x7f81, 0x7fa0, 0x7f80, 0xff80, 0, 0x8000, 0x3f80, 0xbf80, 0x7f7f,
            0xff7f, 1, 0x8001, 0x4380, 0x3f81,
        ],
        DataType::Float8E4M3 => vec![
            0x7f, 0xff, 0x7e, 0xfe, 0, 0x80, 0x38, 0xb8, 1, 0x81, 0x08, 0x07, 0x39, 0x77, 0x3f,
        ],
        DataType::Float8E5M2 => vec![
            0x7e, 0xfe, 0x7d, 0x7f, 0x7c, 0xfc, 0, 0x80, 0x3c, 0xbc, 0x7b, 0xfb, 1, 0x81, 0x04,
            0x3d,
        ],
        _ => vec![],
    }
}

/// `count` elements of `dtype` for source `which`: every pair of specials first, then random
/// bits (distinct in every element, and different for every source).
pub fn values(dtype: DataType, count: usize, which: usize, rng: &mut Rng) -> Vec<u8> {
    let size = dtype.size();
    let sp = specials(dtype);
    let mut out = Vec::with_capacity(count * size);
    for i in 0..count {
        let bits = if !sp.is_empty() && i < sp.len() * sp.len() {
            let k = if which.is_multiple_of(2) {
                i / sp.len()
            } else {
                i % sp.len()
            };
            sp[k]
        } else {
            rng.bits()
        };
        out.extend_from_slice(&bits.to_ne_bytes()[..size]);
    }
    out
}

/// One case: which op, how many sources and destinations, scaling, dividing, in place.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// See the struct docs.
    pub op: ElemOp,
    /// See the struct docs.
    pub nsrc: usize,
    /// See the struct docs.
    pub ndst: usize,
    /// See the struct docs.
    pub scale_mask: u32,
    /// See the struct docs.
    pub factor: f64,
    /// See the struct docs.
    pub divide: bool,
    /// How many destinations are sources themselves: destination `k` is source `k` for every
    /// `k` below this (1: NCCL's in-place calls; all of them: the share of a collective
    /// between the ranks' buffers where every rank is in place).
    pub in_place: usize,
}

/// A case of `op` with `nsrc` sources and `ndst` destinations, nothing else.
pub const fn case(op: ElemOp, nsrc: usize, ndst: usize) -> Case {
    Case {
        op,
        nsrc,
        ndst,
        scale_mask: 0,
        factor: 0.0,
        divide: false,
        in_place: 0,
    }
}

/// The cases both checks run: every op with 2 sources (also in place) and 3 sources into 2
/// destinations; pre-multiplied sums; scale alone; divide alone; averages of 2 and 5 sources;
/// the widest shares of collectives between the ranks' buffers (8 sources into 8
/// destinations, every op, out of place and with every destination its source; a
/// pre-multiplied sum and an average of 8 so).
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for op in ElemOp::ALL {
        v.push(case(op, 2, 1));
        v.push(Case {
            in_place: 1,
            ..case(op, 2, 1)
        });
        v.push(case(op, 3, 2));
        v.push(case(op, MAX_SRCS, MAX_DSTS));
        v.push(Case {
            in_place: MAX_DSTS,
            ..case(op, MAX_SRCS, MAX_DSTS)
        });
    }
    // Pre-multiplied sum: every source scaled (NCCL's PreMulSum), and only the local one.
    v.push(Case {
        scale_mask: 0b11,
        factor: 0.37,
        ..case(ElemOp::Sum, 2, 1)
    });
    v.push(Case {
        scale_mask: 0b01,
        factor: -2.75,
        ..case(ElemOp::Sum, 3, 1)
    });
    // Scale alone (scale_into), divide alone in place, average of two and of five sources.
    v.push(Case {
        scale_mask: 1,
        factor: 3.9,
        ..case(ElemOp::Sum, 1, 1)
    });
    v.push(Case {
        divide: true,
        in_place: 1,
        ..case(ElemOp::Sum, 1, 1)
    });
    v.push(Case {
        divide: true,
        ..case(ElemOp::Sum, 2, 1)
    });
    v.push(Case {
        divide: true,
        ..case(ElemOp::Sum, 5, 3)
    });
    let all = (1u32 << MAX_SRCS) - 1;
    v.push(Case {
        scale_mask: all,
        factor: 0.61,
        in_place: MAX_DSTS,
        ..case(ElemOp::Sum, MAX_SRCS, MAX_DSTS)
    });
    v.push(Case {
        divide: true,
        in_place: MAX_DSTS,
        ..case(ElemOp::Sum, MAX_SRCS, MAX_DSTS)
    });
    v
}

/// What the Rust reference computes for `case`.
pub fn expected(dtype: DataType, case: &Case, srcs: &[Vec<u8>]) -> Vec<u8> {
    let scaled = |s: usize| {
        let mut b = srcs[s].clone();
        if (case.scale_mask >> s) & 1 == 1 {
            reference::scale(dtype, &mut b, case.factor);
        }
        b
    };
    let mut acc = scaled(0);
    for s in 1..case.nsrc {
        reference::reduce_inplace(dtype, case.op, &mut acc, &scaled(s));
    }
    if case.divide {
        reference::divide(dtype, &mut acc, case.nsrc as u64);
    }
    acc
}

/// Whether one element of `dtype` is a NaN.
pub fn is_nan(dtype: DataType, b: &[u8]) -> bool {
    match dtype {
        DataType::Float16 => f16_is_nan(u16::from_ne_bytes([b[0], b[1]])),
        DataType::Bfloat16 => (u16::from_ne_bytes([b[0], b[1]]) & 0x7fff) > 0x7f80,
        DataType::Float32 => f32::from_ne_bytes(b.try_into().expect("one f32 element")).is_nan(),
        DataType::Float64 => f64::from_ne_bytes(b.try_into().expect("one f64 element")).is_nan(),
        DataType::Float8E4M3 => Fp8E4M3(b[0]).is_nan(),
        DataType::Float8E5M2 => Fp8E5M2(b[0]).is_nan(),
        _ => false,
    }
}

/// Whether `got` is the element `want`: bit for bit, except that a NaN that arithmetic (sum,
/// product, scaling, division) produces may have any sign and payload, as IEEE 754 leaves it
/// to the hardware (x86 keeps an operand's payload, GPUs return the canonical NaN). Max and
/// min choose their NaN operand explicitly and match exactly.
pub fn same_element(dtype: DataType, case: &Case, got: &[u8], want: &[u8]) -> bool {
    let arithmetic =
        matches!(case.op, ElemOp::Sum | ElemOp::Prod) || case.scale_mask != 0 || case.divide;
    got == want || (arithmetic && is_nan(dtype, got) && is_nan(dtype, want))
}

/// Element counts: 0, 1, small primes, vector-boundary neighbours and odd tails.
pub const COUNTS: [usize; 18] = [
    0, 1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 65, 127, 257, 1021, 4099,
];

fn f16_is_nan(h: u16) -> bool {
    (h & 0x7fff) > 0x7c00
}
