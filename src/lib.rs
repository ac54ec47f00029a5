//! ferroccl: collective communication for data-parallel training.

pub mod bootstrap;
pub mod coll;

pub use ferroccl_kernels::{DataType, ElemOp};
pub use ferroccl_transport::{Error, ErrorKind, Result};
