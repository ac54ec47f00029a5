//! Plain scalar versions of every kernel: one element at a time, no SIMD, no tricks.
//!
//! They define the results the fast kernels must reproduce bit for bit (see the crate docs for
//! the per-type rules) and serve as the oracle in tests. Signatures and panics match the
//! crate-level functions.

#![forbid(unsafe_code)]

use crate::element::{load, store, with_element, Arith};
use crate::{check_binary, check_unary, DataType, ElemOp};

/// `a op b` for one element.
fn apply<T: Arith>(op: ElemOp, a: T, b: T) -> T {
    match op {
        ElemOp::Sum => T::elem_sum(a, b),
        ElemOp::Prod => T::elem_prod(a, b),
        ElemOp::Max => T::elem_max(a, b),
        ElemOp::Min => T::elem_min(a, b),
    }
}

/// `dst[i] = dst[i] op src[i]`; see [`crate::reduce_inplace`].
pub fn reduce_inplace(dtype: DataType, op: ElemOp, dst: &mut [u8], src: &[u8]) {
    check_binary("reduce_inplace", dtype, dst.len(), src.len());
    with_element!(dtype, T => {
        let n = std::mem::size_of::<T>();
        for (d, s) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
            let v = apply::<T>(op, load(d), load(s));
            store(d, v);
        }
    })
}

/// `dst[i] = a[i] op b[i]`; see [`crate::reduce`].
pub fn reduce(dtype: DataType, op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    check_binary("reduce", dtype, dst.len(), a.len());
    check_binary("reduce", dtype, dst.len(), b.len());
    with_element!(dtype, T => {
        let n = std::mem::size_of::<T>();
        for ((d, x), y) in dst.chunks_exact_mut(n).zip(a.chunks_exact(n)).zip(b.chunks_exact(n)) {
            store(d, apply::<T>(op, load(x), load(y)));
        }
    })
}

/// `buf[i] *= factor`; see [`crate::scale`].
pub fn scale(dtype: DataType, buf: &mut [u8], factor: f64) {
    check_unary("scale", dtype, buf.len());
    with_element!(dtype, T => {
        let f = T::factor(factor);
        for d in buf.chunks_exact_mut(std::mem::size_of::<T>()) {
            let v = T::elem_mul(load(d), f);
            store(d, v);
        }
    })
}

/// `dst[i] = src[i] * factor`; see [`crate::scale_into`].
pub fn scale_into(dtype: DataType, dst: &mut [u8], src: &[u8], factor: f64) {
    check_binary("scale_into", dtype, dst.len(), src.len());
    with_element!(dtype, T => {
        let f = T::factor(factor);
        let n = std::mem::size_of::<T>();
        for (d, s) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
            store(d, T::elem_mul(load(s), f));
        }
    })
}

/// `buf[i] /= n`; see [`crate::divide`].
pub fn divide(dtype: DataType, buf: &mut [u8], n: u64) {
    check_unary("divide", dtype, buf.len());
    assert!(n > 0, "divide: the divisor n must be at least 1 (got 0)");
    with_element!(dtype, T => {
        let d = T::divisor(n);
        for e in buf.chunks_exact_mut(std::mem::size_of::<T>()) {
            let v = T::elem_div(load(e), d);
            store(e, v);
        }
    })
}
