//! `gather_perf`: nccl-tests-compatible gather bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::Gather)
}
