//! nccl-tests-compatible bandwidth tools for ferroccl: the library behind `all_reduce_perf`,
//! `all_gather_perf`, ... It speaks nccl-tests' language: the same flags
//! (`-b 8 -e 128M -f 2 -g 1`), the same table and the same bus-bandwidth formulas, so
//! numbers can be put beside NVIDIA's.
//!
//! | piece                 | what it does                                                    |
//! |-----------------------|-----------------------------------------------------------------|
//! | [`Args`]              | flags, defaults and errors (`args`)                             |
//! | [`sizes`]             | the size sweep and per-collective buffer rounding               |
//! | [`bw`]                | algbw and busbw per collective                                  |
//! | [`data`]              | inputs whose reductions are exact, expected outputs, `#wrong`   |
//! | [`report`]            | the header, rows and footer, character for character            |
//! | [`run_perf`]          | the driver, generic over [`PerfComm`]                           |
//! | [`local`]             | a reference [`PerfComm`] with ranks as threads                  |
//!
//! A tool is: parse the flags, build a communicator, wrap it in [`PerfComm`], call
//! [`run_perf`], exit with [`Summary::exit_code`]:
//!
//! ```no_run
//! use ferroccl_perf::{Args, Coll, run_perf, local::local_group};
//!
//! let coll = Coll::AllReduce;
//! let args = match Args::parse(std::env::args().skip(1)) {
//!     Ok(a) => a,
//!     Err(e) => {
//!         eprint!("{}", e.report(&coll.program_name()));
//!         std::process::exit(e.exit_code());
//!     }
//! };
//! let comm = local_group(1).remove(0); // a real tool builds a ferroccl communicator here
//! let summary = run_perf(&comm, coll, &args, &mut std::io::stdout()).unwrap();
//! std::process::exit(summary.exit_code());
//! ```
#![forbid(unsafe_code)]

pub mod args;
pub mod bw;
pub mod codec;
pub mod coll;
pub mod data;
pub mod document;
pub mod ferro;
pub mod json;
pub mod local;
pub mod report;
pub mod run;
pub mod sizes;

pub use args::{Args, ArgsError, Average, RootSel};
pub use coll::{Coll, Layout, PerfOp};
pub use report::{Measure, Row};
pub use run::{run_perf, PerfComm, Summary};
