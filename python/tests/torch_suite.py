"""Runs PyTorch's own distributed test suite (``torch/testing/_internal/distributed/
distributed_test.py``, shipped in the torch wheel) against a backend, as PyTorch's
``test/distributed/test_distributed_spawn.py`` does: each test spawns WORLD_SIZE processes
that meet through a file:// store (forked here, where PyTorch spawns).

    BACKEND=ferroccl WORLD_SIZE=2 python tests/torch_suite.py              # every test
    BACKEND=gloo WORLD_SIZE=3 python tests/torch_suite.py -k all_reduce    # names containing
    python tests/torch_suite.py --subset ci                                 # the CI subset
    python tests/torch_suite.py --shard 1/4                                 # every 4th test
    FERRO_SUITE_AS=gloo python tests/torch_suite.py   # gloo's gates, ferroccl underneath

Prints one line per test and a summary (passed / skipped / failed, with the failures' first
error line); exits non-zero if a test failed.
"""

import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "ferroccl")
# FERRO_SUITE_AS=gloo: run the suite as if for gloo (its tests gated on the name "gloo" run
# too), with every gloo process group made on ferroccl instead.
AS_GLOO = os.environ.get("FERRO_SUITE_AS") == "gloo"
if AS_GLOO:
    os.environ["BACKEND"] = "gloo"
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="ferroccl-suite-")

import unittest  # noqa: E402

import torch  # noqa: E402

import ferroccl  # noqa: E402,F401  (registers the backend)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# The suite's own extension point for a third-party backend: the sets of backends that have a
# feature, read when distributed_test.py is imported. ferroccl is a plugin with CPU DDP and
# subgroups; "gpu" gates tests that run on CPU for gloo-class backends (a test that needs CUDA
# still skips without a GPU). It has no receive from any source.
if AS_GLOO:
    import torch.distributed as dist  # noqa: E402
    import torch.distributed.distributed_c10d as c10d  # noqa: E402

    def _swap(f):
        def wrapped(*a, **k):
            if k.get("backend") in ("gloo", dist.Backend.GLOO):
                k["backend"] = "ferroccl"
            elif a and a[0] in ("gloo", dist.Backend.GLOO) and f is c10d.init_process_group:
                a = ("ferroccl",) + a[1:]
            return f(*a, **k)

        return wrapped

    for _name in ("init_process_group", "new_group"):
        _f = _swap(getattr(c10d, _name))
        setattr(c10d, _name, _f)
        setattr(dist, _name, _f)
elif os.environ["BACKEND"] == "ferroccl":
    for feature in ("plugin", "ddp", "subgroup", "gpu"):
        DistTestCases.backend_feature[feature].add("ferroccl")
    DistTestCases.skip_collective["sendrecv anysource"].add("ferroccl")
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# The CI subset: every collective and point-to-point test (dtypes, groups, async, coalesced),
# the DDP tests on CPU, and barrier. Names are matched as substrings.
CI_SUBSET = (
    "test_all_reduce",
    "test_allreduce",
    "test_broadcast",
    "test_reduce_",
    "test_reduce_sum",
    "test_all_gather",
    "test_gather",
    "test_scatter",
    "test_all_to_all",
    "test_send_recv",
    "test_isend",
    "test_irecv",
    "test_batch_isend_irecv",
    "test_barrier",
    "test_DistributedDataParallel_SyncBatchNorm",
    "test_ddp_comm_hook",
    "test_ddp_hook",
    "test_DistributedDataParallelCPU",
    "test_new_subgroups",
    "test_backend_group",
    "test_backend_full_group",
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        # fork, not spawn: a child inherits the imported modules instead of importing torch and
        # the suite again (seconds per rank per test on a loaded machine). No rank of any test
        # has started a communicator in this parent process, so no thread is forked.
        self._start_processes(torch.multiprocessing.get_context("fork").Process)


class Result(unittest.TextTestResult):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.passed = []

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed.append(test)


def main():
    args = sys.argv[1:]
    names = unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn)
    pats, shard = [], None
    while args:
        a = args.pop(0)
        if a == "-k":
            pats.append(args.pop(0))
        elif a == "--subset":
            if args.pop(0) != "ci":
                sys.exit("--subset: only 'ci' is defined")
            pats.extend(CI_SUBSET)
        elif a == "--shard":
            i, n = (int(x) for x in args.pop(0).split("/"))
            shard = (i, n)
        else:
            names = [x for x in names if x == a]
    if pats:
        names = [x for x in names if any(p in x for p in pats)]
    if shard:
        names = names[shard[0] - 1 :: shard[1]]
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=Result, stream=sys.stdout)
    res = runner.run(suite)
    backend, world = os.environ["BACKEND"], os.environ["WORLD_SIZE"]
    if AS_GLOO:
        backend = "ferroccl (as gloo)"
    failed = res.failures + res.errors + [(t, "unexpected success") for t in res.unexpectedSuccesses]
    print(
        f"\nSUMMARY backend={backend} world_size={world}: {len(res.passed)} passed, "
        f"{len(res.skipped) + len(res.expectedFailures)} skipped, {len(failed)} failed "
        f"(of {res.testsRun})"
    )
    for t, err in failed:
        lines = [x for x in str(err).splitlines() if x.strip()]
        last = next((x for x in reversed(lines) if "Error" in x or "Exception" in x), lines[-1:] or [""])
        print(f"FAILED {t._testMethodName}: {str(last).strip()[:300]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
