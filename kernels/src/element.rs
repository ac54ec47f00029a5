//! The [`Element`] trait (a Rust type behind each [`DataType`]) and the per-element arithmetic that
//! both the [reference](crate::reference) and the SIMD kernels follow.

use half::{bf16, f16};

use crate::fp8::{Fp8E4M3, Fp8E5M2};
use crate::types::DataType;

/// A Rust type that holds one element of a [`DataType`].
///
/// # Safety
///
/// Implementors must be plain old data: `size_of::<Self>() == Self::DTYPE.size()`, alignment at most
/// the size, no padding bytes, no interior pointers or drop glue, and every bit pattern of that size
/// must be a valid value. [`as_bytes`] and [`as_bytes_mut`] rely on this to view a `&[Self]` as bytes
/// and to let arbitrary bytes be written through the view.
pub unsafe trait Element:
    Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static
{
    /// The data type this Rust type represents.
    const DTYPE: DataType;

    /// The value as `f64` (exact for every type except `i64`/`u64` beyond 2^53).
    fn to_f64(self) -> f64;

    /// The nearest value of this type: integers truncate toward zero and saturate (NaN gives 0),
    /// floats round to nearest even (fp8 e4m3 saturates to ±448, see [`Fp8E4M3`]).
    fn from_f64(v: f64) -> Self;
}

/// Views a slice of elements as its bytes (native byte order).
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: `Element` guarantees `T` is plain old data without padding, so every byte of the
    // slice is initialised; the byte length is exactly the slice's size in memory and u8 has
    // alignment 1. The lifetime is tied to `s`.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// Views a mutable slice of elements as its bytes (native byte order).
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    let len = std::mem::size_of_val(s);
    // SAFETY: as in `as_bytes`; in addition `Element` guarantees every bit pattern is a valid `T`,
    // so any bytes written through the view leave valid elements behind. The mutable borrow of
    // `s` is held for the lifetime of the result, so there is no aliasing.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), len) }
}

/// Views bytes as elements: `None` unless `bytes` starts at an address aligned for `T` and
/// holds a whole number of elements.
pub fn from_bytes_mut<T: Element>(bytes: &mut [u8]) -> Option<&mut [T]> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size)
        || bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0
    {
        return None;
    }
    // SAFETY: aligned for `T` and a whole number of `T`s long (checked above); `Element`
    // guarantees every bit pattern is a valid `T`; the mutable borrow of `bytes` is held for
    // the lifetime of the result.
    Some(unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / size)
    })
}

/// Views bytes as elements (see [`from_bytes_mut`]).
pub fn from_bytes<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size)
        || bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0
    {
        return None;
    }
    // SAFETY: aligned for `T` and a whole number of `T`s long (checked above); `Element`
    // guarantees every bit pattern is a valid `T`.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}

/// Reads one element from the start of `bytes` (any alignment).
///
/// # Panics
/// If `bytes` is shorter than one element.
#[inline(always)]
pub(crate) fn load<T: Element>(bytes: &[u8]) -> T {
    assert!(
        bytes.len() >= std::mem::size_of::<T>(),
        "load: short element"
    );
    // SAFETY: at least size_of::<T>() readable bytes (checked above); `read_unaligned` allows
    // any alignment; `Element` guarantees every bit pattern is a valid `T`.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// Writes one element to the start of `bytes` (any alignment).
///
/// # Panics
/// If `bytes` is shorter than one element.
#[inline(always)]
pub(crate) fn store<T: Element>(bytes: &mut [u8], v: T) {
    assert!(
        bytes.len() >= std::mem::size_of::<T>(),
        "store: short element"
    );
    // SAFETY: at least size_of::<T>() writable bytes (checked above); `write_unaligned` allows
    // any alignment; `T` is plain old data, so no drop is skipped.
    unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast::<T>(), v) }
}

/// The arithmetic of one element type: what every kernel computes per element.
///
/// Integers wrap (sum, prod); float max/min follow IEEE 754-2019 `maximum`/`minimum`: a NaN
/// operand is returned as the result (the first one if both are NaN), and `-0 < +0`. 16- and
/// 8-bit floats are converted to `f32`, combined, and rounded back per element.
pub(crate) trait Arith: Element {
    /// The scale factor in the type the multiplication happens in.
    type Factor: Copy;
    /// The divisor in the type the division happens in.
    type Divisor: Copy;

    fn elem_sum(a: Self, b: Self) -> Self;
    fn elem_prod(a: Self, b: Self) -> Self;
    fn elem_max(a: Self, b: Self) -> Self;
    fn elem_min(a: Self, b: Self) -> Self;
    /// Converts the public `f64` factor once per call.
    fn factor(f: f64) -> Self::Factor;
    fn elem_mul(a: Self, f: Self::Factor) -> Self;
    /// Converts the public element count once per call; `n > 0`.
    fn divisor(n: u64) -> Self::Divisor;
    fn elem_div(a: Self, d: Self::Divisor) -> Self;
}

/// IEEE 754-2019 `maximum` on `f32`: NaN-propagating, `-0 < +0`.
#[inline(always)]
pub(crate) fn max_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a == b {
        // Equal values differ at most in the sign of zero: +0 wins.
        f32::from_bits(a.to_bits() & b.to_bits())
    } else if a > b {
        a
    } else {
        b
    }
}

/// IEEE 754-2019 `minimum` on `f32`: NaN-propagating, `-0 < +0`.
#[inline(always)]
pub(crate) fn min_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a == b {
        // Equal values differ at most in the sign of zero: -0 wins.
        f32::from_bits(a.to_bits() | b.to_bits())
    } else if a < b {
        a
    } else {
        b
    }
}

/// IEEE 754-2019 `maximum` on `f64`.
#[inline(always)]
pub(crate) fn max_f64(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a == b {
        f64::from_bits(a.to_bits() & b.to_bits())
    } else if a > b {
        a
    } else {
        b
    }
}

/// IEEE 754-2019 `minimum` on `f64`.
#[inline(always)]
pub(crate) fn min_f64(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        a
    } else if b.is_nan() {
        b
    } else if a == b {
        f64::from_bits(a.to_bits() | b.to_bits())
    } else if a < b {
        a
    } else {
        b
    }
}

macro_rules! int_element {
    ($t:ty, $dt:ident, $div:expr) => {
        // SAFETY: a primitive integer: no padding, any bit pattern valid, size matches DTYPE.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$dt;
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }

        impl Arith for $t {
            type Factor = $t;
            type Divisor = u64;
            #[inline(always)]
            fn elem_sum(a: Self, b: Self) -> Self {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn elem_prod(a: Self, b: Self) -> Self {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn elem_max(a: Self, b: Self) -> Self {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn elem_min(a: Self, b: Self) -> Self {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn factor(f: f64) -> $t {
                // Round toward zero to an integer, then wrap into the element type.
                (f as i64) as $t
            }
            #[inline(always)]
            fn elem_mul(a: Self, f: $t) -> Self {
                a.wrapping_mul(f)
            }
            #[inline(always)]
            fn divisor(n: u64) -> u64 {
                n
            }
            #[inline(always)]
            fn elem_div(a: Self, n: u64) -> Self {
                ($div)(a, n)
            }
        }
    };
}

/// Signed division for types narrower than 64 bits: the quotient in i64 truncates toward zero
/// and is exact; a divisor beyond i64 gives 0 since |a| < 2^32 < n.
#[inline(always)]
fn div_narrow_signed(a: i64, n: u64) -> i64 {
    match i64::try_from(n) {
        Ok(n) => a / n,
        Err(_) => 0,
    }
}

/// `i64` division truncating toward zero for any `n > 0`.
#[inline(always)]
fn div_i64(a: i64, n: u64) -> i64 {
    match i64::try_from(n) {
        Ok(n) => a / n,
        // n >= 2^63: only i64::MIN / 2^63 is non-zero; the quotient fits.
        Err(_) => (i128::from(a) / i128::from(n)) as i64,
    }
}

// Narrowing casts below are exact: a quotient's magnitude never exceeds the dividend's.
int_element!(i8, Int8, |a: i8, n| div_narrow_signed(a.into(), n) as i8);
int_element!(u8, Uint8, |a: u8, n| (u64::from(a) / n) as u8);
int_element!(i32, Int32, |a: i32, n| div_narrow_signed(a.into(), n)
    as i32);
int_element!(u32, Uint32, |a: u32, n| (u64::from(a) / n) as u32);
int_element!(i64, Int64, div_i64);
int_element!(u64, Uint64, |a: u64, n| a / n);

// SAFETY: IEEE binary32: 4 bytes, no padding, any bit pattern is a valid f32.
unsafe impl Element for f32 {
    const DTYPE: DataType = DataType::Float32;
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    #[inline]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Arith for f32 {
    type Factor = f32;
    type Divisor = f32;
    #[inline(always)]
    fn elem_sum(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn elem_prod(a: Self, b: Self) -> Self {
        a * b
    }
    #[inline(always)]
    fn elem_max(a: Self, b: Self) -> Self {
        max_f32(a, b)
    }
    #[inline(always)]
    fn elem_min(a: Self, b: Self) -> Self {
        min_f32(a, b)
    }
    #[inline(always)]
    fn factor(f: f64) -> f32 {
        f as f32
    }
    #[inline(always)]
    fn elem_mul(a: Self, f: f32) -> Self {
        a * f
    }
    #[inline(always)]
    fn divisor(n: u64) -> f32 {
        n as f32
    }
    #[inline(always)]
    fn elem_div(a: Self, d: f32) -> Self {
        a / d
    }
}

// SAFETY: IEEE binary64: 8 bytes, no padding, any bit pattern is a valid f64.
unsafe impl Element for f64 {
    const DTYPE: DataType = DataType::Float64;
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline]
    fn from_f64(v: f64) -> Self {
        v
    }
}

impl Arith for f64 {
    type Factor = f64;
    type Divisor = f64;
    #[inline(always)]
    fn elem_sum(a: Self, b: Self) -> Self {
        a + b
    }
    #[inline(always)]
    fn elem_prod(a: Self, b: Self) -> Self {
        a * b
    }
    #[inline(always)]
    fn elem_max(a: Self, b: Self) -> Self {
        max_f64(a, b)
    }
    #[inline(always)]
    fn elem_min(a: Self, b: Self) -> Self {
        min_f64(a, b)
    }
    #[inline(always)]
    fn factor(f: f64) -> f64 {
        f
    }
    #[inline(always)]
    fn elem_mul(a: Self, f: f64) -> Self {
        a * f
    }
    #[inline(always)]
    fn divisor(n: u64) -> f64 {
        n as f64
    }
    #[inline(always)]
    fn elem_div(a: Self, d: f64) -> Self {
        a / d
    }
}

/// Narrow floats: every op converts to f32, computes, and rounds back (nearest even).
macro_rules! via_f32_element {
    ($t:ty, $dt:ident, $to:expr, $from:expr, $from64:expr) => {
        impl Arith for $t {
            type Factor = f32;
            type Divisor = f32;
            #[inline(always)]
            fn elem_sum(a: Self, b: Self) -> Self {
                $from($to(a) + $to(b))
            }
            #[inline(always)]
            fn elem_prod(a: Self, b: Self) -> Self {
                $from($to(a) * $to(b))
            }
            #[inline(always)]
            fn elem_max(a: Self, b: Self) -> Self {
                $from(max_f32($to(a), $to(b)))
            }
            #[inline(always)]
            fn elem_min(a: Self, b: Self) -> Self {
                $from(min_f32($to(a), $to(b)))
            }
            #[inline(always)]
            fn factor(f: f64) -> f32 {
                f as f32
            }
            #[inline(always)]
            fn elem_mul(a: Self, f: f32) -> Self {
                $from($to(a) * f)
            }
            #[inline(always)]
            fn divisor(n: u64) -> f32 {
                n as f32
            }
            #[inline(always)]
            fn elem_div(a: Self, d: f32) -> Self {
                $from($to(a) / d)
            }
        }

        // SAFETY: a `repr(transparent)` wrapper of u16 / u8 (half's types and the fp8 newtypes):
        // no padding, any bit pattern is a valid value, size matches DTYPE.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$dt;
            #[inline]
            fn to_f64(self) -> f64 {
                f64::from($to(self))
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                $from64(v)
            }
        }
    };
}

via_f32_element!(f16, Float16, f16::to_f32, f16::from_f32, f16::from_f64);
via_f32_element!(bf16, Bfloat16, bf16::to_f32, bf16::from_f32, bf16::from_f64);
via_f32_element!(
    Fp8E4M3,
    Float8E4M3,
    Fp8E4M3::to_f32,
    Fp8E4M3::from_f32,
    Fp8E4M3::from_f64
);
via_f32_element!(
    Fp8E5M2,
    Float8E5M2,
    Fp8E5M2::to_f32,
    Fp8E5M2::from_f32,
    Fp8E5M2::from_f64
);

/// Evaluates `$body` with the type alias `$t` bound to the Rust type of `$dtype` (a
/// [`DataType`](crate::DataType)): one dispatch from a run-time data type to the generic code
/// of every element type. The calling crate needs `half` (the f16 and bf16 types).
#[macro_export]
macro_rules! with_element {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::DataType::Int8 => {
                type $t = i8;
                $body
            }
            $crate::DataType::Uint8 => {
                type $t = u8;
                $body
            }
            $crate::DataType::Int32 => {
                type $t = i32;
                $body
            }
            $crate::DataType::Uint32 => {
                type $t = u32;
                $body
            }
            $crate::DataType::Int64 => {
                type $t = i64;
                $body
            }
            $crate::DataType::Uint64 => {
                type $t = u64;
                $body
            }
            $crate::DataType::Float16 => {
                type $t = ::half::f16;
                $body
            }
            $crate::DataType::Float32 => {
                type $t = f32;
                $body
            }
            $crate::DataType::Float64 => {
                type $t = f64;
                $body
            }
            $crate::DataType::Bfloat16 => {
                type $t = ::half::bf16;
                $body
            }
            $crate::DataType::Float8E4M3 => {
                type $t = $crate::Fp8E4M3;
                $body
            }
            $crate::DataType::Float8E5M2 => {
                type $t = $crate::Fp8E5M2;
                $body
            }
        }
    };
}
pub(crate) use crate::with_element;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_dtype() {
        fn check<T: Element>() {
            assert_eq!(std::mem::size_of::<T>(), T::DTYPE.size(), "{}", T::DTYPE);
            assert!(std::mem::align_of::<T>() <= T::DTYPE.size());
        }
        check::<i8>();
        check::<u8>();
        check::<i32>();
        check::<u32>();
        check::<i64>();
        check::<u64>();
        check::<f16>();
        check::<bf16>();
        check::<f32>();
        check::<f64>();
        check::<Fp8E4M3>();
        check::<Fp8E5M2>();
    }

    #[test]
    fn bytes_views_round_trip() {
        let mut v = [1.5f32, -2.0, 3.25];
        assert_eq!(as_bytes(&v)[..4], 1.5f32.to_ne_bytes());
        as_bytes_mut(&mut v)[4..8].copy_from_slice(&7.0f32.to_ne_bytes());
        assert_eq!(v, [1.5, 7.0, 3.25]);
        assert_eq!(as_bytes::<u64>(&[]).len(), 0);
    }

    #[test]
    fn integer_ops_wrap() {
        assert_eq!(<i8 as Arith>::elem_sum(127, 1), -128);
        assert_eq!(<u8 as Arith>::elem_prod(16, 17), 16);
        assert_eq!(<i32 as Arith>::elem_sum(i32::MAX, 2), i32::MIN + 1);
        assert_eq!(<u64 as Arith>::elem_prod(u64::MAX, 3), u64::MAX - 2);
        assert_eq!(<i64 as Arith>::elem_max(-5, 3), 3);
        assert_eq!(<u32 as Arith>::elem_min(7, 3), 3);
    }

    #[test]
    fn integer_scale_truncates_factor() {
        assert_eq!(<i32 as Arith>::factor(2.9), 2);
        assert_eq!(<i32 as Arith>::factor(-2.9), -2);
        assert_eq!(
            <i32 as Arith>::elem_mul(-7, <i32 as Arith>::factor(-2.9)),
            14
        );
        // -1 wraps to the all-ones pattern for unsigned types: multiplication negates mod 2^n.
        assert_eq!(<u8 as Arith>::elem_mul(3, <u8 as Arith>::factor(-1.0)), 253);
        assert_eq!(<u32 as Arith>::elem_mul(5, <u32 as Arith>::factor(0.5)), 0);
    }

    #[test]
    fn integer_divide_truncates_toward_zero() {
        assert_eq!(<i32 as Arith>::elem_div(-7, 2), -3);
        assert_eq!(<i32 as Arith>::elem_div(7, 2), 3);
        assert_eq!(<i8 as Arith>::elem_div(-128, 3), -42);
        assert_eq!(<u8 as Arith>::elem_div(255, 2), 127);
        assert_eq!(<i32 as Arith>::elem_div(i32::MIN, 1 << 31), -1);
        assert_eq!(<i32 as Arith>::elem_div(i32::MIN, u64::MAX), 0);
        assert_eq!(<i64 as Arith>::elem_div(i64::MIN, 1 << 63), -1);
        assert_eq!(<i64 as Arith>::elem_div(i64::MAX, 1 << 63), 0);
        assert_eq!(<i64 as Arith>::elem_div(-9, 4), -2);
        assert_eq!(<u64 as Arith>::elem_div(u64::MAX, u64::MAX), 1);
    }

    #[test]
    fn float_max_min_propagate_nan_and_order_zeros() {
        let nan = f32::from_bits(0x7fc0_1234);
        assert_eq!(max_f32(nan, 1.0).to_bits(), nan.to_bits());
        assert_eq!(max_f32(1.0, nan).to_bits(), nan.to_bits());
        assert_eq!(min_f32(-1.0, nan).to_bits(), nan.to_bits());
        assert_eq!(max_f32(-0.0, 0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(max_f32(0.0, -0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(min_f32(0.0, -0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(min_f32(-0.0, 0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(max_f32(-3.0, 2.0), 2.0);
        assert_eq!(min_f32(-3.0, 2.0), -3.0);
        assert!(max_f64(f64::NAN, f64::INFINITY).is_nan());
        assert!(min_f64(f64::NEG_INFINITY, f64::NAN).is_nan());
        assert_eq!(max_f64(-0.0, 0.0).to_bits(), 0.0f64.to_bits());
        assert_eq!(min_f64(0.0, -0.0).to_bits(), (-0.0f64).to_bits());
        assert!(<f16 as Arith>::elem_max(f16::NAN, f16::ONE).is_nan());
        assert!(<bf16 as Arith>::elem_min(bf16::ONE, bf16::NAN).is_nan());
        assert!(<Fp8E4M3 as Arith>::elem_max(Fp8E4M3::NAN, Fp8E4M3::ONE).is_nan());
    }

    #[test]
    fn narrow_floats_round_through_f32() {
        // 1 + 2^-11 is halfway between two f16 values: ties to even gives 1.
        let tiny = f16::from_bits(0x1000); // 2^-11
        assert_eq!(<f16 as Arith>::elem_sum(f16::ONE, tiny), f16::ONE);
        assert_eq!(
            <bf16 as Arith>::elem_sum(bf16::from_f32(256.0), bf16::ONE).to_f32(),
            256.0
        );
        assert_eq!(
            <Fp8E4M3 as Arith>::elem_sum(Fp8E4M3::MAX, Fp8E4M3::MAX),
            Fp8E4M3::MAX
        );
        assert_eq!(
            <Fp8E5M2 as Arith>::elem_prod(Fp8E5M2::MAX, Fp8E5M2::from_f32(2.0)),
            Fp8E5M2::INFINITY
        );
        assert_eq!(
            <f16 as Arith>::elem_div(f16::from_f32(3.0), 2.0).to_f32(),
            1.5
        );
    }
}
