//! Generic element loops, written so the compiler vectorises them, and compiled once per
//! instruction set (plain, AVX2, AVX-512) so the vectoriser can use wide registers.

use super::{Isa, Lhs};
use crate::element::{load, store, with_element, Arith};
use crate::{DataType, ElemOp};

/// `dst[i] = f(a[i], b[i])`, `a` being `dst` itself or another buffer of the same length.
///
/// Slices (rather than raw pointers) tell the compiler the buffers do not overlap, so the loops
/// vectorise without run-time overlap checks.
#[inline(always)]
fn zip_body<T: Arith, F: Fn(T, T) -> T>(dst: &mut [u8], a: Lhs<'_>, b: &[u8], f: F) {
    let n = std::mem::size_of::<T>();
    match a {
        Lhs::Dst => {
            for (d, y) in dst.chunks_exact_mut(n).zip(b.chunks_exact(n)) {
                let v = f(load(d), load(y));
                store(d, v);
            }
        }
        Lhs::Buf(a) => {
            for ((d, x), y) in dst
                .chunks_exact_mut(n)
                .zip(a.chunks_exact(n))
                .zip(b.chunks_exact(n))
            {
                store(d, f(load(x), load(y)));
            }
        }
    }
}

/// `dst[i] = f(src[i])`, `src` being `dst` itself (`None`) or another buffer.
#[inline(always)]
fn map_body<T: Arith, F: Fn(T) -> T>(dst: &mut [u8], src: Option<&[u8]>, f: F) {
    let n = std::mem::size_of::<T>();
    match src {
        None => {
            for d in dst.chunks_exact_mut(n) {
                let v = f(load(d));
                store(d, v);
            }
        }
        Some(s) => {
            for (d, x) in dst.chunks_exact_mut(n).zip(s.chunks_exact(n)) {
                store(d, f(load(x)));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn zip_avx2<T: Arith, F: Fn(T, T) -> T>(dst: &mut [u8], a: Lhs<'_>, b: &[u8], f: F) {
    zip_body(dst, a, b, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn zip_avx512<T: Arith, F: Fn(T, T) -> T>(dst: &mut [u8], a: Lhs<'_>, b: &[u8], f: F) {
    zip_body(dst, a, b, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn map_avx2<T: Arith, F: Fn(T) -> T>(dst: &mut [u8], src: Option<&[u8]>, f: F) {
    map_body(dst, src, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c,fma")]
unsafe fn map_avx512<T: Arith, F: Fn(T) -> T>(dst: &mut [u8], src: Option<&[u8]>, f: F) {
    map_body(dst, src, f)
}

/// Runs `dst[i] = f(a[i], b[i])` compiled for `isa` (which the caller checked is supported).
fn zip<T: Arith, F: Fn(T, T) -> T>(isa: Isa, dst: &mut [u8], a: Lhs<'_>, b: &[u8], f: F) {
    match isa {
        // SAFETY: the caller checked that the CPU supports `isa` (`Isa::is_supported`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { zip_avx512(dst, a, b, f) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { zip_avx2(dst, a, b, f) },
        _ => zip_body(dst, a, b, f),
    }
}

/// Runs `dst[i] = f(src[i])` compiled for `isa` (which the caller checked is supported).
pub(super) fn map<T: Arith, F: Fn(T) -> T>(isa: Isa, dst: &mut [u8], src: Option<&[u8]>, f: F) {
    match isa {
        // SAFETY: the caller checked that the CPU supports `isa` (`Isa::is_supported`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { map_avx512(dst, src, f) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { map_avx2(dst, src, f) },
        _ => map_body(dst, src, f),
    }
}

/// `dst[i] = a[i] op b[i]` for any dtype and op.
pub(super) fn binary(isa: Isa, dtype: DataType, op: ElemOp, dst: &mut [u8], a: Lhs<'_>, b: &[u8]) {
    with_element!(dtype, T => match op {
        ElemOp::Sum => zip(isa, dst, a, b, T::elem_sum),
        ElemOp::Prod => zip(isa, dst, a, b, T::elem_prod),
        ElemOp::Max => zip(isa, dst, a, b, T::elem_max),
        ElemOp::Min => zip(isa, dst, a, b, T::elem_min),
    })
}
