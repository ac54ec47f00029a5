//! Test and benchmark tooling for ferroccl's transports, kept out of the contract crate.
//!
//! | item | what it is |
//! |---|---|
//! | [`conformance`] | the suite every transport runs: ordering, partial progress, sizes, closes, registration |
//! | [`drive`] | headers, distinct payloads, bounded waits, exchanges between two ends |
//! | [`Delayed`] | a wrapper adding a fixed one-way delay per message (`FERRO_LINK_DELAY_US`) |

pub mod conformance;
pub mod delay;
pub mod drive;

pub use delay::Delayed;
