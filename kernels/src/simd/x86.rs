//! Hand-written AVX2 and AVX-512 loops for the hot dtype × op pairs.
//!
//! Every kernel has the same shape: unaligned vector loads and stores over the body, then the
//! scalar [`Arith`] op for the remaining elements, so the tail and the body agree with the
//! reference by construction (the vector ops reproduce the scalar ones exactly).

use std::arch::x86_64::*;
use std::mem::size_of;
use std::ptr;

use half::{bf16, f16};

use super::{FloatUnary, Isa};
use crate::element::Arith;
use crate::{DataType, ElemOp};

/// `dst[i] = a[i] op b[i]` for `n` elements; `a` may be `dst` itself.
///
/// # Safety
/// The CPU supports the kernel's instruction set; `dst` is valid for writes and `a`, `b` for
/// reads of `n` elements of the kernel's dtype (any alignment); `dst` does not overlap `a` or
/// `b`, except that `a` may equal `dst`.
pub(super) type Binary = unsafe fn(dst: *mut u8, a: *const u8, b: *const u8, n: usize);

/// `dst[i] = src[i] * c` or `src[i] / c` for `n` elements; `src` may be `dst` itself. `c` is
/// converted to the element's arithmetic type (f32 for f32/f16/bf16) exactly as [`Arith`] does.
///
/// # Safety
/// As [`Binary`], with `src` in the role of `a`.
pub(super) type Unary = unsafe fn(dst: *mut u8, src: *const u8, n: usize, c: f64);

/// Defines a binary kernel: `$lanes` elements of `$t` per vector, `$ld`/`$st` move one vector,
/// `$vop` combines two vectors, `$sop` combines two scalars for the tail.
macro_rules! binary_kernel {
    ($feat:literal, $name:ident, $t:ty, $lanes:expr, $ld:path, $st:path, $vop:path, $sop:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name(dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
            const S: usize = size_of::<$t>();
            const L: usize = $lanes;
            let mut i = 0;
            while i + 2 * L <= n {
                // SAFETY: elements i..i + 2L are in bounds (loop condition; the caller guarantees
                // n elements behind each pointer); the loads and stores are unaligned ones.
                unsafe {
                    let x0 = $ld(a.add(i * S));
                    let y0 = $ld(b.add(i * S));
                    let x1 = $ld(a.add((i + L) * S));
                    let y1 = $ld(b.add((i + L) * S));
                    $st(dst.add(i * S), $vop(x0, y0));
                    $st(dst.add((i + L) * S), $vop(x1, y1));
                }
                i += 2 * L;
            }
            if i + L <= n {
                // SAFETY: elements i..i + L are in bounds, as above.
                unsafe {
                    let x = $ld(a.add(i * S));
                    let y = $ld(b.add(i * S));
                    $st(dst.add(i * S), $vop(x, y));
                }
                i += L;
            }
            while i < n {
                // SAFETY: element i is in bounds; `$t` is plain old data, read/written unaligned.
                unsafe {
                    let x = ptr::read_unaligned(a.add(i * S).cast::<$t>());
                    let y = ptr::read_unaligned(b.add(i * S).cast::<$t>());
                    ptr::write_unaligned(dst.add(i * S).cast::<$t>(), ($sop)(x, y));
                }
                i += 1;
            }
        }
    };
}

/// Defines a unary kernel `dst[i] = $vop(src[i], c)` over f32 lanes (f32, f16, bf16).
macro_rules! unary_kernel {
    ($feat:literal, $name:ident, $t:ty, $lanes:expr, $ld:path, $st:path, $splat:path, $vop:path, $sop:expr) => {
        #[target_feature(enable = $feat)]
        unsafe fn $name(dst: *mut u8, src: *const u8, n: usize, c: f64) {
            const S: usize = size_of::<$t>();
            const L: usize = $lanes;
            let c = c as f32;
            // SAFETY: the caller guarantees the CPU supports this kernel's instruction set.
            let cv = unsafe { $splat(c) };
            let mut i = 0;
            while i + L <= n {
                // SAFETY: elements i..i + L are in bounds (loop condition and the caller's
                // guarantee of n elements); the loads and stores are unaligned ones.
                unsafe {
                    let x = $ld(src.add(i * S));
                    $st(dst.add(i * S), $vop(x, cv));
                }
                i += L;
            }
            while i < n {
                // SAFETY: element i is in bounds; `$t` is plain old data, read/written unaligned.
                unsafe {
                    let x = ptr::read_unaligned(src.add(i * S).cast::<$t>());
                    ptr::write_unaligned(dst.add(i * S).cast::<$t>(), ($sop)(x, c));
                }
                i += 1;
            }
        }
    };
}

mod fp8;

/// Returns the hand-written binary kernel for `dtype`/`op` at level `isa`, if there is one.
pub(super) fn binary(isa: Isa, dtype: DataType, op: ElemOp) -> Option<Binary> {
    let k = match isa {
        Isa::Avx512 => avx512::binary(dtype, op),
        Isa::Avx2 => avx2::binary(dtype, op),
        Isa::Portable => None,
    };
    k.or_else(|| fp8::binary(isa, dtype, op))
}

/// Returns the hand-written multiply/divide kernel for `dtype` at level `isa`, if there is one.
pub(super) fn unary(isa: Isa, dtype: DataType, kind: FloatUnary) -> Option<Unary> {
    let k = match isa {
        Isa::Avx512 => avx512::unary(dtype, kind),
        Isa::Avx2 => avx2::unary(dtype, kind),
        Isa::Portable => None,
    };
    k.or_else(|| fp8::unary(isa, dtype, kind))
}

// The AVX-512 intrinsics were stabilised in Rust 1.89, above the workspace's declared
// rust-version: building this module needs Rust 1.89 or later.
#[clippy::msrv = "1.89"]
mod avx512 {
    use super::*;

    const ROUND: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

    // ---- loads and stores (all unaligned) -------------------------------------------------

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld_f32(p: *const u8) -> __m512 {
        // SAFETY: the caller guarantees 64 readable bytes at p.
        unsafe { _mm512_loadu_ps(p.cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn st_f32(p: *mut u8, v: __m512) {
        // SAFETY: the caller guarantees 64 writable bytes at p.
        unsafe { _mm512_storeu_ps(p.cast(), v) }
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld_f64(p: *const u8) -> __m512d {
        // SAFETY: the caller guarantees 64 readable bytes at p.
        unsafe { _mm512_loadu_pd(p.cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn st_f64(p: *mut u8, v: __m512d) {
        // SAFETY: the caller guarantees 64 writable bytes at p.
        unsafe { _mm512_storeu_pd(p.cast(), v) }
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld_int(p: *const u8) -> __m512i {
        // SAFETY: the caller guarantees 64 readable bytes at p.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn st_int(p: *mut u8, v: __m512i) {
        // SAFETY: the caller guarantees 64 writable bytes at p.
        unsafe { _mm512_storeu_si512(p.cast(), v) }
    }
    /// 16 f16 -> 16 f32 (exact).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld_f16(p: *const u8) -> __m512 {
        // SAFETY: the caller guarantees 32 readable bytes at p.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    /// 16 f32 -> 16 f16, nearest even (as `f16::from_f32`).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn st_f16(p: *mut u8, v: __m512) {
        // SAFETY: the caller guarantees 32 writable bytes at p.
        unsafe { _mm256_storeu_si256(p.cast(), _mm512_cvtps_ph::<ROUND>(v)) }
    }
    /// 16 bf16 -> 16 f32: the bits move to the top half (exact).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld_bf16(p: *const u8) -> __m512 {
        // SAFETY: the caller guarantees 32 readable bytes at p.
        let h = unsafe { _mm256_loadu_si256(p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
    /// 16 f32 -> 16 bf16 as `bf16::from_f32`: nearest even; a NaN keeps its top bits and gets
    /// the quiet bit.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn st_bf16(p: *mut u8, v: __m512) {
        let x = _mm512_castps_si512(v);
        let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
        let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd);
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(x, bias));
        let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x40));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        let r = _mm512_mask_blend_epi32(nan, rounded, quiet);
        // SAFETY: the caller guarantees 32 writable bytes at p.
        unsafe { _mm256_storeu_si256(p.cast(), _mm512_cvtepi32_epi16(r)) }
    }

    // ---- vector ops -----------------------------------------------------------------------

    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn add_ps(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn mul_ps(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn div_ps(a: __m512, b: __m512) -> __m512 {
        _mm512_div_ps(a, b)
    }
    /// IEEE `maximum` as `max_f32`: a NaN `a` wins, then a NaN `b`; equal values (±0) are
    /// combined with AND so +0 wins.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn max_ps(a: __m512, b: __m512) -> __m512 {
        let m = _mm512_max_ps(a, b);
        let both = _mm512_castsi512_ps(_mm512_and_si512(
            _mm512_castps_si512(a),
            _mm512_castps_si512(b),
        ));
        let m = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b), m, both);
        let m = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(b, b), m, b);
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), m, a)
    }
    /// IEEE `minimum` as `min_f32` (OR of equal values so -0 wins).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn min_ps(a: __m512, b: __m512) -> __m512 {
        let m = _mm512_min_ps(a, b);
        let either = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(a),
            _mm512_castps_si512(b),
        ));
        let m = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b), m, either);
        let m = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(b, b), m, b);
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a), m, a)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn add_pd(a: __m512d, b: __m512d) -> __m512d {
        _mm512_add_pd(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn mul_pd(a: __m512d, b: __m512d) -> __m512d {
        _mm512_mul_pd(a, b)
    }
    /// As `max_ps`, for f64.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn max_pd(a: __m512d, b: __m512d) -> __m512d {
        let m = _mm512_max_pd(a, b);
        let both = _mm512_castsi512_pd(_mm512_and_si512(
            _mm512_castpd_si512(a),
            _mm512_castpd_si512(b),
        ));
        let m = _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_EQ_OQ>(a, b), m, both);
        let m = _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_UNORD_Q>(b, b), m, b);
        _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_UNORD_Q>(a, a), m, a)
    }
    /// As `min_ps`, for f64.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn min_pd(a: __m512d, b: __m512d) -> __m512d {
        let m = _mm512_min_pd(a, b);
        let either = _mm512_castsi512_pd(_mm512_or_si512(
            _mm512_castpd_si512(a),
            _mm512_castpd_si512(b),
        ));
        let m = _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_EQ_OQ>(a, b), m, either);
        let m = _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_UNORD_Q>(b, b), m, b);
        _mm512_mask_blend_pd(_mm512_cmp_pd_mask::<_CMP_UNORD_Q>(a, a), m, a)
    }

    macro_rules! int_op {
        ($name:ident, $intr:ident) => {
            #[inline]
            #[target_feature(enable = "avx512f")]
            unsafe fn $name(a: __m512i, b: __m512i) -> __m512i {
                $intr(a, b)
            }
        };
    }
    int_op!(add32, _mm512_add_epi32);
    int_op!(mul32, _mm512_mullo_epi32);
    int_op!(max_i32, _mm512_max_epi32);
    int_op!(min_i32, _mm512_min_epi32);
    int_op!(max_u32, _mm512_max_epu32);
    int_op!(min_u32, _mm512_min_epu32);
    int_op!(add64, _mm512_add_epi64);
    int_op!(max_i64, _mm512_max_epi64);
    int_op!(min_i64, _mm512_min_epi64);
    int_op!(max_u64, _mm512_max_epu64);
    int_op!(min_u64, _mm512_min_epu64);

    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn splat_ps(c: f32) -> __m512 {
        _mm512_set1_ps(c)
    }

    // ---- kernels --------------------------------------------------------------------------

    macro_rules! kernels {
        ($($name:ident: $t:ty, $lanes:expr, $ld:path, $st:path, $vop:path, $sop:ident;)*) => {
            $(binary_kernel!("avx512f", $name, $t, $lanes, $ld, $st, $vop, <$t as Arith>::$sop);)*
        };
    }
    kernels! {
        f32_sum: f32, 16, ld_f32, st_f32, add_ps, elem_sum;
        f32_prod: f32, 16, ld_f32, st_f32, mul_ps, elem_prod;
        f32_max: f32, 16, ld_f32, st_f32, max_ps, elem_max;
        f32_min: f32, 16, ld_f32, st_f32, min_ps, elem_min;
        f64_sum: f64, 8, ld_f64, st_f64, add_pd, elem_sum;
        f64_prod: f64, 8, ld_f64, st_f64, mul_pd, elem_prod;
        f64_max: f64, 8, ld_f64, st_f64, max_pd, elem_max;
        f64_min: f64, 8, ld_f64, st_f64, min_pd, elem_min;
        f16_sum: f16, 16, ld_f16, st_f16, add_ps, elem_sum;
        f16_prod: f16, 16, ld_f16, st_f16, mul_ps, elem_prod;
        f16_max: f16, 16, ld_f16, st_f16, max_ps, elem_max;
        f16_min: f16, 16, ld_f16, st_f16, min_ps, elem_min;
        bf16_sum: bf16, 16, ld_bf16, st_bf16, add_ps, elem_sum;
        bf16_prod: bf16, 16, ld_bf16, st_bf16, mul_ps, elem_prod;
        bf16_max: bf16, 16, ld_bf16, st_bf16, max_ps, elem_max;
        bf16_min: bf16, 16, ld_bf16, st_bf16, min_ps, elem_min;
        i32_sum: i32, 16, ld_int, st_int, add32, elem_sum;
        i32_prod: i32, 16, ld_int, st_int, mul32, elem_prod;
        i32_max: i32, 16, ld_int, st_int, max_i32, elem_max;
        i32_min: i32, 16, ld_int, st_int, min_i32, elem_min;
        u32_sum: u32, 16, ld_int, st_int, add32, elem_sum;
        u32_prod: u32, 16, ld_int, st_int, mul32, elem_prod;
        u32_max: u32, 16, ld_int, st_int, max_u32, elem_max;
        u32_min: u32, 16, ld_int, st_int, min_u32, elem_min;
        i64_sum: i64, 8, ld_int, st_int, add64, elem_sum;
        i64_max: i64, 8, ld_int, st_int, max_i64, elem_max;
        i64_min: i64, 8, ld_int, st_int, min_i64, elem_min;
        u64_sum: u64, 8, ld_int, st_int, add64, elem_sum;
        u64_max: u64, 8, ld_int, st_int, max_u64, elem_max;
        u64_min: u64, 8, ld_int, st_int, min_u64, elem_min;
    }

    unary_kernel!(
        "avx512f",
        f32_mul,
        f32,
        16,
        ld_f32,
        st_f32,
        splat_ps,
        mul_ps,
        <f32 as Arith>::elem_mul
    );
    unary_kernel!(
        "avx512f",
        f32_div,
        f32,
        16,
        ld_f32,
        st_f32,
        splat_ps,
        div_ps,
        <f32 as Arith>::elem_div
    );
    unary_kernel!(
        "avx512f",
        f16_mul,
        f16,
        16,
        ld_f16,
        st_f16,
        splat_ps,
        mul_ps,
        <f16 as Arith>::elem_mul
    );
    unary_kernel!(
        "avx512f",
        f16_div,
        f16,
        16,
        ld_f16,
        st_f16,
        splat_ps,
        div_ps,
        <f16 as Arith>::elem_div
    );
    unary_kernel!(
        "avx512f",
        bf16_mul,
        bf16,
        16,
        ld_bf16,
        st_bf16,
        splat_ps,
        mul_ps,
        <bf16 as Arith>::elem_mul
    );
    unary_kernel!(
        "avx512f",
        bf16_div,
        bf16,
        16,
        ld_bf16,
        st_bf16,
        splat_ps,
        div_ps,
        <bf16 as Arith>::elem_div
    );

    pub(super) fn binary(dtype: DataType, op: ElemOp) -> Option<Binary> {
        use DataType as D;
        use ElemOp as O;
        let k: Binary = match (dtype, op) {
            (D::Float32, O::Sum) => f32_sum,
            (D::Float32, O::Prod) => f32_prod,
            (D::Float32, O::Max) => f32_max,
            (D::Float32, O::Min) => f32_min,
            (D::Float64, O::Sum) => f64_sum,
            (D::Float64, O::Prod) => f64_prod,
            (D::Float64, O::Max) => f64_max,
            (D::Float64, O::Min) => f64_min,
            (D::Float16, O::Sum) => f16_sum,
            (D::Float16, O::Prod) => f16_prod,
            (D::Float16, O::Max) => f16_max,
            (D::Float16, O::Min) => f16_min,
            (D::Bfloat16, O::Sum) => bf16_sum,
            (D::Bfloat16, O::Prod) => bf16_prod,
            (D::Bfloat16, O::Max) => bf16_max,
            (D::Bfloat16, O::Min) => bf16_min,
            (D::Int32, O::Sum) => i32_sum,
            (D::Int32, O::Prod) => i32_prod,
            (D::Int32, O::Max) => i32_max,
            (D::Int32, O::Min) => i32_min,
            (D::Uint32, O::Sum) => u32_sum,
            (D::Uint32, O::Prod) => u32_prod,
            (D::Uint32, O::Max) => u32_max,
            (D::Uint32, O::Min) => u32_min,
            (D::Int64, O::Sum) => i64_sum,
            (D::Int64, O::Max) => i64_max,
            (D::Int64, O::Min) => i64_min,
            (D::Uint64, O::Sum) => u64_sum,
            (D::Uint64, O::Max) => u64_max,
            (D::Uint64, O::Min) => u64_min,
            _ => return None,
        };
        Some(k)
    }

    pub(super) fn unary(dtype: DataType, kind: FloatUnary) -> Option<Unary> {
        let k: Unary = match (dtype, kind) {
            (DataType::Float32, FloatUnary::Mul) => f32_mul,
            (DataType::Float32, FloatUnary::Div) => f32_div,
            (DataType::Float16, FloatUnary::Mul) => f16_mul,
            (DataType::Float16, FloatUnary::Div) => f16_div,
            (DataType::Bfloat16, FloatUnary::Mul) => bf16_mul,
            (DataType::Bfloat16, FloatUnary::Div) => bf16_div,
            _ => return None,
        };
        Some(k)
    }
}

mod avx2 {
    use super::*;

    // ---- loads and stores (all unaligned) -------------------------------------------------

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ld_f32(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 32 readable bytes at p.
        unsafe { _mm256_loadu_ps(p.cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn st_f32(p: *mut u8, v: __m256) {
        // SAFETY: the caller guarantees 32 writable bytes at p.
        unsafe { _mm256_storeu_ps(p.cast(), v) }
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ld_f64(p: *const u8) -> __m256d {
        // SAFETY: the caller guarantees 32 readable bytes at p.
        unsafe { _mm256_loadu_pd(p.cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn st_f64(p: *mut u8, v: __m256d) {
        // SAFETY: the caller guarantees 32 writable bytes at p.
        unsafe { _mm256_storeu_pd(p.cast(), v) }
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ld_int(p: *const u8) -> __m256i {
        // SAFETY: the caller guarantees 32 readable bytes at p.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn st_int(p: *mut u8, v: __m256i) {
        // SAFETY: the caller guarantees 32 writable bytes at p.
        unsafe { _mm256_storeu_si256(p.cast(), v) }
    }
    /// 8 f16 -> 8 f32 (exact).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ld_f16(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes at p.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    /// 8 f32 -> 8 f16, nearest even (as `f16::from_f32`).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn st_f16(p: *mut u8, v: __m256) {
        // SAFETY: the caller guarantees 16 writable bytes at p.
        unsafe { _mm_storeu_si128(p.cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)) }
    }
    /// 8 bf16 -> 8 f32 (exact).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn ld_bf16(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes at p.
        let h = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }
    /// 8 f32 -> 8 bf16 as `bf16::from_f32` (see the AVX-512 version).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn st_bf16(p: *mut u8, v: __m256) {
        let x = _mm256_castps_si256(v);
        let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd);
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(x, bias));
        let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x40));
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        let r = _mm256_blendv_epi8(rounded, quiet, nan);
        // Every lane is at most 0xffff, so the unsigned-saturating pack is exact.
        let packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256::<1>(r));
        // SAFETY: the caller guarantees 16 writable bytes at p.
        unsafe { _mm_storeu_si128(p.cast(), packed) }
    }

    // ---- vector ops -----------------------------------------------------------------------

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn add_ps(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn mul_ps(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn div_ps(a: __m256, b: __m256) -> __m256 {
        _mm256_div_ps(a, b)
    }
    /// IEEE `maximum` (see the AVX-512 version).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn max_ps(a: __m256, b: __m256) -> __m256 {
        let m = _mm256_max_ps(a, b);
        let m = _mm256_blendv_ps(m, _mm256_and_ps(a, b), _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b));
        let m = _mm256_blendv_ps(m, b, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b));
        _mm256_blendv_ps(m, a, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
    }
    /// IEEE `minimum` (see the AVX-512 version).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn min_ps(a: __m256, b: __m256) -> __m256 {
        let m = _mm256_min_ps(a, b);
        let m = _mm256_blendv_ps(m, _mm256_or_ps(a, b), _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b));
        let m = _mm256_blendv_ps(m, b, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b));
        _mm256_blendv_ps(m, a, _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a))
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn add_pd(a: __m256d, b: __m256d) -> __m256d {
        _mm256_add_pd(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn mul_pd(a: __m256d, b: __m256d) -> __m256d {
        _mm256_mul_pd(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn max_pd(a: __m256d, b: __m256d) -> __m256d {
        let m = _mm256_max_pd(a, b);
        let m = _mm256_blendv_pd(m, _mm256_and_pd(a, b), _mm256_cmp_pd::<_CMP_EQ_OQ>(a, b));
        let m = _mm256_blendv_pd(m, b, _mm256_cmp_pd::<_CMP_UNORD_Q>(b, b));
        _mm256_blendv_pd(m, a, _mm256_cmp_pd::<_CMP_UNORD_Q>(a, a))
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn min_pd(a: __m256d, b: __m256d) -> __m256d {
        let m = _mm256_min_pd(a, b);
        let m = _mm256_blendv_pd(m, _mm256_or_pd(a, b), _mm256_cmp_pd::<_CMP_EQ_OQ>(a, b));
        let m = _mm256_blendv_pd(m, b, _mm256_cmp_pd::<_CMP_UNORD_Q>(b, b));
        _mm256_blendv_pd(m, a, _mm256_cmp_pd::<_CMP_UNORD_Q>(a, a))
    }

    macro_rules! int_op {
        ($name:ident, $intr:ident) => {
            #[inline]
            #[target_feature(enable = "avx2,f16c")]
            unsafe fn $name(a: __m256i, b: __m256i) -> __m256i {
                $intr(a, b)
            }
        };
    }
    int_op!(add32, _mm256_add_epi32);
    int_op!(mul32, _mm256_mullo_epi32);
    int_op!(max_i32, _mm256_max_epi32);
    int_op!(min_i32, _mm256_min_epi32);
    int_op!(max_u32, _mm256_max_epu32);
    int_op!(min_u32, _mm256_min_epu32);
    int_op!(add64, _mm256_add_epi64);

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn splat_ps(c: f32) -> __m256 {
        _mm256_set1_ps(c)
    }

    // ---- kernels --------------------------------------------------------------------------

    macro_rules! kernels {
        ($($name:ident: $t:ty, $lanes:expr, $ld:path, $st:path, $vop:path, $sop:ident;)*) => {
            $(binary_kernel!("avx2,f16c", $name, $t, $lanes, $ld, $st, $vop, <$t as Arith>::$sop);)*
        };
    }
    kernels! {
        f32_sum: f32, 8, ld_f32, st_f32, add_ps, elem_sum;
        f32_prod: f32, 8, ld_f32, st_f32, mul_ps, elem_prod;
        f32_max: f32, 8, ld_f32, st_f32, max_ps, elem_max;
        f32_min: f32, 8, ld_f32, st_f32, min_ps, elem_min;
        f64_sum: f64, 4, ld_f64, st_f64, add_pd, elem_sum;
        f64_prod: f64, 4, ld_f64, st_f64, mul_pd, elem_prod;
        f64_max: f64, 4, ld_f64, st_f64, max_pd, elem_max;
        f64_min: f64, 4, ld_f64, st_f64, min_pd, elem_min;
        f16_sum: f16, 8, ld_f16, st_f16, add_ps, elem_sum;
        f16_prod: f16, 8, ld_f16, st_f16, mul_ps, elem_prod;
        f16_max: f16, 8, ld_f16, st_f16, max_ps, elem_max;
        f16_min: f16, 8, ld_f16, st_f16, min_ps, elem_min;
        bf16_sum: bf16, 8, ld_bf16, st_bf16, add_ps, elem_sum;
        bf16_prod: bf16, 8, ld_bf16, st_bf16, mul_ps, elem_prod;
        bf16_max: bf16, 8, ld_bf16, st_bf16, max_ps, elem_max;
        bf16_min: bf16, 8, ld_bf16, st_bf16, min_ps, elem_min;
        i32_sum: i32, 8, ld_int, st_int, add32, elem_sum;
        i32_prod: i32, 8, ld_int, st_int, mul32, elem_prod;
        i32_max: i32, 8, ld_int, st_int, max_i32, elem_max;
        i32_min: i32, 8, ld_int, st_int, min_i32, elem_min;
        u32_sum: u32, 8, ld_int, st_int, add32, elem_sum;
        u32_prod: u32, 8, ld_int, st_int, mul32, elem_prod;
        u32_max: u32, 8, ld_int, st_int, max_u32, elem_max;
        u32_min: u32, 8, ld_int, st_int, min_u32, elem_min;
        i64_sum: i64, 4, ld_int, st_int, add64, elem_sum;
        u64_sum: u64, 4, ld_int, st_int, add64, elem_sum;
    }

    unary_kernel!(
        "avx2,f16c",
        f32_mul,
        f32,
        8,
        ld_f32,
        st_f32,
        splat_ps,
        mul_ps,
        <f32 as Arith>::elem_mul
    );
    unary_kernel!(
        "avx2,f16c",
        f32_div,
        f32,
        8,
        ld_f32,
        st_f32,
        splat_ps,
        div_ps,
        <f32 as Arith>::elem_div
    );
    unary_kernel!(
        "avx2,f16c",
        f16_mul,
        f16,
        8,
        ld_f16,
        st_f16,
        splat_ps,
        mul_ps,
        <f16 as Arith>::elem_mul
    );
    unary_kernel!(
        "avx2,f16c",
        f16_div,
        f16,
        8,
        ld_f16,
        st_f16,
        splat_ps,
        div_ps,
        <f16 as Arith>::elem_div
    );
    unary_kernel!(
        "avx2,f16c",
        bf16_mul,
        bf16,
        8,
        ld_bf16,
        st_bf16,
        splat_ps,
        mul_ps,
        <bf16 as Arith>::elem_mul
    );
    unary_kernel!(
        "avx2,f16c",
        bf16_div,
        bf16,
        8,
        ld_bf16,
        st_bf16,
        splat_ps,
        div_ps,
        <bf16 as Arith>::elem_div
    );

    pub(super) fn binary(dtype: DataType, op: ElemOp) -> Option<Binary> {
        use DataType as D;
        use ElemOp as O;
        let k: Binary = match (dtype, op) {
            (D::Float32, O::Sum) => f32_sum,
            (D::Float32, O::Prod) => f32_prod,
            (D::Float32, O::Max) => f32_max,
            (D::Float32, O::Min) => f32_min,
            (D::Float64, O::Sum) => f64_sum,
            (D::Float64, O::Prod) => f64_prod,
            (D::Float64, O::Max) => f64_max,
            (D::Float64, O::Min) => f64_min,
            (D::Float16, O::Sum) => f16_sum,
            (D::Float16, O::Prod) => f16_prod,
            (D::Float16, O::Max) => f16_max,
            (D::Float16, O::Min) => f16_min,
            (D::Bfloat16, O::Sum) => bf16_sum,
            (D::Bfloat16, O::Prod) => bf16_prod,
            (D::Bfloat16, O::Max) => bf16_max,
            (D::Bfloat16, O::Min) => bf16_min,
            (D::Int32, O::Sum) => i32_sum,
            (D::Int32, O::Prod) => i32_prod,
            (D::Int32, O::Max) => i32_max,
            (D::Int32, O::Min) => i32_min,
            (D::Uint32, O::Sum) => u32_sum,
            (D::Uint32, O::Prod) => u32_prod,
            (D::Uint32, O::Max) => u32_max,
            (D::Uint32, O::Min) => u32_min,
            (D::Int64, O::Sum) => i64_sum,
            (D::Uint64, O::Sum) => u64_sum,
            _ => return None,
        };
        Some(k)
    }

    pub(super) fn unary(dtype: DataType, kind: FloatUnary) -> Option<Unary> {
        let k: Unary = match (dtype, kind) {
            (DataType::Float32, FloatUnary::Mul) => f32_mul,
            (DataType::Float32, FloatUnary::Div) => f32_div,
            (DataType::Float16, FloatUnary::Mul) => f16_mul,
            (DataType::Float16, FloatUnary::Div) => f16_div,
            (DataType::Bfloat16, FloatUnary::Mul) => bf16_mul,
            (DataType::Bfloat16, FloatUnary::Div) => bf16_div,
            _ => return None,
        };
        Some(k)
    }
}
