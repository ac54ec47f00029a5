//! ferroccl: collective communication for data-parallel training.
//!
//! | concept | item |
//! |---|---|
//! | a group of ranks running collectives together | [`Communicator`] |
//! | how ranks meet before they are connected | [`bootstrap`] (stores, [`bootstrap::UniqueId`], launcher environment) |
//! | an algorithm as plain data | [`coll`] ([`coll::Schedule`], [`coll::build`], [`coll::check`]) |
//! | element types and reductions | [`DataType`], [`ReduceOp`], [`Element`] |
//! | settings (`FERRO_*`) | [`Config`] |
//! | errors naming operation, rank and peer | [`Error`], [`ErrorKind`] |
//! | an operation running in the background | [`Work`] |
//! | sends and receives that run together | [`Group`] |
//! | host buffers that peers on the host read without a copy | [`SharedBuf`] |
//! | buffers on a GPU (or the host stand-in) for every collective | [`device`] ([`device::DeviceBuffer`], [`BufRef`], [`BufMut`]) |
//!
//! Ranks are usually processes started by a launcher (`ferrorun`, torchrun, srun, mpirun), each
//! calling [`Communicator::from_env`]. Here they are threads of one process:
//!
//! ```
//! use ferroccl::{Communicator, Config, ReduceOp};
//!
//! let comms = Communicator::local_group(3, Config::default()).unwrap();
//! std::thread::scope(|s| {
//!     for comm in &comms {
//!         s.spawn(move || {
//!             // Each rank holds a distinct gradient; after the allreduce all hold the mean.
//!             let mut grads = vec![comm.rank() as f32 * 3.0; 1000];
//!             comm.all_reduce_in_place(&mut grads, ReduceOp::Avg).unwrap();
//!             assert!(grads.iter().all(|&g| g == 3.0));
//!
//!             // Overlap: queue work on the progress thread, wait for it later.
//!             let work = comm.all_reduce_async(grads, ReduceOp::Sum).unwrap();
//!             let grads = work.wait().unwrap();
//!             assert!(grads.iter().all(|&g| g == 9.0));
//!
//!             // Every rank's block, in rank order.
//!             let mut all = vec![0u32; 3];
//!             comm.all_gather(&[comm.rank() as u32], &mut all).unwrap();
//!             assert_eq!(all, [0, 1, 2]);
//!         });
//!     }
//! });
//! ```

pub mod bootstrap;
#[cfg(feature = "capi")]
pub mod capi;
pub mod coll;
pub mod comm;
pub mod device;
mod exec;
pub mod plan;
pub mod profile;
mod reduce;
mod shared_buf;
pub mod sim;
pub mod topo;
pub mod trace;
mod wire;

pub use comm::{BufMut, BufRef, Communicator, Config, DeviceWindow, Group, ReduceOp, Window, Work};
pub use shared_buf::SharedBuf;

// The README's Rust examples compile as doctests (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

// So are docs/CUDA.md's (device buffers).
#[cfg(doctest)]
#[doc = include_str!("../docs/CUDA.md")]
pub struct CudaDocDoctests;
pub use ferroccl_kernels::{DataType, ElemOp, Element};
pub use ferroccl_transport::{Error, ErrorKind, Result};
