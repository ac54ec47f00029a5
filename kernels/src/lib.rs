//! ferroccl's CPU reduction kernels.
//!
//! (stub: the element trait, fp8 types, scalar reference and SIMD kernels are being written)

pub mod types;

pub use types::{DataType, ElemOp};

/// `dst[i] = dst[i] op src[i]` over byte buffers holding `dtype` elements.
///
/// # Panics
/// If the lengths differ or are not a multiple of `dtype.size()` (callers check first).
pub fn reduce_inplace(dtype: DataType, op: ElemOp, dst: &mut [u8], src: &[u8]) {
    let _ = (dtype, op, dst, src);
    unimplemented!()
}

/// `dst[i] = a[i] op b[i]`.
///
/// # Panics
/// If the lengths differ or are not a multiple of `dtype.size()`.
pub fn reduce(dtype: DataType, op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    let _ = (dtype, op, dst, a, b);
    unimplemented!()
}

/// `buf[i] = buf[i] * factor` (pre-multiplied sum).
pub fn scale(dtype: DataType, buf: &mut [u8], factor: f64) {
    let _ = (dtype, buf, factor);
    unimplemented!()
}

/// `dst[i] = src[i] * factor`.
pub fn scale_into(dtype: DataType, dst: &mut [u8], src: &[u8], factor: f64) {
    let _ = (dtype, dst, src, factor);
    unimplemented!()
}

/// `buf[i] = buf[i] / n` (average).
pub fn divide(dtype: DataType, buf: &mut [u8], n: u64) {
    let _ = (dtype, buf, n);
    unimplemented!()
}
