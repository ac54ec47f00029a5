//! `ferrorun`: starts the ranks of one job on this machine, optionally spread over network
//! namespaces that stand in for hosts.
//!
//! | piece            | what it does                                                          |
//! |------------------|-----------------------------------------------------------------------|
//! | [`args`]         | command line → [`args::LaunchConfig`]                                 |
//! | [`placement`]    | rank → host (namespace), local rank, and the `FERRO_*` environment    |
//! | [`store_addr`]   | where rank 0 will host the rendezvous store                           |
//! | [`supervise`]    | spawn, forward output line by line, stop everything on the first failure |
//!
//! Every rank gets `FERRO_RANK`, `FERRO_NRANKS`, `FERRO_LOCAL_RANK`, `FERRO_LOCAL_NRANKS`,
//! `FERRO_STORE_ADDR` (`ip:port`) and `FERRO_JOB_ID`; with `--netns`, also `FERRO_HOST` (the
//! namespace name). This launcher is for development and tests; clusters use their own.

pub mod args;
pub mod placement;
pub mod store_addr;
pub mod supervise;
