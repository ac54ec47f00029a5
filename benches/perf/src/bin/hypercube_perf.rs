//! `hypercube_perf`: nccl-tests-compatible hypercube bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::HyperCube)
}
