//! fp8 kernels against the scalar reference, exhaustively: every ordered pair of the 256 codes
//! for each binary op, and every code for scaling and dividing by factors that round, tie,
//! overflow and underflow. Bytes must match exactly, at every instruction-set level this CPU
//! has; the one freedom is the documented one: where both operands are NaN, the result is a NaN
//! of either sign.

use ferroccl_kernels::simd::{self, Isa};
use ferroccl_kernels::{reference, DataType, ElemOp, Fp8E4M3, Fp8E5M2};

const FP8: [DataType; 2] = [DataType::Float8E4M3, DataType::Float8E5M2];
const OPS: [ElemOp; 4] = [ElemOp::Sum, ElemOp::Prod, ElemOp::Max, ElemOp::Min];

/// Every ordered pair of codes, with one extra element so a scalar tail runs after the vectors.
fn all_pairs() -> (Vec<u8>, Vec<u8>) {
    let n = 256 * 256 + 1;
    let a = (0..n).map(|i| i as u8).collect();
    let b = (0..n).map(|i| (i >> 8) as u8).collect();
    (a, b)
}

fn is_nan(dtype: DataType, code: u8) -> bool {
    match dtype {
        DataType::Float8E4M3 => Fp8E4M3(code).is_nan(),
        _ => Fp8E5M2(code).is_nan(),
    }
}

fn first_difference(
    dtype: DataType,
    got: &[u8],
    want: &[u8],
    a: &[u8],
    b: Option<&[u8]>,
) -> Option<String> {
    let nan = |c| is_nan(dtype, c);
    let i = (0..got.len()).find(|&i| {
        let both_nan = nan(a[i]) && b.is_some_and(|b| nan(b[i]));
        got[i] != want[i] && !(both_nan && nan(got[i]) && nan(want[i]))
    })?;
    Some(format!(
        "element {i}: a = {:#04x}, b = {}: got {:#04x}, want {:#04x}",
        a[i],
        b.map_or("-".to_string(), |b| format!("{:#04x}", b[i])),
        got[i],
        want[i]
    ))
}

#[test]
fn every_pair_of_codes_matches_the_reference() {
    let (a, b) = all_pairs();
    for isa in Isa::supported() {
        for dtype in FP8 {
            for op in OPS {
                let mut want = vec![0; a.len()];
                reference::reduce(dtype, op, &mut want, &a, &b);
                let mut got = vec![0; a.len()];
                simd::reduce_with(isa, dtype, op, &mut got, &a, &b);
                if let Some(d) = first_difference(dtype, &got, &want, &a, Some(&b)) {
                    panic!("{} {dtype:?} {op:?} out of place: {d}", isa.name());
                }
                let mut inplace = a.clone();
                simd::reduce_inplace_with(isa, dtype, op, &mut inplace, &b);
                if let Some(d) = first_difference(dtype, &inplace, &want, &a, Some(&b)) {
                    panic!("{} {dtype:?} {op:?} in place: {d}", isa.name());
                }
            }
        }
    }
}

#[test]
fn every_code_scales_and_divides_as_the_reference() {
    // Every code, repeated so that each lands in the vector body at several offsets.
    let src: Vec<u8> = (0..256 * 3 + 5).map(|i| i as u8).collect();
    let factors = [
        0.5,
        0.25,
        1.0 / 3.0,
        0.1,
        1.5,
        3.0,
        7.0,
        300.0,
        1e-3,
        1e-6,
        -2.0,
        65536.0,
    ];
    for isa in Isa::supported() {
        for dtype in FP8 {
            for f in factors {
                let mut want = src.clone();
                reference::scale(dtype, &mut want, f);
                let mut got = src.clone();
                simd::scale_with(isa, dtype, &mut got, f);
                if let Some(d) = first_difference(dtype, &got, &want, &src, None) {
                    panic!("{} {dtype:?} scale by {f}: {d}", isa.name());
                }
                let mut into = vec![0; src.len()];
                simd::scale_into_with(isa, dtype, &mut into, &src, f);
                if let Some(d) = first_difference(dtype, &into, &want, &src, None) {
                    panic!("{} {dtype:?} scale_into by {f}: {d}", isa.name());
                }
            }
            for n in [1, 2, 3, 7, 8, 1000, 1 << 20] {
                let mut want = src.clone();
                reference::divide(dtype, &mut want, n);
                let mut got = src.clone();
                simd::divide_with(isa, dtype, &mut got, n);
                if let Some(d) = first_difference(dtype, &got, &want, &src, None) {
                    panic!("{} {dtype:?} divide by {n}: {d}", isa.name());
                }
            }
        }
    }
}
