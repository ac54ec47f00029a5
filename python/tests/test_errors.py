"""Bad input becomes a Python exception with a clear message: no hang, no crash.

Each case runs in fresh processes with a short deadline; a rank passes when the expected
exception (a ``ferroccl.Error``, which is a ``RuntimeError``) is raised with the expected
words in its message.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

import ferroccl  # noqa: E402


def expect(f, *words):
    try:
        f()
    except ferroccl.Error as e:
        msg = str(e)
        for w in words:
            if w not in msg:
                raise AssertionError(f"message {msg!r} lacks {w!r}") from e
        return msg
    raise AssertionError("no exception")


def non_contiguous(rank, world):
    t = torch.arange(12.0).view(3, 4).t()
    expect(lambda: dist.all_reduce(t), "not contiguous", f"rank {rank}")
    # The communicator is still usable: the check ran before anything was sent.
    u = torch.ones(3)
    dist.all_reduce(u)
    assert torch.equal(u, torch.full((3,), float(world)))


def unsupported_dtype(rank, world):
    t = torch.zeros(4, dtype=torch.complex128).real.clone().to(torch.uint16) if hasattr(
        torch, "uint16"
    ) else None
    if t is not None:
        expect(lambda: dist.all_reduce(t), "unsupported dtype", "uint16")
    s = torch.ones(4, dtype=torch.float32)
    expect(lambda: dist.all_reduce(s, op=dist.ReduceOp.BXOR), "unsupported reduce op")
    b = torch.ones(4, dtype=torch.bool)
    expect(lambda: dist.all_reduce(b, op=dist.ReduceOp.AVG), "bool")


def mismatched_sizes(rank, world):
    t = torch.ones(5 + rank)
    start = time.monotonic()
    msg = expect(lambda: dist.all_reduce(t))
    assert time.monotonic() - start < 30, "took too long"
    assert "all_reduce" in msg, msg
    # Every later call fails with the same error rather than hanging.
    expect(lambda: dist.all_reduce(torch.ones(2)))


def wrong_output_size(rank, world):
    o = torch.empty(world * 3 + 1)
    msg = expect(lambda: dist.all_gather_into_tensor(o, torch.ones(3)))
    assert "all_gather" in msg, msg


def dead_peer(rank, world):
    dist.barrier()
    if rank == world - 1:
        os._exit(0)  # dies without a word
    start = time.monotonic()
    msg = expect(lambda: dist.all_reduce(torch.ones(1 << 16)))
    took = time.monotonic() - start
    assert took < 20, f"took {took:.1f} s"
    assert f"rank {world - 1}" in msg, msg


def wait_timeout(rank, world):
    # Large enough to run on the worker thread (a small one completes before the call returns).
    n = (ferroccl.backend.INLINE_MAX_BYTES // 4) + 1
    if rank == 0:
        w = dist.all_reduce(torch.ones(n), async_op=True)
        # Rank 1 joins late: a short wait() times out with an exception, a long one succeeds.
        expect(lambda: w.wait(datetime.timedelta(milliseconds=50)), "did not complete")
        time.sleep(0.5)
        w.wait()
    else:
        time.sleep(0.5)
        dist.all_reduce(torch.ones(n))


def deadline(rank, world):
    # init_process_group(timeout=2 s) is ferroccl's deadline: rank 1 comes 4 s late.
    if rank == 1:
        time.sleep(4)
    start = time.monotonic()
    if rank == 0:
        msg = expect(lambda: dist.all_reduce(torch.ones(4)))
        took = time.monotonic() - start
        assert "timeout" in msg and "no progress for 2.0 s" in msg, msg
        assert 1.5 < took < 3.9, f"failed after {took:.1f} s"
    else:
        # Rank 0's half of this exchange may already wait in the shared-memory ring, so the
        # late rank can finish it; the communicator has failed all the same.
        try:
            dist.all_reduce(torch.ones(4))
        except ferroccl.Error:
            pass
    start = time.monotonic()
    expect(lambda: dist.all_reduce(torch.ones(4)))
    assert time.monotonic() - start < 3.9


def run_dead_peer():
    # The dead rank's exit code is 0; the survivors must raise and exit 0 too.
    harness.spawn(dead_peer, 3, timeout_s=10)


def main():
    res = harness.Results()
    res.run("non-contiguous tensor", harness.spawn, non_contiguous, 2, timeout_s=10)
    res.run("unsupported dtype and op", harness.spawn, unsupported_dtype, 2, timeout_s=10)
    res.run("sizes differ across ranks", harness.spawn, mismatched_sizes, 3, timeout_s=10)
    res.run("output size wrong", harness.spawn, wrong_output_size, 2, timeout_s=10)
    res.run("wait(timeout)", harness.spawn, wait_timeout, 2, timeout_s=10)
    res.run("dead peer", run_dead_peer)
    res.run("init_process_group(timeout=...) is the deadline", harness.spawn, deadline, 2, timeout_s=2)
    res.finish("test_errors")


if __name__ == "__main__":
    main()
