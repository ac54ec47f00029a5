//! fp8 kernels (e4m3, e5m2) for AVX2 and AVX-512.
//!
//! Each lane is widened to f32 exactly (e5m2 through the f16 conversion, e4m3 with integer
//! operations), combined by the same f32 vector op as the f32 kernels,
//! and narrowed back with integer operations that round as [`Fp8E4M3::from_f32`] and
//! [`Fp8E5M2::from_f32`] do: nearest even, e4m3 saturating to ±448, e5m2 overflowing to ±∞,
//! a NaN becoming the format's canonical NaN with its sign. Subnormals go through integer
//! conversions, the f16 conversion (`vcvtph2ps` ignores MXCSR.DAZ) and an explicitly rounded
//! scaling, so no lane depends on the MXCSR's flush-to-zero, denormals-are-zero or
//! rounding-mode bits, which a host program may have set.

use super::*;
use crate::fp8::{Fp8E4M3, Fp8E5M2};

/// The constants of one fp8 format the vector code needs.
trait Format {
    /// Mantissa bits.
    const MANT: i32;
    /// Exponent bias.
    const BIAS: i32;
    /// Largest finite magnitude code.
    const MAX_FINITE: i32;
    /// The magnitude code an overflowing value becomes; for e5m2 also the infinity code.
    const OVERFLOW: i32;
    /// Canonical NaN magnitude code.
    const NAN: i32;

    /// Bits to drop from an f32 mantissa.
    const SHIFT: i32 = 23 - Self::MANT;
    /// f32 bit pattern of the smallest normal, 2^(1 - bias).
    const MIN_NORMAL: i32 = (127 + 1 - Self::BIAS) << 23;
    /// The f32 exponent offset of a normal magnitude code shifted into f32 position (decode).
    const REBIAS: i32 = (127 - Self::BIAS) << 23;
    /// A subnormal's quantum, 2^(1 - bias - mant) (decode).
    const QUANTUM: f32 = f32::from_bits(((127 + 1 - Self::BIAS - Self::MANT) as u32) << 23);
    /// The reciprocal of the quantum.
    const PER_QUANTUM: f32 = f32::from_bits(((127 - 1 + Self::BIAS + Self::MANT) as u32) << 23);
}

struct E4M3;
impl Format for E4M3 {
    const MANT: i32 = 3;
    const BIAS: i32 = 7;
    const MAX_FINITE: i32 = 0x7e;
    const OVERFLOW: i32 = 0x7e;
    const NAN: i32 = 0x7f;
}

struct E5M2;
impl Format for E5M2 {
    const MANT: i32 = 2;
    const BIAS: i32 = 15;
    const MAX_FINITE: i32 = 0x7b;
    const OVERFLOW: i32 = 0x7c;
    const NAN: i32 = 0x7e;
}

// Decoding: e5m2 codes are the top byte of the f16 of the same value, so the f16 conversion
// widens them, exactly (1.85x faster than an integer decode). e4m3 goes through an integer
// decode, which measured 4-6 % faster for it than an f16 route with a NaN fix-up; its only
// magnitude code above MAX_FINITE is the NaN, 0x7f (e4m3 has no infinity).

/// Returns the fp8 kernel for `dtype`/`op` at level `isa`, if there is one.
pub(super) fn binary(isa: Isa, dtype: DataType, op: ElemOp) -> Option<Binary> {
    match isa {
        Isa::Avx512 => avx512::binary(dtype, op),
        Isa::Avx2 => avx2::binary(dtype, op),
        Isa::Portable => None,
    }
}

/// Returns the fp8 multiply/divide kernel for `dtype` at level `isa`, if there is one.
pub(super) fn unary(isa: Isa, dtype: DataType, kind: FloatUnary) -> Option<Unary> {
    match isa {
        Isa::Avx512 => avx512::unary(dtype, kind),
        Isa::Avx2 => avx2::unary(dtype, kind),
        Isa::Portable => None,
    }
}

/// The kernels and their tables, for the level whose module invokes this: that module defines
/// `ld_e4m3` .. `st_e5m2` and brings the level's f32 vector ops into scope.
macro_rules! fp8_kernels {
    ($feat:literal, $lanes:expr) => {
        fp8_kernels!(@binary $feat, $lanes;
            e4m3_sum Fp8E4M3 ld_e4m3 st_e4m3 add_ps elem_sum;
            e4m3_prod Fp8E4M3 ld_e4m3 st_e4m3 mul_ps elem_prod;
            e4m3_max Fp8E4M3 ld_e4m3 st_e4m3 max_ps elem_max;
            e4m3_min Fp8E4M3 ld_e4m3 st_e4m3 min_ps elem_min;
            e5m2_sum Fp8E5M2 ld_e5m2 st_e5m2 add_ps elem_sum;
            e5m2_prod Fp8E5M2 ld_e5m2 st_e5m2 mul_ps elem_prod;
            e5m2_max Fp8E5M2 ld_e5m2 st_e5m2 max_ps elem_max;
            e5m2_min Fp8E5M2 ld_e5m2 st_e5m2 min_ps elem_min;
        );
        fp8_kernels!(@unary $feat, $lanes;
            e4m3_mul Fp8E4M3 ld_e4m3 st_e4m3 mul_ps elem_mul;
            e4m3_div Fp8E4M3 ld_e4m3 st_e4m3 div_ps elem_div;
            e5m2_mul Fp8E5M2 ld_e5m2 st_e5m2 mul_ps elem_mul;
            e5m2_div Fp8E5M2 ld_e5m2 st_e5m2 div_ps elem_div;
        );

        pub(super) fn binary(dtype: DataType, op: ElemOp) -> Option<Binary> {
            use DataType as D;
            use ElemOp as O;
            let k: Binary = match (dtype, op) {
                (D::Float8E4M3, O::Sum) => e4m3_sum,
                (D::Float8E4M3, O::Prod) => e4m3_prod,
                (D::Float8E4M3, O::Max) => e4m3_max,
                (D::Float8E4M3, O::Min) => e4m3_min,
                (D::Float8E5M2, O::Sum) => e5m2_sum,
                (D::Float8E5M2, O::Prod) => e5m2_prod,
                (D::Float8E5M2, O::Max) => e5m2_max,
                (D::Float8E5M2, O::Min) => e5m2_min,
                _ => return None,
            };
            Some(k)
        }

        pub(super) fn unary(dtype: DataType, kind: FloatUnary) -> Option<Unary> {
            let k: Unary = match (dtype, kind) {
                (DataType::Float8E4M3, FloatUnary::Mul) => e4m3_mul,
                (DataType::Float8E4M3, FloatUnary::Div) => e4m3_div,
                (DataType::Float8E5M2, FloatUnary::Mul) => e5m2_mul,
                (DataType::Float8E5M2, FloatUnary::Div) => e5m2_div,
                _ => return None,
            };
            Some(k)
        }
    };
    (@binary $feat:literal, $lanes:expr;
     $($name:ident $t:ident $ld:ident $st:ident $vop:ident $sop:ident;)*) => {
        $(binary_kernel!($feat, $name, $t, $lanes, $ld, $st, $vop, <$t as Arith>::$sop);)*
    };
    (@unary $feat:literal, $lanes:expr;
     $($name:ident $t:ident $ld:ident $st:ident $vop:ident $sop:ident;)*) => {
        $(
            unary_kernel!($feat, $name, $t, $lanes, $ld, $st, splat_ps, $vop, <$t as Arith>::$sop);
        )*
    };
}

#[clippy::msrv = "1.89"]
mod avx512 {
    use super::*;
    use crate::simd::x86::avx512::{add_ps, div_ps, max_ps, min_ps, mul_ps, splat_ps};

    const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn set(v: i32) -> __m512i {
        _mm512_set1_epi32(v)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn count(n: i32) -> __m128i {
        _mm_cvtsi32_si128(n)
    }

    /// 16 e4m3 codes (one per 32-bit lane) -> 16 exact f32 values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn decode_e4m3(x: __m512i) -> __m512 {
        type F = E4M3;
        let mag = _mm512_and_si512(x, set(0x7f));
        let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(x, set(0x80)));
        let normal = _mm512_add_epi32(_mm512_sll_epi32(mag, count(F::SHIFT)), set(F::REBIAS));
        let sub = _mm512_castps_si512(_mm512_mul_ps(
            _mm512_cvtepi32_ps(mag),
            _mm512_set1_ps(F::QUANTUM),
        ));
        let v =
            _mm512_mask_blend_epi32(_mm512_cmplt_epi32_mask(mag, set(1 << F::MANT)), normal, sub);
        let nan = _mm512_cmpgt_epi32_mask(mag, set(F::MAX_FINITE));
        let v = _mm512_mask_blend_epi32(nan, v, set(0x7fc0_0000));
        _mm512_castsi512_ps(_mm512_or_si512(v, sign))
    }

    /// 16 f32 values -> 16 codes, rounded as `from_f32`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn encode<F: Format>(v: __m512) -> __m512i {
        let bits = _mm512_castps_si512(v);
        let abs = _mm512_and_si512(bits, set(0x7fff_ffff));
        let sign = _mm512_and_si512(_mm512_srli_epi32::<24>(bits), set(0x80));
        let odd = _mm512_and_si512(_mm512_srl_epi32(abs, count(F::SHIFT)), set(1));
        let rounded = _mm512_add_epi32(_mm512_add_epi32(abs, set((1 << (F::SHIFT - 1)) - 1)), odd);
        let normal = _mm512_sub_epi32(
            _mm512_srl_epi32(rounded, count(F::SHIFT)),
            set((127 - F::BIAS) << F::MANT),
        );
        let normal = _mm512_mask_blend_epi32(
            _mm512_cmpgt_epi32_mask(normal, set(F::MAX_FINITE)),
            normal,
            set(F::OVERFLOW),
        );
        let quanta = _mm512_roundscale_ps::<ROUND>(_mm512_mul_ps(
            // Lanes at or above the smallest normal take the normal path; clamped there, no lane
            // of the conversion below is out of range (no spurious invalid-operation flag).
            _mm512_castsi512_ps(_mm512_min_epi32(abs, set(F::MIN_NORMAL))),
            _mm512_set1_ps(F::PER_QUANTUM),
        ));
        let sub = _mm512_cvttps_epi32(quanta);
        let code = _mm512_mask_blend_epi32(
            _mm512_cmplt_epi32_mask(abs, set(F::MIN_NORMAL)),
            normal,
            sub,
        );
        let code = _mm512_mask_blend_epi32(
            _mm512_cmpgt_epi32_mask(abs, set(0x7f80_0000)),
            code,
            set(F::NAN),
        );
        _mm512_or_si512(code, sign)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn st<F: Format>(p: *mut u8, v: __m512) {
        // Every lane is a code below 256: the truncating narrow keeps it.
        let codes = _mm512_cvtepi32_epi8(encode::<F>(v));
        // SAFETY: the caller guarantees 16 writable bytes at p.
        unsafe { _mm_storeu_si128(p.cast(), codes) }
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld_e4m3(p: *const u8) -> __m512 {
        // SAFETY: the caller guarantees 16 readable bytes at p.
        decode_e4m3(_mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p.cast()) }))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn st_e4m3(p: *mut u8, v: __m512) {
        // SAFETY: as `st`.
        unsafe { st::<E4M3>(p, v) }
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld_e5m2(p: *const u8) -> __m512 {
        // SAFETY: the caller guarantees 16 readable bytes at p.
        let x = _mm256_cvtepu8_epi16(unsafe { _mm_loadu_si128(p.cast()) });
        // An e5m2 code is the top byte of the f16 of the same value (same sign, exponent and
        // bias): the conversion is exact, subnormals, infinities and NaNs included.
        _mm512_cvtph_ps(_mm256_slli_epi16::<8>(x))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn st_e5m2(p: *mut u8, v: __m512) {
        // SAFETY: as `st`.
        unsafe { st::<E5M2>(p, v) }
    }

    fp8_kernels!("avx512f", 16);
}

mod avx2 {
    use super::*;
    use crate::simd::x86::avx2::{add_ps, div_ps, max_ps, min_ps, mul_ps, splat_ps};

    const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn set(v: i32) -> __m256i {
        _mm256_set1_epi32(v)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn count(n: i32) -> __m128i {
        _mm_cvtsi32_si128(n)
    }

    /// 8 e4m3 codes (one per 32-bit lane) -> 8 exact f32 values (see the AVX-512 version).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn decode_e4m3(x: __m256i) -> __m256 {
        type F = E4M3;
        let mag = _mm256_and_si256(x, set(0x7f));
        let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(x, set(0x80)));
        let normal = _mm256_add_epi32(_mm256_sll_epi32(mag, count(F::SHIFT)), set(F::REBIAS));
        let sub = _mm256_castps_si256(_mm256_mul_ps(
            _mm256_cvtepi32_ps(mag),
            _mm256_set1_ps(F::QUANTUM),
        ));
        let v = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(set(1 << F::MANT), mag));
        let nan = _mm256_cmpgt_epi32(mag, set(F::MAX_FINITE));
        let v = _mm256_blendv_epi8(v, set(0x7fc0_0000), nan);
        _mm256_castsi256_ps(_mm256_or_si256(v, sign))
    }

    /// 8 f32 values -> 8 codes (see the AVX-512 version).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn encode<F: Format>(v: __m256) -> __m256i {
        let bits = _mm256_castps_si256(v);
        let abs = _mm256_and_si256(bits, set(0x7fff_ffff));
        let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), set(0x80));
        let odd = _mm256_and_si256(_mm256_srl_epi32(abs, count(F::SHIFT)), set(1));
        let rounded = _mm256_add_epi32(_mm256_add_epi32(abs, set((1 << (F::SHIFT - 1)) - 1)), odd);
        let normal = _mm256_sub_epi32(
            _mm256_srl_epi32(rounded, count(F::SHIFT)),
            set((127 - F::BIAS) << F::MANT),
        );
        let normal = _mm256_blendv_epi8(
            normal,
            set(F::OVERFLOW),
            _mm256_cmpgt_epi32(normal, set(F::MAX_FINITE)),
        );
        let quanta = _mm256_round_ps::<ROUND>(_mm256_mul_ps(
            // Clamped as in the AVX-512 version.
            _mm256_castsi256_ps(_mm256_min_epi32(abs, set(F::MIN_NORMAL))),
            _mm256_set1_ps(F::PER_QUANTUM),
        ));
        let sub = _mm256_cvttps_epi32(quanta);
        let code = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(set(F::MIN_NORMAL), abs));
        let code = _mm256_blendv_epi8(code, set(F::NAN), _mm256_cmpgt_epi32(abs, set(0x7f80_0000)));
        _mm256_or_si256(code, sign)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn st<F: Format>(p: *mut u8, v: __m256) {
        let c = encode::<F>(v);
        // Every lane is a code below 256, so both unsigned-saturating packs are exact.
        let words = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c));
        let bytes = _mm_packus_epi16(words, words);
        // SAFETY: the caller guarantees 8 writable bytes at p (`_mm_storel_epi64` writes 8).
        unsafe { _mm_storel_epi64(p.cast(), bytes) }
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ld_e4m3(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 8 readable bytes at p (`_mm_loadl_epi64` reads 8).
        decode_e4m3(_mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p.cast()) }))
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn st_e4m3(p: *mut u8, v: __m256) {
        // SAFETY: as `st`.
        unsafe { st::<E4M3>(p, v) }
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ld_e5m2(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 8 readable bytes at p (`_mm_loadl_epi64` reads 8).
        let x = _mm_cvtepu8_epi16(unsafe { _mm_loadl_epi64(p.cast()) });
        // As the AVX-512 version: the top byte of the f16 of the same value.
        _mm256_cvtph_ps(_mm_slli_epi16::<8>(x))
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn st_e5m2(p: *mut u8, v: __m256) {
        // SAFETY: as `st`.
        unsafe { st::<E5M2>(p, v) }
    }

    fp8_kernels!("avx2,f16c", 8);
}
