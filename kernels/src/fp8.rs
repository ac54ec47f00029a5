//! 8-bit floats: [`Fp8E4M3`] (OCP "E4M3FN") and [`Fp8E5M2`] (OCP E5M2, IEEE-like).
//!
//! Conversions from `f32`/`f64` round to nearest, ties to even. They differ on overflow:
//! e4m3 has no infinity and **saturates** to ±448 (as CUDA's `__nv_cvt_float_to_fp8` with
//! `__NV_SATFINITE`, which NCCL uses); e5m2 rounds to ±infinity as IEEE formats do.
//! A NaN converts to the canonical NaN code of the target with the input's sign.

use std::fmt;

/// How one fp8 format is laid out (1 sign bit, `EXP` exponent bits, `MANT` mantissa bits).
struct Format {
    mant_bits: u32,
    bias: i32,
    /// Largest finite magnitude code.
    max_finite: u8,
    /// Magnitude code an overflowing value becomes.
    overflow: u8,
    /// Canonical NaN magnitude code.
    nan: u8,
    /// Whether magnitude codes with an all-ones exponent are inf/NaN (IEEE-like).
    ieee_special: bool,
}

const E4M3: Format = Format {
    mant_bits: 3,
    bias: 7,
    max_finite: 0x7e,
    overflow: 0x7e,
    nan: 0x7f,
    ieee_special: false,
};

const E5M2: Format = Format {
    mant_bits: 2,
    bias: 15,
    max_finite: 0x7b,
    overflow: 0x7c,
    nan: 0x7e,
    ieee_special: true,
};

impl Format {
    /// Rounds `x` to the nearest code (ties to even), applying the format's overflow rule.
    fn encode(&self, x: f64) -> u8 {
        let bits = x.to_bits();
        let sign = ((bits >> 63) as u8) << 7;
        let abs = bits & !(1u64 << 63);
        if abs > 0x7ff0_0000_0000_0000 {
            return sign | self.nan;
        }
        let m = self.mant_bits;
        // Biased f64 exponent of the format's smallest normal, 2^(1 - bias).
        let min_normal_exp = (1023 + 1 - self.bias) as u64;
        let code = if (abs >> 52) >= min_normal_exp {
            // Round the f64 pattern to `m` mantissa bits, ties to even; a carry moves into the
            // exponent field, which is what rounding up to the next binade means.
            let shift = 52 - m;
            let rounded = abs + ((1u64 << (shift - 1)) - 1) + ((abs >> shift) & 1);
            let rebias = ((1023 - self.bias) as u64) << m;
            let code = (rounded >> shift) - rebias;
            if code > u64::from(self.max_finite) {
                self.overflow
            } else {
                code as u8
            }
        } else {
            // Subnormal range: count quanta of 2^(1 - bias - m). Scaling by a power of two is
            // exact, so only the integer rounding rounds. 2^m quanta is the smallest normal,
            // whose code is exactly 2^m.
            let quanta = f64::from_bits(abs)
                * f64::from_bits(((1023 + self.bias - 1 + m as i32) as u64) << 52);
            quanta.round_ties_even() as u8
        };
        sign | code
    }

    /// The exact value of a code as `f32`.
    fn decode(&self, code: u8) -> f32 {
        let sign = u32::from(code >> 7) << 31;
        let mag = code & 0x7f;
        let m = self.mant_bits;
        let exp = i32::from(mag >> m);
        let mant = u32::from(mag) & ((1 << m) - 1);
        let all_ones = (1i32 << (7 - m)) - 1;
        if self.ieee_special && exp == all_ones {
            let bits = if mant == 0 { 0x7f80_0000 } else { 0x7fc0_0000 };
            return f32::from_bits(sign | bits);
        }
        if !self.ieee_special && mag == self.nan {
            return f32::from_bits(sign | 0x7fc0_0000);
        }
        let magnitude = if exp == 0 {
            // mant * 2^(1 - bias - m), exact in f32.
            let quantum = f32::from_bits(((127 + 1 - self.bias - m as i32) as u32) << 23);
            mant as f32 * quantum
        } else {
            f32::from_bits((((exp - self.bias + 127) as u32) << 23) | (mant << (23 - m)))
        };
        f32::from_bits(sign | magnitude.to_bits())
    }
}

macro_rules! fp8_type {
    ($(#[$doc:meta])* $name:ident, $fmt:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default)]
        #[repr(transparent)]
        pub struct $name(pub u8);

        impl $name {
            /// Zero.
            pub const ZERO: $name = $name(0);
            /// One.
            pub const ONE: $name = $name(($fmt.bias as u8) << $fmt.mant_bits);
            /// The largest finite value.
            pub const MAX: $name = $name($fmt.max_finite);
            /// The most negative finite value.
            pub const MIN: $name = $name(0x80 | $fmt.max_finite);
            /// The smallest positive normal value, 2^(1 - bias).
            pub const MIN_POSITIVE: $name = $name(1 << $fmt.mant_bits);
            /// The smallest positive subnormal value.
            pub const MIN_POSITIVE_SUBNORMAL: $name = $name(1);
            /// The canonical (positive) NaN.
            pub const NAN: $name = $name($fmt.nan);

            /// The element with this bit pattern.
            pub const fn from_bits(bits: u8) -> Self {
                $name(bits)
            }

            /// The bit pattern.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// Rounds an `f32` to the nearest value (ties to even); see the module docs for
            /// overflow and NaN.
            pub fn from_f32(v: f32) -> Self {
                $name($fmt.encode(f64::from(v)))
            }

            /// Rounds an `f64` to the nearest value directly (no double rounding through f32).
            pub fn from_f64(v: f64) -> Self {
                $name($fmt.encode(v))
            }

            /// The exact value as `f32` (NaN codes give a quiet f32 NaN with the same sign).
            pub fn to_f32(self) -> f32 {
                $fmt.decode(self.0)
            }

            /// Whether this is a NaN code.
            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }

        /// IEEE comparison: NaN is unequal to everything, `+0 == -0`.
        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.to_f32() == other.to_f32()
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                self.to_f32().partial_cmp(&other.to_f32())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:#04x} = {:?})", stringify!($name), self.0, self.to_f32())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }

        impl From<$name> for f32 {
            fn from(v: $name) -> f32 {
                v.to_f32()
            }
        }
    };
}

fp8_type!(
    /// fp8 e4m3, OCP "E4M3FN": bias 7, 3 mantissa bits, no infinities, `0x7f`/`0xff` are NaN,
    /// largest finite value 448, smallest normal 2^-6, smallest subnormal 2^-9.
    ///
    /// Conversion from a wider float rounds to nearest even and **saturates**: values beyond
    /// ±448, including ±infinity, become ±448 (NCCL / CUDA `__NV_SATFINITE` behaviour).
    Fp8E4M3,
    E4M3
);

fp8_type!(
    /// fp8 e5m2: bias 15, 2 mantissa bits, IEEE-like infinities (`0x7c`) and NaNs (`0x7d..=0x7f`),
    /// largest finite value 57344, smallest normal 2^-14, smallest subnormal 2^-16.
    ///
    /// Conversion from a wider float rounds to nearest even; overflow rounds to ±infinity.
    Fp8E5M2,
    E5M2
);

impl Fp8E5M2 {
    /// Positive infinity.
    pub const INFINITY: Fp8E5M2 = Fp8E5M2(0x7c);
    /// Negative infinity.
    pub const NEG_INFINITY: Fp8E5M2 = Fp8E5M2(0xfc);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for code in 0..=255u8 {
            let a = Fp8E4M3(code);
            if a.is_nan() {
                assert_eq!(code & 0x7f, 0x7f, "e4m3 NaN codes are only 0x7f/0xff");
                assert_eq!(Fp8E4M3::from_f32(a.to_f32()).0, code);
            } else {
                assert_eq!(Fp8E4M3::from_f32(a.to_f32()).0, code, "e4m3 {code:#04x}");
                assert_eq!(Fp8E4M3::from_f64(f64::from(a.to_f32())).0, code);
            }
            let b = Fp8E5M2(code);
            if b.is_nan() {
                assert!(matches!(code & 0x7f, 0x7d..=0x7f), "{code:#04x}");
                // NaN payloads are not kept: the canonical quiet NaN with the same sign.
                assert_eq!(Fp8E5M2::from_f32(b.to_f32()).0, (code & 0x80) | 0x7e);
            } else {
                assert_eq!(Fp8E5M2::from_f32(b.to_f32()).0, code, "e5m2 {code:#04x}");
                assert_eq!(Fp8E5M2::from_f64(f64::from(b.to_f32())).0, code);
            }
        }
    }

    #[test]
    fn decoded_values_are_monotonic() {
        let mut prev = f32::NEG_INFINITY;
        for code in 0..0x7f {
            let v = Fp8E4M3(code).to_f32();
            assert!(
                v > prev || (code == 0 && v == 0.0),
                "{code:#04x}: {v} after {prev}"
            );
            prev = v;
        }
        prev = f32::NEG_INFINITY;
        for code in 0..=0x7c {
            let v = Fp8E5M2(code).to_f32();
            assert!(v > prev, "{code:#04x}: {v} after {prev}");
            prev = v;
        }
    }

    #[test]
    fn e4m3_known_values() {
        assert_eq!(Fp8E4M3::MAX.to_f32(), 448.0);
        assert_eq!(Fp8E4M3::MIN.to_f32(), -448.0);
        assert_eq!(Fp8E4M3(0x08).to_f32(), 2f32.powi(-6));
        assert_eq!(Fp8E4M3::MIN_POSITIVE.to_f32(), 2f32.powi(-6));
        assert_eq!(Fp8E4M3(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(Fp8E4M3(0x07).to_f32(), 7.0 * 2f32.powi(-9));
        assert_eq!(Fp8E4M3::ONE.to_f32(), 1.0);
        assert_eq!(Fp8E4M3(0x38).to_f32(), 1.0);
        assert_eq!(Fp8E4M3(0xb8).to_f32(), -1.0);
        assert_eq!(Fp8E4M3(0x80).to_f32().to_bits(), (-0.0f32).to_bits());
        assert!(Fp8E4M3(0x7f).to_f32().is_nan());
        assert!(Fp8E4M3(0xff).to_f32().is_nan());
        assert_eq!(Fp8E4M3(0x77).to_f32(), 240.0);
        assert_eq!(Fp8E4M3::from_f32(1.125).0, 0x39);
    }

    #[test]
    fn e5m2_known_values() {
        assert_eq!(Fp8E5M2::MAX.to_f32(), 57344.0);
        assert_eq!(Fp8E5M2::ONE.to_f32(), 1.0);
        assert_eq!(Fp8E5M2(0x3c).to_f32(), 1.0);
        assert_eq!(Fp8E5M2::MIN_POSITIVE.to_f32(), 2f32.powi(-14));
        assert_eq!(Fp8E5M2(0x01).to_f32(), 2f32.powi(-16));
        assert_eq!(Fp8E5M2::INFINITY.to_f32(), f32::INFINITY);
        assert_eq!(Fp8E5M2::NEG_INFINITY.to_f32(), f32::NEG_INFINITY);
        assert!(Fp8E5M2(0x7d).is_nan() && Fp8E5M2(0xfe).is_nan());
    }

    #[test]
    fn halfway_cases_round_to_even() {
        // e4m3 near 1: step 1/8. 1 + 1/16 is halfway between 1 (even) and 1.125 (odd).
        assert_eq!(Fp8E4M3::from_f32(1.0625).to_f32(), 1.0);
        // 1.125 + 1/16 is halfway between 1.125 (odd) and 1.25 (even).
        assert_eq!(Fp8E4M3::from_f32(1.1875).to_f32(), 1.25);
        // Just above halfway rounds up.
        assert_eq!(Fp8E4M3::from_f32(1.0625 + 1e-6).to_f32(), 1.125);
        assert_eq!(Fp8E4M3::from_f64(1.0625 + 1e-12).to_f32(), 1.125);
        // Subnormals: quantum 2^-9; 1.5 quanta -> 2 (even), 2.5 quanta -> 2 (even).
        let q = 2f32.powi(-9);
        assert_eq!(Fp8E4M3::from_f32(1.5 * q).0, 0x02);
        assert_eq!(Fp8E4M3::from_f32(2.5 * q).0, 0x02);
        assert_eq!(Fp8E4M3::from_f32(0.5 * q).0, 0x00);
        assert_eq!(Fp8E4M3::from_f32(-0.5 * q).0, 0x80);
        assert_eq!(Fp8E4M3::from_f32(0.5001 * q).0, 0x01);
        // 7.5 quanta rounds up into the smallest normal.
        assert_eq!(Fp8E4M3::from_f32(7.5 * q).0, 0x08);
        // e5m2 near 1: step 1/4. 1.125 halfway -> 1.0, 1.375 halfway -> 1.5.
        assert_eq!(Fp8E5M2::from_f32(1.125).to_f32(), 1.0);
        assert_eq!(Fp8E5M2::from_f32(1.375).to_f32(), 1.5);
        assert_eq!(Fp8E5M2::from_f32(-1.375).to_f32(), -1.5);
        let q = 2f32.powi(-16);
        assert_eq!(Fp8E5M2::from_f32(0.5 * q).0, 0x00);
        assert_eq!(Fp8E5M2::from_f32(1.5 * q).0, 0x02);
        assert_eq!(Fp8E5M2::from_f32(3.5 * q).0, 0x04);
    }

    #[test]
    fn e4m3_saturates() {
        assert_eq!(Fp8E4M3::from_f32(449.0), Fp8E4M3::MAX);
        assert_eq!(Fp8E4M3::from_f32(464.0), Fp8E4M3::MAX); // halfway to the missing 480
        assert_eq!(Fp8E4M3::from_f32(500.0), Fp8E4M3::MAX);
        assert_eq!(Fp8E4M3::from_f32(1e30), Fp8E4M3::MAX);
        assert_eq!(Fp8E4M3::from_f32(f32::INFINITY), Fp8E4M3::MAX);
        assert_eq!(Fp8E4M3::from_f32(f32::NEG_INFINITY).0, 0xfe);
        assert_eq!(Fp8E4M3::from_f32(-1e9).0, 0xfe);
        assert_eq!(Fp8E4M3::from_f32(f32::NAN).0, 0x7f);
        assert_eq!(Fp8E4M3::from_f32(-f32::NAN).0, 0xff);
        assert_eq!(Fp8E4M3::from_f32(f32::MAX).0, 0x7e);
    }

    #[test]
    fn e5m2_overflows_to_infinity() {
        assert_eq!(Fp8E5M2::from_f32(57344.0), Fp8E5M2::MAX);
        // Below the halfway point to 2^16 still rounds to max.
        assert_eq!(Fp8E5M2::from_f32(61439.0), Fp8E5M2::MAX);
        // Halfway (61440) ties to even: 2^16, which overflows.
        assert_eq!(Fp8E5M2::from_f32(61440.0).0, 0x7c);
        assert_eq!(Fp8E5M2::from_f32(1e6).0, 0x7c);
        assert_eq!(Fp8E5M2::from_f32(-1e6).0, 0xfc);
        assert_eq!(Fp8E5M2::from_f32(f32::INFINITY).0, 0x7c);
        assert_eq!(Fp8E5M2::from_f32(f32::NAN).0, 0x7e);
    }

    #[test]
    fn ieee_equality() {
        assert_eq!(Fp8E4M3(0x00), Fp8E4M3(0x80));
        assert_ne!(Fp8E4M3::NAN, Fp8E4M3::NAN);
        assert!(Fp8E5M2::ONE < Fp8E5M2::MAX);
        assert_eq!(format!("{}", Fp8E4M3::MAX), "448");
    }

    #[test]
    fn tiny_and_huge_f64_inputs() {
        assert_eq!(Fp8E4M3::from_f64(1e-300).0, 0);
        assert_eq!(Fp8E4M3::from_f64(-1e-300).0, 0x80);
        assert_eq!(Fp8E4M3::from_f64(f64::MAX).0, 0x7e);
        assert_eq!(Fp8E5M2::from_f64(f64::MAX).0, 0x7c);
        assert_eq!(Fp8E5M2::from_f64(f64::from_bits(1)).0, 0);
    }
}
