//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod child;
pub mod conformance;
pub mod netns;
pub mod threads;
