//! Helpers shared by the integration tests.
#![allow(dead_code)]

#[cfg(feature = "capi")]
pub mod capi;
pub mod child;
pub mod conformance;
pub mod netns;
pub mod stream_round;
pub mod threads;
