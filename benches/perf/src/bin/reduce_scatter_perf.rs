//! `reduce_scatter_perf`: nccl-tests-compatible reduce_scatter bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::ReduceScatter)
}
