//! Fast kernels: the instruction set is chosen once at run time.
//!
//! | [`Isa`]     | when                         | kernels                                           |
//! |-------------|------------------------------|---------------------------------------------------|
//! | `Avx512`    | x86-64 with AVX-512F         | hand-written 512-bit loops for the hot cases, the |
//! |             |                              | rest compiled (auto-vectorised) for AVX-512       |
//! | `Avx2`      | x86-64 with AVX2 and F16C    | the same with 256-bit vectors                     |
//! | `Portable`  | anything else                | one generic loop the compiler auto-vectorises     |
//!
//! Hand-written loops cover f32/f64/f16/bf16/fp8 (e4m3, e5m2) sum, prod, max and min,
//! i32/u32/i64/u64 sum (and i32/u32 prod/max/min; i64/u64 max/min on AVX-512), and
//! f32/f16/bf16/fp8 scale and divide.
//! Every kernel gives exactly the results of [`crate::reference`] (a NaN may differ in payload
//! only when both operands are NaN).
//!
//! The choice is cached on first use. The environment variable `FERRO_KERNEL_ISA`
//! (`portable`, `avx2`, `avx512`) caps it, e.g. to compare paths; values the CPU lacks fall back
//! to the best one it has, unknown values are ignored.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::element::{with_element, Arith};
use crate::{check_binary, check_unary, DataType, ElemOp};

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

/// An instruction-set level the fast kernels can be compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Isa {
    /// Generic code for the compilation target (SSE2 on x86-64).
    Portable,
    /// x86-64 AVX2 + F16C.
    Avx2,
    /// x86-64 AVX-512F.
    Avx512,
}

/// Environment variable that caps the instruction set (`portable`, `avx2`, `avx512`).
pub const ISA_ENV: &str = "FERRO_KERNEL_ISA";

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// Lower-case name, as `FERRO_KERNEL_ISA` takes it.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses a name as written by [`Isa::name`].
    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether this CPU can run kernels of this level (checked at run time, not cached).
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The best level this CPU supports.
    pub fn best_supported() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|i| i.is_supported())
            .unwrap_or(Isa::Portable)
    }

    /// Every level this CPU supports, lowest first.
    pub fn supported() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }

    fn from_u8(v: u8) -> Option<Isa> {
        Isa::ALL.get(usize::from(v).checked_sub(1)?).copied()
    }

    fn to_u8(self) -> u8 {
        self as u8 + 1
    }
}

/// Cached choice: 0 = not chosen yet, otherwise `Isa::to_u8`.
static CHOSEN: AtomicU8 = AtomicU8::new(0);

/// The level the crate-level functions use: the best supported, capped by `FERRO_KERNEL_ISA`.
/// Computed once, then cached.
pub fn isa() -> Isa {
    if let Some(isa) = Isa::from_u8(CHOSEN.load(Ordering::Relaxed)) {
        return isa;
    }
    let best = Isa::best_supported();
    let isa = match std::env::var(ISA_ENV).ok().as_deref().and_then(Isa::parse) {
        Some(cap) => cap.min(best),
        None => best,
    };
    // Racing first calls compute the same value; any of them may win.
    CHOSEN.store(isa.to_u8(), Ordering::Relaxed);
    isa
}

fn check_isa(what: &str, isa: Isa) {
    assert!(
        isa.is_supported(),
        "{what}: instruction set {} is not supported by this CPU",
        isa.name()
    );
}

/// The second operand of a binary kernel: the destination itself, or another buffer.
#[derive(Clone, Copy)]
enum Lhs<'a> {
    Dst,
    Buf(&'a [u8]),
}

fn binary(isa: Isa, dtype: DataType, op: ElemOp, dst: &mut [u8], a: Lhs<'_>, b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = x86::binary(isa, dtype, op) {
        let n = dst.len() / dtype.size();
        let d = dst.as_mut_ptr();
        let a = match a {
            Lhs::Dst => d.cast_const(),
            Lhs::Buf(a) => a.as_ptr(),
        };
        // SAFETY: the caller checked that `dst`, `a` and `b` hold `n` elements of `dtype`
        // (`kernel` is the one for `dtype`) and that `isa` is supported; `a` is either exactly
        // `dst` or a separate shared borrow, and `b` is a shared borrow, so neither overlaps the
        // mutable `dst` except in the element-for-element in-place case the kernels allow.
        unsafe { kernel(d, a, b.as_ptr(), n) };
        return;
    }
    portable::binary(isa, dtype, op, dst, a, b)
}

/// `dst[i] = dst[i] op src[i]` with kernels of level `isa`.
///
/// # Panics
/// As [`crate::reduce_inplace`], and if `isa` is not supported by this CPU.
pub fn reduce_inplace_with(isa: Isa, dtype: DataType, op: ElemOp, dst: &mut [u8], src: &[u8]) {
    check_binary("reduce_inplace", dtype, dst.len(), src.len());
    check_isa("reduce_inplace", isa);
    binary(isa, dtype, op, dst, Lhs::Dst, src)
}

/// `dst[i] = a[i] op b[i]` with kernels of level `isa`.
///
/// # Panics
/// As [`crate::reduce`], and if `isa` is not supported by this CPU.
pub fn reduce_with(isa: Isa, dtype: DataType, op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    check_binary("reduce", dtype, dst.len(), a.len());
    check_binary("reduce", dtype, dst.len(), b.len());
    check_isa("reduce", isa);
    binary(isa, dtype, op, dst, Lhs::Buf(a), b)
}

/// The unary float kernels: multiply or divide by a constant.
#[derive(Clone, Copy, Debug)]
enum FloatUnary {
    Mul,
    Div,
}

/// Runs a hand-written unary kernel if there is one for `dtype`; returns whether it ran.
fn unary_x86(
    isa: Isa,
    dtype: DataType,
    kind: FloatUnary,
    dst: &mut [u8],
    src: Option<&[u8]>,
    c: f64,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = x86::unary(isa, dtype, kind) {
        let n = dst.len() / dtype.size();
        let d = dst.as_mut_ptr();
        let s = match src {
            None => d.cast_const(),
            Some(s) => s.as_ptr(),
        };
        // SAFETY: as in `binary`: `n` elements of `dtype` in `dst` and `src` (checked by the
        // caller), `isa` supported, `src` is `dst` itself or a separate shared borrow.
        unsafe { kernel(d, s, n, c) };
        return true;
    }
    let _ = (isa, dtype, kind, dst, src, c);
    false
}

/// `buf[i] *= factor` with kernels of level `isa`.
///
/// # Panics
/// As [`crate::scale`], and if `isa` is not supported by this CPU.
pub fn scale_with(isa: Isa, dtype: DataType, buf: &mut [u8], factor: f64) {
    check_unary("scale", dtype, buf.len());
    check_isa("scale", isa);
    if !unary_x86(isa, dtype, FloatUnary::Mul, buf, None, factor) {
        with_element!(dtype, T => {
            let f = T::factor(factor);
            portable::map(isa, buf, None, move |x: T| T::elem_mul(x, f))
        })
    }
}

/// `dst[i] = src[i] * factor` with kernels of level `isa`.
///
/// # Panics
/// As [`crate::scale_into`], and if `isa` is not supported by this CPU.
pub fn scale_into_with(isa: Isa, dtype: DataType, dst: &mut [u8], src: &[u8], factor: f64) {
    check_binary("scale_into", dtype, dst.len(), src.len());
    check_isa("scale_into", isa);
    if !unary_x86(isa, dtype, FloatUnary::Mul, dst, Some(src), factor) {
        with_element!(dtype, T => {
            let f = T::factor(factor);
            portable::map(isa, dst, Some(src), move |x: T| T::elem_mul(x, f))
        })
    }
}

/// `buf[i] /= n` with kernels of level `isa`.
///
/// # Panics
/// As [`crate::divide`], and if `isa` is not supported by this CPU.
pub fn divide_with(isa: Isa, dtype: DataType, buf: &mut [u8], n: u64) {
    check_unary("divide", dtype, buf.len());
    assert!(n > 0, "divide: the divisor n must be at least 1 (got 0)");
    check_isa("divide", isa);
    // The float kernels divide by `n` converted to the element's arithmetic type.
    let c = if dtype == DataType::Float64 {
        n as f64
    } else {
        f64::from(n as f32)
    };
    if !unary_x86(isa, dtype, FloatUnary::Div, buf, None, c) {
        with_element!(dtype, T => {
            let d = T::divisor(n);
            portable::map(isa, buf, None, move |x: T| T::elem_div(x, d))
        })
    }
}
