//! `alltoall_perf`: nccl-tests-compatible alltoall bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::AllToAll)
}
