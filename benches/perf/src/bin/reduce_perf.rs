//! `reduce_perf`: nccl-tests-compatible reduce bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::Reduce)
}
