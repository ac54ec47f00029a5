//! `scatter_perf`: nccl-tests-compatible scatter bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::Scatter)
}
