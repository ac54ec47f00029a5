//! ferroccl's CUDA layer: reduction kernels written in CUDA C, compiled at run time with NVRTC,
//! and the CUDA driver loaded at run time, so nothing here needs a CUDA toolkit to build and a
//! machine without an NVIDIA driver gets an error, never a panic.
//!
//! | concept                                  | item                                              |
//! |------------------------------------------|---------------------------------------------------|
//! | kernel sources (CUDA C, host-compilable) | [`KERNEL_HEADER`] (`ferro_reduce.h`), [`KERNEL_SOURCE`] (`ferro_reduce.cu`) |
//! | one reduce-copy (N sources → M dests)    | [`RcArgs`], [`kernel_name`]                       |
//! | the element logic on the host            | [`host`] (the header built as C, for the tests)  |
//! | NVRTC (compile only, no GPU)             | [`nvrtc::Nvrtc`], [`nvrtc::compile_reduce_kernels`] |
//! | the driver, checked before every use     | [`driver::driver`], [`DRIVER_MISSING`]            |
//! | kernels on a device, on a stream         | [`device::DeviceKernels`]                         |
//! | stream waits on a host-mapped flag       | [`mem_ops::MemOps`]                               |
//!
//! # Example
//!
//! The host build runs the kernels' own loop, here `dst = a + b` on f32:
//!
//! ```
//! use ferroccl_cuda::{host, RcArgs};
//! use ferroccl_kernels::{DataType, ElemOp};
//!
//! let a = [1.0f32, 2.0, 3.0];
//! let b = [0.5f32, 0.25, -3.0];
//! let mut dst = [0.0f32; 3];
//! let args = RcArgs::new(
//!     &[a.as_ptr() as u64, b.as_ptr() as u64],
//!     &[dst.as_mut_ptr() as u64],
//!     3,
//! );
//! // SAFETY: three readable f32 in each source, three writable in the destination.
//! unsafe { host::reduce_copy(DataType::Float32, ElemOp::Sum, &args, 2) };
//! assert_eq!(dst, [1.5, 2.25, 0.0]);
//!
//! // Without an NVIDIA driver every device entry point says so.
//! if let Err(e) = ferroccl_cuda::driver::driver() {
//!     assert!(e.to_string().contains(ferroccl_cuda::DRIVER_MISSING));
//! }
//! ```

mod args;
pub mod check;
pub mod device;
mod dl;
pub mod driver;
mod error;
pub mod host;
pub mod mem_ops;
pub mod nvrtc;
pub mod user_objects;

pub use args::{divisor_bits, factor_bits, kernel_name, RcArgs, MAX_DSTS, MAX_SRCS};
pub use driver::DRIVER_MISSING;
pub use error::{CudaError, CudaErrorKind, Result};

/// `ferro_reduce.h`: the element logic of every dtype × op and the reduce-copy loop.
pub const KERNEL_HEADER: &str = include_str!("../ferro_reduce.h");

/// `ferro_reduce.cu`: one reduce-copy kernel per dtype × op.
pub const KERNEL_SOURCE: &str = include_str!("../ferro_reduce.cu");

/// The GPU architectures the kernels are checked to compile for (sm_70 .. sm_90).
pub const CHECKED_ARCHS: [u32; 5] = [70, 80, 86, 89, 90];
