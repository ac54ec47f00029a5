//! NCCL's C API (`include/nccl.h`, NCCL 2.32: every function of NVIDIA's 2.32.3 header),
//! exported from the shared library `libnccl.so.2` that
//! `scripts/build-capi.sh` builds (cargo feature `capi`). Programs written against NVIDIA's
//! header compile, link and run against it on host memory.
//!
//! Build: `scripts/build-capi.sh` (`cargo rustc -p ferroccl --release --features capi --lib
//! --crate-type cdylib -- -C link-arg=-Wl,-soname,libnccl.so.2`, then a copy to `libnccl.so.2`).
//!
//! | piece | where |
//! |---|---|
//! | C types, enum values, `ncclConfig_t` | [`types`] |
//! | every exported `ncclX` and `pncclX` | [`api`] |
//! | result codes, last error, panic guard | [`error`] |
//! | `NCCL_*` environment variables | [`env`] |
//! | groups (`ncclGroupStart`/`End`) | `group` |
//! | communicator handles, non-blocking work | `comm` |
//! | per-call `nccl*Config` collectives | `coll_config` |
//! | scalable init, grow, shrink, revoke, suspend, per-communicator ids | `life` |
//! | memory windows | `window` |
//! | `ncclGroupSimulateEnd` | `simulate` |
//! | `ncclParam*` | `param` |
//! | non-NULL streams (device buffers), `ncclMemAlloc`, device binding at init | `stream` |
//! | stream-ordered completion of calls with a stream (a queue per communicator) | `device::stream_queue` |
//! | ferroccl's additions (`include/ferroccl.h`): host memory in shared memory | `shared` |
//! | what is refused with a reason (device signals, encryption keys) | `unsupported` |
//!
//! Semantics on host memory:
//! - A NULL stream means host buffers; a call on a blocking communicator completes before it
//!   returns. A non-NULL stream means device buffers of the communicator's device: the call
//!   returns at once and completes in stream order (it starts after the stream's earlier work,
//!   and later work on the stream waits for it; see `stream`). Collectives run staged on the
//!   device; sends, receives, gather and scatter go through host copies of the buffers.
//! - Non-blocking communicators (`config.blocking = 0`) return `ncclInProgress` and run their
//!   work on a background thread; `ncclCommGetAsyncError` reports `ncclInProgress` until it is
//!   done, then `ncclSuccess` or the error.
//! - Groups nest per thread; the outermost `ncclGroupEnd` runs what was queued, each
//!   communicator on its own thread, sends and receives of one communicator together.
//! - Every entry point checks its arguments as NCCL does (the last-error string names the
//!   argument and its value), catches panics (`ncclInternalError`), and maps ferroccl's
//!   error kinds to `ncclResult_t` in [`error::result_of`]; a deadline that passes while
//!   waiting for a peer is `ncclTimeout`, a peer that failed or left `ncclRemoteError`.
//! - Communicator handles are looked up in a table, never dereferenced: a stale or made-up
//!   handle is `ncclInvalidArgument`, not a crash.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

/// Defines `ncclX` and its alias `pncclX` with the same signature.
macro_rules! nccl_api {
    ($(#[doc = $doc:literal])* fn $name:ident / $pname:ident ( $($a:ident : $t:ty),* $(,)? ) -> $r:ty $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments follow NCCL's contract for this call: NULL only where NCCL allows
        /// it, otherwise pointing to memory of the size the other arguments imply, kept valid
        /// (and, for buffers an operation writes, unused by the caller) until the operation
        /// completes.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r $body

        #[doc = concat!("`", stringify!($pname), "`: the profiling alias of [`", stringify!($name), "`].")]
        ///
        /// # Safety
        #[doc = concat!("As for [`", stringify!($name), "`].")]
        #[no_mangle]
        pub unsafe extern "C" fn $pname($($a: $t),*) -> $r {
            // SAFETY: the same contract as the function it aliases, which the caller upholds.
            unsafe { $name($($a),*) }
        }
    };
    ($(#[doc = $doc:literal])* fn $name:ident / $pname:ident ( $($a:ident : $t:ty),* $(,)? ) $body:block) => {
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments follow NCCL's contract for this call.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) $body

        #[doc = concat!("`", stringify!($pname), "`: the profiling alias of [`", stringify!($name), "`].")]
        ///
        /// # Safety
        #[doc = concat!("As for [`", stringify!($name), "`].")]
        #[no_mangle]
        pub unsafe extern "C" fn $pname($($a: $t),*) {
            // SAFETY: the same contract as the function it aliases, which the caller upholds.
            unsafe { $name($($a),*) }
        }
    };
}

pub mod api;
mod capture;
mod coll_config;
mod colls;
mod comm;
pub mod env;
pub mod error;
mod group;
mod life;
mod ops;
mod param;
mod run;
mod shared;
mod simulate;
mod slices;
mod stream;
pub mod types;
mod unsupported;
mod window;

pub use api::*;
pub use coll_config::*;
pub use colls::*;
pub use comm::{live_count, read_config, CommOptions};
pub use life::*;
pub use param::*;
pub use simulate::*;
pub use stream::*;
pub use types::*;
pub use unsupported::*;
pub use window::*;
