//! Test and benchmark tooling for ferroccl's transports, kept out of the contract crate.
//!
//! | item | what it is |
//! |---|---|
//! | [`Delayed`] | a wrapper adding a fixed one-way delay per message (`FERRO_LINK_DELAY_US`) |

pub mod delay;

pub use delay::Delayed;
