//! Shared code of the perf tools.
