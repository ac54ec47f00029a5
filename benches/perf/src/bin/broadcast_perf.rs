//! `broadcast_perf`: nccl-tests-compatible broadcast bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::Broadcast)
}
