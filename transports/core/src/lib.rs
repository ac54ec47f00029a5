//! ferroccl's transport contract.

mod error;

pub use error::{Error, ErrorKind, Result};
