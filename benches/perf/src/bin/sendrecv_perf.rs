//! `sendrecv_perf`: nccl-tests-compatible sendrecv bandwidth tool for ferroccl.

fn main() {
    ferroccl_perf::ferro::tool_main(ferroccl_perf::Coll::SendRecv)
}
