//! The atomics the ring protocol uses, behind one name so that the same code runs under loom
//! (`RUSTFLAGS="--cfg loom"`), which explores every interleaving and memory ordering the model
//! allows, and over real shared memory otherwise.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
