//! The documented arithmetic rules, checked through the public API at every supported
//! instruction-set level: special float values, zero signs, NaN propagation, integer wrapping,
//! panics on bad lengths.

use ferroccl_kernels::simd::{self, Isa};
use ferroccl_kernels::{
    as_bytes, as_bytes_mut, reference, DataType, ElemOp, Element, Fp8E4M3, Fp8E5M2,
};
use half::{bf16, f16};

const SPECIALS: [f64; 14] = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    2.5,
    -1e-7,
    3e-41,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    -f64::NAN,
    65504.0,
    448.0,
    1e300,
];

/// All ordered pairs of special values, as two buffers (longer than any vector, so both the
/// vector body and the scalar tail see specials).
fn pairs<T: Element>() -> (Vec<T>, Vec<T>) {
    let mut a = Vec::new();
    let mut b = Vec::new();
    for &x in &SPECIALS {
        for &y in &SPECIALS {
            a.push(T::from_f64(x));
            b.push(T::from_f64(y));
        }
    }
    (a, b)
}

fn check_float_rules<T: Element>() {
    let (a, b) = pairs::<T>();
    for isa in Isa::supported() {
        for op in ElemOp::ALL {
            let mut got = a.clone();
            simd::reduce_inplace_with(isa, T::DTYPE, op, as_bytes_mut(&mut got), as_bytes(&b));
            let mut want = a.clone();
            reference::reduce_inplace(T::DTYPE, op, as_bytes_mut(&mut want), as_bytes(&b));
            for i in 0..a.len() {
                let (x, y, g, w) = (
                    a[i].to_f64(),
                    b[i].to_f64(),
                    got[i].to_f64(),
                    want[i].to_f64(),
                );
                let ctx = format!("{} {} {}: {x:?} op {y:?}", T::DTYPE, op.name(), isa.name());
                if x.is_nan() || y.is_nan() {
                    assert!(
                        g.is_nan() && w.is_nan(),
                        "{ctx}: NaN must propagate, got {g:?}"
                    );
                    continue;
                }
                assert_eq!(
                    as_bytes(&got[i..=i]),
                    as_bytes(&want[i..=i]),
                    "{ctx}: fast {g:?} reference {w:?}"
                );
                match op {
                    ElemOp::Max if x == 0.0 && y == 0.0 => {
                        let plus = x.is_sign_positive() || y.is_sign_positive();
                        assert_eq!(g.is_sign_positive(), plus, "{ctx}: max of zeros");
                    }
                    ElemOp::Min if x == 0.0 && y == 0.0 => {
                        let minus = x.is_sign_negative() || y.is_sign_negative();
                        assert_eq!(g.is_sign_negative(), minus, "{ctx}: min of zeros");
                    }
                    ElemOp::Max => assert_eq!(g, x.max(y), "{ctx}"),
                    ElemOp::Min => assert_eq!(g, x.min(y), "{ctx}"),
                    _ => {}
                }
            }
        }
    }
}

#[test]
fn float_special_values() {
    check_float_rules::<f32>();
    check_float_rules::<f64>();
    check_float_rules::<f16>();
    check_float_rules::<bf16>();
    check_float_rules::<Fp8E4M3>();
    check_float_rules::<Fp8E5M2>();
}

#[test]
fn narrow_float_sums_round_to_nearest_even() {
    for isa in Isa::supported() {
        // f16: 2048 + 1 is halfway between 2048 and 2050 -> 2048 (even); 2050 + 1 -> 2052.
        let mut a: Vec<f16> = [2048.0f32, 2050.0]
            .repeat(20)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let b = vec![f16::ONE; a.len()];
        simd::reduce_inplace_with(
            isa,
            DataType::Float16,
            ElemOp::Sum,
            as_bytes_mut(&mut a),
            as_bytes(&b),
        );
        for pair in a.chunks(2) {
            assert_eq!(
                [pair[0].to_f32(), pair[1].to_f32()],
                [2048.0, 2052.0],
                "{}",
                isa.name()
            );
        }
        // bf16: 256 + 1 halfway -> 256; 258 + 1 -> 260.
        let mut a: Vec<bf16> = [256.0f32, 258.0]
            .repeat(20)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let b = vec![bf16::ONE; a.len()];
        simd::reduce_inplace_with(
            isa,
            DataType::Bfloat16,
            ElemOp::Sum,
            as_bytes_mut(&mut a),
            as_bytes(&b),
        );
        for pair in a.chunks(2) {
            assert_eq!(
                [pair[0].to_f32(), pair[1].to_f32()],
                [256.0, 260.0],
                "{}",
                isa.name()
            );
        }
        // fp8 e4m3 saturates, e5m2 overflows to infinity.
        let mut a = vec![Fp8E4M3::MAX; 33];
        simd::reduce_inplace_with(
            isa,
            DataType::Float8E4M3,
            ElemOp::Sum,
            as_bytes_mut(&mut a),
            as_bytes(&[Fp8E4M3::MAX; 33]),
        );
        assert!(a.iter().all(|v| v.0 == 0x7e));
        let mut a = vec![Fp8E5M2::MAX; 33];
        simd::scale_with(isa, DataType::Float8E5M2, as_bytes_mut(&mut a), 2.0);
        assert!(a.iter().all(|v| v.0 == 0x7c));
    }
}

#[test]
fn integers_wrap_and_truncate() {
    for isa in Isa::supported() {
        let mut a: Vec<i32> = (0..37).map(|i| i32::MAX - i).collect();
        let b: Vec<i32> = (0..37).map(|i| i + 1).collect();
        simd::reduce_inplace_with(
            isa,
            DataType::Int32,
            ElemOp::Sum,
            as_bytes_mut(&mut a),
            as_bytes(&b),
        );
        assert!(a.iter().all(|&v| v == i32::MIN), "{}: {a:?}", isa.name());

        let mut a: Vec<u64> = (0..19).map(|i| u64::MAX - i).collect();
        let b: Vec<u64> = (0..19).map(|i| 2 * i + 7).collect();
        simd::reduce_inplace_with(
            isa,
            DataType::Uint64,
            ElemOp::Sum,
            as_bytes_mut(&mut a),
            as_bytes(&b),
        );
        let want: Vec<u64> = (0..19).map(|i| i + 6).collect();
        assert_eq!(a, want, "{}", isa.name());

        let mut a: Vec<u8> = (0..50).map(|i| i * 5).collect();
        simd::scale_with(isa, DataType::Uint8, &mut a, 3.99);
        let want: Vec<u8> = (0..50u8).map(|i| (i * 5).wrapping_mul(3)).collect();
        assert_eq!(a, want, "{}: factor 3.99 truncates to 3", isa.name());

        let mut a: Vec<i64> = (0..21).map(|i| i * 7 - 70).collect();
        simd::divide_with(isa, DataType::Int64, as_bytes_mut(&mut a), 4);
        let want: Vec<i64> = (0..21).map(|i| (i * 7 - 70) / 4).collect();
        assert_eq!(a, want, "{}: truncation toward zero", isa.name());

        let mut a: Vec<i8> = (0..40).map(|i: i32| (i * 6 - 120) as i8).collect();
        let b: Vec<i8> = (0..40).map(|i: i32| (100 - i * 5) as i8).collect();
        simd::reduce_inplace_with(
            isa,
            DataType::Int8,
            ElemOp::Max,
            as_bytes_mut(&mut a),
            as_bytes(&b),
        );
        let want: Vec<i8> = (0..40)
            .map(|i: i32| (i * 6 - 120).max(100 - i * 5) as i8)
            .collect();
        assert_eq!(a, want, "{}", isa.name());
    }
}

#[test]
fn float_average_and_premul() {
    for isa in Isa::supported() {
        let mut a: Vec<f32> = (0..45).map(|i| i as f32 * 3.0).collect();
        simd::divide_with(isa, DataType::Float32, as_bytes_mut(&mut a), 3);
        let want: Vec<f32> = (0..45).map(|i| i as f32).collect();
        assert_eq!(a, want, "{}", isa.name());

        let src: Vec<f16> = (0..45).map(|i| f16::from_f32(i as f32)).collect();
        let mut dst = vec![f16::ZERO; 45];
        simd::scale_into_with(
            isa,
            DataType::Float16,
            as_bytes_mut(&mut dst),
            as_bytes(&src),
            0.25,
        );
        let want: Vec<f16> = (0..45).map(|i| f16::from_f32(i as f32 / 4.0)).collect();
        assert_eq!(dst, want, "{}", isa.name());
    }
}

#[test]
fn isa_choice_is_supported_and_named() {
    assert!(simd::isa().is_supported());
    assert!(Isa::supported().contains(&Isa::Portable));
    assert_eq!(
        Isa::best_supported(),
        *Isa::supported().last().expect("portable is always there")
    );
    for isa in Isa::ALL {
        assert_eq!(Isa::parse(isa.name()), Some(isa));
    }
    assert_eq!(Isa::parse("AVX2"), Some(Isa::Avx2));
    assert_eq!(Isa::parse("sse9"), None);
}

#[test]
#[should_panic(
    expected = "reduce_inplace: buffer lengths differ: destination has 8 bytes, source has 12 bytes"
)]
fn length_mismatch_panics() {
    ferroccl_kernels::reduce_inplace(DataType::Float32, ElemOp::Sum, &mut [0; 8], &[0; 12]);
}

#[test]
#[should_panic(expected = "reduce: buffer lengths differ")]
fn reduce_length_mismatch_panics() {
    ferroccl_kernels::reduce(
        DataType::Int64,
        ElemOp::Sum,
        &mut [0; 16],
        &[0; 16],
        &[0; 8],
    );
}

#[test]
#[should_panic(
    expected = "scale: buffer length 6 bytes is not a multiple of the f32 element size 4"
)]
fn partial_element_panics() {
    ferroccl_kernels::scale(DataType::Float32, &mut [0; 6], 2.0);
}

#[test]
#[should_panic(expected = "divide: the divisor n must be at least 1")]
fn divide_by_zero_panics() {
    ferroccl_kernels::divide(DataType::Int32, &mut [0; 4], 0);
}

#[test]
fn empty_buffers_are_fine() {
    for dtype in DataType::ALL {
        ferroccl_kernels::reduce_inplace(dtype, ElemOp::Prod, &mut [], &[]);
        ferroccl_kernels::reduce(dtype, ElemOp::Min, &mut [], &[], &[]);
        ferroccl_kernels::scale(dtype, &mut [], 3.0);
        ferroccl_kernels::scale_into(dtype, &mut [], &[], 3.0);
        ferroccl_kernels::divide(dtype, &mut [], 3);
    }
}
