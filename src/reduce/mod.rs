//! Reduction as its own axis: every element-wise step the executor and the communicator take.
//!
//! | step                 | [`Reducer`] method           | used for                              |
//! |----------------------|------------------------------|---------------------------------------|
//! | `dst = a op b`       | [`Reducer::reduce`]          | receive-reduce out of place            |
//! | `dst = dst op src`   | [`Reducer::reduce_inplace`]  | receive-reduce in place                |
//! | `dst = src * factor` | [`Reducer::scale_into`]      | pre-multiplied sums (`PreMulSum`)      |
//! | `buf = buf / n`      | [`Reducer::divide`]          | `Avg`'s divide by the number of ranks  |
//! | `dst = src`          | [`Reducer::copy`]            | a schedule's local copies              |
//!
//! Operands are typed memory ([`Payload`] / [`PayloadMut`]: host slices, or a device
//! [`ferroccl_transport::MemRef`]), so that each implementation says which [`MemSpace`]s it
//! serves and rejects the others with an error rather than touching memory it cannot reach.
//! [`HostReducer`] runs the host SIMD kernels of `ferroccl-kernels`; `CudaReducer` (cuda.rs)
//! runs the NVRTC-compiled kernels of `ferroccl-cuda` on device memory. The executor and the communicator call kernels only through a reducer.

mod cuda;
mod host;

use std::fmt;

use ferroccl_kernels::{DataType, ElemOp};
use ferroccl_transport::{MemSpace, Payload, PayloadMut, Result};

pub(crate) use cuda::CudaReducer;
pub(crate) use host::HostReducer;

/// Element-wise steps on typed memory. Every method checks that its operands lie in a space it
/// serves ([`Reducer::serves`]) and have the lengths the step needs, and returns an error
/// otherwise; none of them blocks on a peer.
pub(crate) trait Reducer: Send + Sync + fmt::Debug {
    /// Name for errors and logs (`host`, `cuda`).
    fn name(&self) -> &'static str;

    /// Whether operands in `space` may be handed to this reducer.
    fn serves(&self, space: MemSpace) -> bool;

    /// `dst[i] = a[i] op b[i]`; all three the same length, a multiple of the element size.
    fn reduce(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        a: Payload<'_>,
        b: Payload<'_>,
    ) -> Result<()>;

    /// `dst[i] = dst[i] op src[i]`.
    fn reduce_inplace(
        &self,
        dtype: DataType,
        op: ElemOp,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
    ) -> Result<()>;

    /// `dst[i] = src[i] * factor` (pre-multiplied sums; integers round the factor toward zero).
    fn scale_into(
        &self,
        dtype: DataType,
        dst: PayloadMut<'_>,
        src: Payload<'_>,
        factor: f64,
    ) -> Result<()>;

    /// `buf[i] = buf[i] / n` (`Avg` over `n` ranks; integers truncate toward zero).
    fn divide(&self, dtype: DataType, buf: PayloadMut<'_>, n: u64) -> Result<()>;

    /// `dst = src`, same length.
    fn copy(&self, dst: PayloadMut<'_>, src: Payload<'_>) -> Result<()>;
}
