//! Element encoding: the bytes of one element of every [`DataType`], from and to numbers.
//!
//! Floating-point types narrower than `f32` (half, bfloat16, fp8) are encoded by hand, for
//! values that are exactly representable: the perf tools only ever write such values, so a
//! rounding encoder is not needed here.

use ferroccl::DataType;

/// Bit layout of a binary floating-point format.
#[derive(Debug, Clone, Copy)]
struct FloatFormat {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    /// Whether the all-ones exponent means infinity/NaN (IEEE). The fp8 e4m3 "fn" variant
    /// has no infinities: only `S.1111.111` is NaN.
    ieee_specials: bool,
}

const F16: FloatFormat = FloatFormat {
    exp_bits: 5,
    man_bits: 10,
    bias: 15,
    ieee_specials: true,
};
const BF16: FloatFormat = FloatFormat {
    exp_bits: 8,
    man_bits: 7,
    bias: 127,
    ieee_specials: true,
};
const E4M3: FloatFormat = FloatFormat {
    exp_bits: 4,
    man_bits: 3,
    bias: 7,
    ieee_specials: false,
};
const E5M2: FloatFormat = FloatFormat {
    exp_bits: 5,
    man_bits: 2,
    bias: 15,
    ieee_specials: true,
};

fn small_format(dtype: DataType) -> Option<FloatFormat> {
    match dtype {
        DataType::Float16 => Some(F16),
        DataType::Bfloat16 => Some(BF16),
        DataType::Float8E4M3 => Some(E4M3),
        DataType::Float8E5M2 => Some(E5M2),
        _ => None,
    }
}

impl FloatFormat {
    fn decode(self, bits: u32) -> f64 {
        let m = self.man_bits;
        let e = self.exp_bits;
        let sign = if (bits >> (e + m)) & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        let exp = (bits >> m) & ((1 << e) - 1);
        let man = bits & ((1 << m) - 1);
        let max_exp = (1 << e) - 1;
        if exp == max_exp {
            if self.ieee_specials {
                return if man == 0 {
                    sign * f64::INFINITY
                } else {
                    f64::NAN
                };
            }
            if man == (1 << m) - 1 {
                return f64::NAN;
            }
        }
        let man_scale = f64::from(1u32 << m);
        if exp == 0 {
            sign * f64::from(man) / man_scale * 2f64.powi(1 - self.bias)
        } else {
            sign * (1.0 + f64::from(man) / man_scale) * 2f64.powi(exp as i32 - self.bias)
        }
    }

    /// The bits of `x` if `x` is exactly representable (zero, normal or subnormal).
    fn encode_exact(self, x: f64) -> Option<u32> {
        if !x.is_finite() {
            return None;
        }
        let sign = u32::from(x.is_sign_negative());
        let a = x.abs();
        let m = self.man_bits;
        let bits = if a == 0.0 {
            0
        } else {
            // `a` is a normal f64 here (our formats' ranges sit well inside f64's).
            let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
            let (exp_field, man) = if e < 1 - self.bias {
                (0, a / 2f64.powi(1 - self.bias - m as i32))
            } else {
                (
                    (e + self.bias) as u32,
                    (a / 2f64.powi(e) - 1.0) * f64::from(1u32 << m),
                )
            };
            if man.fract() != 0.0 || man >= f64::from(1u32 << m) || exp_field >= 1 << self.exp_bits
            {
                return None;
            }
            (exp_field << m) | man as u32
        };
        let bits = bits | (sign << (self.exp_bits + m));
        // The round trip rejects NaN/infinity patterns and anything past the largest finite.
        (self.decode(bits) == x).then_some(bits)
    }
}

/// Whether `dtype` is a signed integer or a floating-point type.
pub const fn is_signed(dtype: DataType) -> bool {
    !matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64)
}

/// Decodes one element (`bytes.len() == dtype.size()`, little-endian) to `f64`. Integers of
/// more than 53 bits lose precision; compare those by bytes.
///
/// # Panics
/// If `bytes` is shorter than one element.
pub fn decode(dtype: DataType, bytes: &[u8]) -> f64 {
    let b = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&bytes[..n]);
        a
    };
    match dtype {
        DataType::Int8 => f64::from(bytes[0] as i8),
        DataType::Uint8 => f64::from(bytes[0]),
        DataType::Int32 => f64::from(i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
        DataType::Uint32 => f64::from(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
        DataType::Int64 => i64::from_le_bytes(b(8)) as f64,
        DataType::Uint64 => u64::from_le_bytes(b(8)) as f64,
        DataType::Float32 => {
            f64::from(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
        }
        DataType::Float64 => f64::from_le_bytes(b(8)),
        DataType::Float16 | DataType::Bfloat16 => {
            small_decode(dtype, u32::from(u16::from_le_bytes([bytes[0], bytes[1]])))
        }
        DataType::Float8E4M3 | DataType::Float8E5M2 => small_decode(dtype, u32::from(bytes[0])),
    }
}

fn small_decode(dtype: DataType, bits: u32) -> f64 {
    small_format(dtype).map_or(f64::NAN, |f| f.decode(bits))
}

/// Decodes one integer element to `i128` exactly (`None` for floating-point types).
///
/// # Panics
/// If `bytes` is shorter than one element.
pub fn decode_int(dtype: DataType, bytes: &[u8]) -> Option<i128> {
    let mut a = [0u8; 8];
    let n = dtype.size();
    a[..n].copy_from_slice(&bytes[..n]);
    let v = match dtype {
        DataType::Int8 => i128::from(a[0] as i8),
        DataType::Uint8 => i128::from(a[0]),
        DataType::Int32 => i128::from(i32::from_le_bytes([a[0], a[1], a[2], a[3]])),
        DataType::Uint32 => i128::from(u32::from_le_bytes([a[0], a[1], a[2], a[3]])),
        DataType::Int64 => i128::from(i64::from_le_bytes(a)),
        DataType::Uint64 => i128::from(u64::from_le_bytes(a)),
        _ => return None,
    };
    Some(v)
}

/// Writes `v` as one element of `dtype` into `out[..dtype.size()]`.
///
/// Integer types keep the low bits (two's-complement wrapping, as a reduction in that type
/// would); floating-point types must represent `v` exactly.
///
/// Returns `false`, leaving `out` unchanged, when a floating-point type cannot hold `v`
/// exactly.
///
/// # Panics
/// If `out` is shorter than one element.
pub fn encode(dtype: DataType, v: f64, out: &mut [u8]) -> bool {
    match dtype {
        DataType::Float32 => {
            let f = v as f32;
            if f64::from(f) != v && !v.is_nan() {
                return false;
            }
            out[..4].copy_from_slice(&f.to_le_bytes());
        }
        DataType::Float64 => out[..8].copy_from_slice(&v.to_le_bytes()),
        DataType::Float16 | DataType::Bfloat16 => {
            let Some(bits) = small_format(dtype).and_then(|f| f.encode_exact(v)) else {
                return false;
            };
            // Bits fit in 16 bits for these formats.
            out[..2].copy_from_slice(&(bits as u16).to_le_bytes());
        }
        DataType::Float8E4M3 | DataType::Float8E5M2 => {
            let Some(bits) = small_format(dtype).and_then(|f| f.encode_exact(v)) else {
                return false;
            };
            out[0] = bits as u8;
        }
        _ => {
            if v.fract() != 0.0 || !v.is_finite() {
                return false;
            }
            encode_int(dtype, v as i128, out);
        }
    }
    true
}

/// Writes the low `8 * dtype.size()` bits of `v` (two's complement) into `out`.
/// For floating-point types `v` is converted as by [`encode`].
///
/// # Panics
/// If `out` is shorter than one element.
pub fn encode_int(dtype: DataType, v: i128, out: &mut [u8]) {
    if dtype.is_float() {
        encode(dtype, v as f64, out);
        return;
    }
    let n = dtype.size();
    out[..n].copy_from_slice(&v.to_le_bytes()[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits_of(dtype: DataType, v: f64) -> Option<u64> {
        let mut b = [0u8; 8];
        encode(dtype, v, &mut b).then(|| u64::from_le_bytes(b))
    }

    #[test]
    fn known_bit_patterns() {
        assert_eq!(bits_of(DataType::Float16, 1.0), Some(0x3c00));
        assert_eq!(bits_of(DataType::Float16, -2.0), Some(0xc000));
        assert_eq!(bits_of(DataType::Float16, 2048.0), Some(0x6800));
        assert_eq!(bits_of(DataType::Float16, 65504.0), Some(0x7bff));
        assert_eq!(bits_of(DataType::Float16, 2049.0), None);
        assert_eq!(bits_of(DataType::Float16, 65536.0), None);
        assert_eq!(bits_of(DataType::Bfloat16, 1.0), Some(0x3f80));
        assert_eq!(bits_of(DataType::Bfloat16, -3.0), Some(0xc040));
        assert_eq!(bits_of(DataType::Bfloat16, 257.0), None);
        assert_eq!(bits_of(DataType::Float8E4M3, 1.0), Some(0x38));
        assert_eq!(bits_of(DataType::Float8E4M3, 448.0), Some(0x7e));
        assert_eq!(bits_of(DataType::Float8E4M3, -16.0), Some(0xd8));
        assert_eq!(bits_of(DataType::Float8E4M3, 17.0), None);
        assert_eq!(bits_of(DataType::Float8E4M3, 480.0), None);
        assert_eq!(bits_of(DataType::Float8E5M2, 1.0), Some(0x3c));
        assert_eq!(bits_of(DataType::Float8E5M2, 57344.0), Some(0x7b));
        assert_eq!(bits_of(DataType::Float8E5M2, 5.0), Some(0x45));
        assert_eq!(bits_of(DataType::Float8E5M2, 9.0), None);
        assert_eq!(bits_of(DataType::Float32, 16_777_217.0), None);
        assert_eq!(
            bits_of(DataType::Float32, -1.5),
            Some(u64::from((-1.5f32).to_bits()))
        );
        assert_eq!(bits_of(DataType::Int8, -1.0), Some(0xff));
        assert_eq!(bits_of(DataType::Int8, 0.5), None);
        assert_eq!(bits_of(DataType::Float16, 0.0), Some(0));
    }

    #[test]
    fn small_formats_round_trip_every_pattern() {
        for dtype in [DataType::Float8E4M3, DataType::Float8E5M2] {
            for bits in 0u32..256 {
                let v = small_decode(dtype, bits);
                if v.is_nan() || v.is_infinite() {
                    continue;
                }
                let mut b = [0u8; 1];
                assert!(encode(dtype, v, &mut b), "{dtype} {bits:#x} = {v}");
                // -0 and +0 both decode to zero; the encoder keeps the sign.
                assert_eq!(u32::from(b[0]), bits, "{dtype} {bits:#x} = {v}");
            }
        }
        for dtype in [DataType::Float16, DataType::Bfloat16] {
            for bits in (0u32..65536).step_by(7) {
                let v = small_decode(dtype, bits);
                if v.is_nan() || v.is_infinite() {
                    continue;
                }
                let mut b = [0u8; 2];
                assert!(encode(dtype, v, &mut b), "{dtype} {bits:#x} = {v}");
                assert_eq!(u32::from(u16::from_le_bytes(b)), bits, "{dtype} {bits:#x}");
            }
        }
        assert!(small_decode(DataType::Float8E4M3, 0x7f).is_nan());
        assert_eq!(small_decode(DataType::Float8E5M2, 0x7c), f64::INFINITY);
        // Subnormals.
        assert_eq!(small_decode(DataType::Float8E4M3, 0x01), 2f64.powi(-9));
        assert_eq!(small_decode(DataType::Float16, 0x0001), 2f64.powi(-24));
    }

    #[test]
    fn integers_wrap_and_decode() {
        let mut b = [0u8; 8];
        encode_int(DataType::Uint8, 256 + 7, &mut b);
        assert_eq!(b[0], 7);
        encode_int(DataType::Int32, -5, &mut b);
        assert_eq!(decode_int(DataType::Int32, &b), Some(-5));
        assert_eq!(decode(DataType::Int32, &b), -5.0);
        encode_int(DataType::Uint64, i128::from(u64::MAX), &mut b);
        assert_eq!(decode_int(DataType::Uint64, &b), Some(i128::from(u64::MAX)));
        assert_eq!(decode_int(DataType::Float32, &b), None);
        assert!(is_signed(DataType::Float8E5M2) && !is_signed(DataType::Uint32));
    }
}
