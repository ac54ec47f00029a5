//! ferroccl's CPU reduction kernels: element-wise `sum`/`prod`/`max`/`min`, scaling and
//! averaging over byte buffers of any [`DataType`], with SIMD chosen at run time.
//!
//! | concept                      | item                                                          |
//! |------------------------------|---------------------------------------------------------------|
//! | element type of a buffer     | [`DataType`] (NCCL numbering), Rust type: [`Element`]         |
//! | element-wise operation       | [`ElemOp`]: sum, prod, max, min                               |
//! | combine two buffers          | [`reduce_inplace`] (`dst op= src`), [`reduce`] (`dst = a op b`) |
//! | pre-multiplied sum, average  | [`scale`], [`scale_into`], [`divide`]                         |
//! | fp8 element types            | [`Fp8E4M3`] (saturating, max 448), [`Fp8E5M2`] (max 57344)    |
//! | obviously-correct oracle     | [`reference`](mod@reference): same functions, one scalar element at a time   |
//! | instruction-set choice       | [`simd::isa`], [`simd::Isa`], `FERRO_KERNEL_ISA`              |
//!
//! Buffers are byte slices in native byte order, as they come from user tensors, network
//! staging buffers and arbitrary offsets: **they need not be aligned** for the element type.
//! Lengths must be equal (in bytes) and a multiple of [`DataType::size`], or the functions
//! panic; callers validate user input first and report a proper error.
//!
//! # Arithmetic (identical in the fast kernels and in [`reference`](mod@reference))
//!
//! - Integers: sum and prod wrap; max/min are the usual ones.
//! - Floats: max/min are IEEE 754-2019 `maximum`/`minimum`: a NaN operand makes the result NaN,
//!   and `-0 < +0`. f16, bf16 and fp8 are converted to f32, combined, and rounded back to
//!   nearest even, element by element. The fast kernels equal the reference bit for bit,
//!   except that when *both* operands are NaN which payload survives is left to the hardware.
//! - [`scale`] / [`scale_into`] (NCCL's pre-multiplied sum, whose scalar has the buffer's type):
//!   integers multiply (wrapping) by the factor rounded toward zero, `factor as i64`, then
//!   wrapped into the element type; f32 multiplies by `factor as f32`, f64 by `factor`, and
//!   16/8-bit floats multiply in f32 by `factor as f32` and round back.
//! - [`divide`] (average): integers divide truncating toward zero; f32 and the 16/8-bit floats
//!   divide in f32 by `n as f32`, f64 by `n as f64`.
//!
//! # Example
//!
//! ```
//! use ferroccl_kernels::{as_bytes, as_bytes_mut, divide, reduce_inplace, DataType, ElemOp};
//!
//! // Two ranks' gradients; average them in place in `acc`.
//! let mut acc = [1.0f32, 2.0, 3.0, 4.0, 5.0];
//! let other = [3.0f32, 4.0, 5.0, 6.0, 7.0];
//! reduce_inplace(DataType::Float32, ElemOp::Sum, as_bytes_mut(&mut acc), as_bytes(&other));
//! divide(DataType::Float32, as_bytes_mut(&mut acc), 2);
//! assert_eq!(acc, [2.0, 3.0, 4.0, 5.0, 6.0]);
//!
//! // Unaligned byte buffers work too: here i32 elements start at byte offset 1.
//! let mut staging = vec![0u8; 1 + 8];
//! staging[1..5].copy_from_slice(&7i32.to_ne_bytes());
//! staging[5..9].copy_from_slice(&(-9i32).to_ne_bytes());
//! let src: Vec<u8> = [5i32, 4].iter().flat_map(|v| v.to_ne_bytes()).collect();
//! reduce_inplace(DataType::Int32, ElemOp::Max, &mut staging[1..], &src);
//! assert_eq!(staging[1..5], 7i32.to_ne_bytes());
//! assert_eq!(staging[5..9], 4i32.to_ne_bytes());
//! ```

mod element;
mod fp8;
pub mod reference;
pub mod simd;
pub mod types;

pub use element::{as_bytes, as_bytes_mut, from_bytes, from_bytes_mut, Element};
pub use fp8::{Fp8E4M3, Fp8E5M2};
pub use types::{DataType, ElemOp};

/// Panics unless two buffers of `dtype` have the same byte length, a multiple of the element size.
#[track_caller]
pub(crate) fn check_binary(what: &str, dtype: DataType, dst_len: usize, src_len: usize) {
    assert!(
        dst_len == src_len,
        "{what}: buffer lengths differ: destination has {dst_len} bytes, source has {src_len} bytes \
         (dtype {dtype})"
    );
    check_unary(what, dtype, dst_len);
}

/// Panics unless `len` bytes is a whole number of `dtype` elements.
#[track_caller]
pub(crate) fn check_unary(what: &str, dtype: DataType, len: usize) {
    assert!(
        len.is_multiple_of(dtype.size()),
        "{what}: buffer length {len} bytes is not a multiple of the {dtype} element size {}",
        dtype.size()
    );
}

/// `dst[i] = dst[i] op src[i]` over byte buffers holding `dtype` elements (any alignment).
///
/// # Panics
/// If the lengths differ or are not a multiple of `dtype.size()` (callers check first).
pub fn reduce_inplace(dtype: DataType, op: ElemOp, dst: &mut [u8], src: &[u8]) {
    simd::reduce_inplace_with(simd::isa(), dtype, op, dst, src)
}

/// `dst[i] = a[i] op b[i]` (any alignment).
///
/// # Panics
/// If the lengths differ or are not a multiple of `dtype.size()`.
pub fn reduce(dtype: DataType, op: ElemOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    simd::reduce_with(simd::isa(), dtype, op, dst, a, b)
}

/// `buf[i] = buf[i] * factor` (pre-multiplied sum); see the crate docs for how `factor` is
/// converted per dtype (integers: rounded toward zero).
///
/// # Panics
/// If the length is not a multiple of `dtype.size()`.
pub fn scale(dtype: DataType, buf: &mut [u8], factor: f64) {
    simd::scale_with(simd::isa(), dtype, buf, factor)
}

/// `dst[i] = src[i] * factor`; conversion of `factor` as in [`scale`].
///
/// # Panics
/// If the lengths differ or are not a multiple of `dtype.size()`.
pub fn scale_into(dtype: DataType, dst: &mut [u8], src: &[u8], factor: f64) {
    simd::scale_into_with(simd::isa(), dtype, dst, src, factor)
}

/// `buf[i] = buf[i] / n` (average over `n` ranks): integer division truncates toward zero,
/// floats divide in f32 (f64 for f64).
///
/// # Panics
/// If the length is not a multiple of `dtype.size()`, or if `n == 0`.
pub fn divide(dtype: DataType, buf: &mut [u8], n: u64) {
    simd::divide_with(simd::isa(), dtype, buf, n)
}
