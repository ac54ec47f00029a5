//! ferroccl: collective communication for data-parallel training.

pub mod bootstrap;
pub mod coll;
pub mod comm;
mod exec;

pub use comm::{Communicator, Config, Group, ReduceOp, Work};
pub use ferroccl_kernels::{DataType, ElemOp, Element};
pub use ferroccl_transport::{Error, ErrorKind, Result};
