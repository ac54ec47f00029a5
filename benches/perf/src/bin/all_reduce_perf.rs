//! `all_reduce_perf`: nccl-tests-compatible all_reduce bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::AllReduce)
}
