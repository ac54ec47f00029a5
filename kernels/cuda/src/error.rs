//! Errors of the CUDA layer.

use std::fmt;

/// What went wrong, coarsely, so callers can map it (a missing driver is the caller's setup,
/// a failing CUDA call is the device's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaErrorKind {
    /// The CUDA driver library (`libcuda.so.1`) could not be loaded: no NVIDIA driver here.
    DriverMissing,
    /// No NVRTC library could be loaded: install the NVRTC wheel (see `scripts/nvrtc-env.sh`).
    NvrtcMissing,
    /// NVRTC refused a kernel source; the message holds its log.
    Compile,
    /// A CUDA driver call failed; the message names the call and the CUDA error.
    Driver,
    /// An argument the CUDA layer cannot serve (device ordinal, sizes).
    Invalid,
}

/// An error of the CUDA layer: a kind and a message naming the call and the value involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    kind: CudaErrorKind,
    message: String,
}

impl CudaError {
    pub(crate) fn new(kind: CudaErrorKind, message: impl Into<String>) -> CudaError {
        CudaError {
            kind,
            message: message.into(),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> CudaErrorKind {
        self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CudaError {}

/// Result of the CUDA layer.
pub type Result<T> = std::result::Result<T, CudaError>;
