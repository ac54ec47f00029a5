"""Small operations that run on the calling thread (nothing queued) against the worker thread:
the returned work is already complete, its future and exception behave as for a queued
operation, and issue order holds when small and large operations interleave.

Small means at most ``ferroccl.backend.INLINE_MAX_BYTES`` (256 KiB unless
``FERRO_PY_INLINE_BYTES`` says otherwise); the large messages here are 1 MiB and more.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

import ferroccl  # noqa: E402
from ferroccl.backend import INLINE_MAX_BYTES  # noqa: E402

BIG = (INLINE_MAX_BYTES // 8) + 4099  # float64 elements: over the limit


def inline_future(rank, world):
    s = world * (world + 1) / 2
    t = torch.arange(5, dtype=torch.float64) * (rank + 1) + rank
    want = torch.arange(5, dtype=torch.float64) * s + (s - world)
    w = dist.all_reduce(t, async_op=True)
    # Small with nothing queued: complete when the call returns.
    assert w.is_completed(), "a small all_reduce was not complete on return"
    assert torch.equal(t, want), (t, want)
    fut = w.get_future()
    assert fut.done()
    assert torch.equal(fut.value()[0], want)
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert torch.equal(doubled.wait(), want * 2)
    assert w.wait() is True
    # A second future of the same work completes too.
    assert torch.equal(w.get_future().wait()[0], want)
    # Other collectives and the barrier take the same path.
    b = torch.full((3,), float(rank), dtype=torch.int32)
    wb = dist.broadcast(b, src=world - 1, async_op=True)
    assert wb.is_completed() and torch.equal(b, torch.full((3,), world - 1, dtype=torch.int32))
    assert dist.barrier(async_op=True).is_completed()
    # A large one goes to the worker and still completes, future included.
    x = torch.full((BIG,), float(rank + 1), dtype=torch.float64)
    wx = dist.all_reduce(x, async_op=True)
    assert torch.equal(wx.get_future().wait()[0], torch.full((BIG,), s, dtype=torch.float64))


def interleave(rank, world):
    s = world * (world + 1) / 2
    gen = torch.Generator().manual_seed(11)  # the same sequence on every rank
    done, cases = [], []
    for i in range(60):
        big = bool(torch.randint(0, 3, (1,), generator=gen).item() == 0)
        n = BIG + i if big else 1 + 3 * i
        t = torch.arange(n, dtype=torch.float64) * (rank + 1) + i
        want = torch.arange(n, dtype=torch.float64) * s + i * world
        w = dist.all_reduce(t, async_op=True)
        now = w.is_completed()
        w.get_future().then(lambda f, i=i: done.append(i))
        cases.append((i, big, now, w, t, want))
        if i % 10 == 9:
            # Drain the queue now and then, so that later small operations can run inline.
            w.wait()
            time.sleep(0.01)
    # The same tensor: a large sum queued, then a small product of its head. Run out of order
    # the head would be (sum of ranks + 1) ... not the sum raised to the world size.
    x = torch.full((BIG,), float(rank + 1), dtype=torch.float64)
    w1 = dist.all_reduce(x, async_op=True)
    w2 = dist.all_reduce(x[:8], op=dist.ReduceOp.PRODUCT, async_op=True)
    w1.wait()
    w2.wait()
    for i, big, _, w, t, want in cases:
        w.wait()
        assert torch.equal(t, want), f"operation {i} ({'large' if big else 'small'}) wrong"
    head = torch.full((8,), s**world, dtype=torch.float64)
    assert torch.equal(x[:8], head), (x[:8], head)
    assert torch.equal(x[8:], torch.full((BIG - 8,), s, dtype=torch.float64))
    # Works complete in issue order (a small one behind a large one waits for it).
    assert done == list(range(60)), done
    # Both paths were taken: some small operations complete on return, others (behind a large
    # one) were queued.
    small = [now for _, big, now, _, _, _ in cases if not big]
    assert any(small) and not all(small), small


def broadcast_interleave(rank, world):
    # A root's large broadcast queued, then a small one: the small one must not overtake it on
    # any rank (it waits behind the large one, never runs on the calling thread meanwhile).
    for i in range(30):
        root = i % world
        big = torch.full((BIG,), float(rank + i), dtype=torch.float64)
        small = torch.full((20,), rank + i, dtype=torch.int64)
        w1 = dist.broadcast(big, root, async_op=True)
        w2 = dist.broadcast(small, root, async_op=True)
        assert not (w2.is_completed() and not w1.is_completed()), f"step {i}: out of order"
        w1.wait()
        w2.wait()
        assert torch.equal(big, torch.full((BIG,), float(root + i), dtype=torch.float64)), i
        assert torch.equal(small, torch.full((20,), root + i, dtype=torch.int64)), i


def callbacks(rank, world):
    # Operations issued from a callback on the worker thread (a future's then(), as DDP's
    # communication hooks chain them) run right after the operation whose callback issued
    # them, on every rank alike, and can be waited for there. Rank 0 chains on a large
    # all_reduce that cannot end before the other ranks issue theirs, which they do only once
    # rank 0 has queued the next operation too, so its callback runs on the worker with that
    # operation queued behind it. The other ranks issue the same calls in the order the
    # callback gives them, from their own thread.
    store = dist.distributed_c10d._get_default_store()
    s = world * (world + 1) / 2
    a = torch.full((BIG,), float(rank + 1), dtype=torch.float64)
    # b and c have the same shape: run in the wrong order, their values would swap silently.
    b = torch.full((BIG,), float(10 * (rank + 1)), dtype=torch.float64)
    c = torch.full((BIG,), float(100 * (rank + 1)), dtype=torch.float64)
    d = torch.arange(7, dtype=torch.float64) + rank
    if rank == 0:

        def chained(f):
            dist.all_reduce(c)  # waits: runs on this thread now
            wd = dist.all_reduce(d, async_op=True)
            assert wd.is_completed(), "a small call from a callback did not run at once"
            return c

        wa = dist.all_reduce(a, async_op=True)
        fut = wa.get_future().then(chained)
        wb = dist.all_reduce(b, async_op=True)
        store.set("ferroccl-test/chained", "set")
        assert torch.equal(fut.wait(), torch.full((BIG,), 100 * s, dtype=torch.float64))
        wb.wait()
    else:
        store.wait(["ferroccl-test/chained"])
        dist.all_reduce(a)
        dist.all_reduce(c)
        dist.all_reduce(d)
        dist.all_reduce(b)
    assert torch.equal(a, torch.full((BIG,), s, dtype=torch.float64)), "a"
    assert torch.equal(b, torch.full((BIG,), 10 * s, dtype=torch.float64)), "b: order broken"
    assert torch.equal(c, torch.full((BIG,), 100 * s, dtype=torch.float64)), "c: order broken"
    want = (torch.arange(7, dtype=torch.float64) * world) + (world - 1) * world / 2
    assert torch.equal(d, want), "d"
    # A callback waiting for an operation queued behind it is told, not left to wait forever.
    dist.barrier()
    x = torch.full((BIG,), float(rank), dtype=torch.float64)
    y = torch.full((BIG,), float(rank), dtype=torch.float64)
    if rank == 0:
        wx = dist.all_reduce(x, async_op=True)
        wy = dist.all_reduce(y, async_op=True)
        fut = wx.get_future().then(lambda f: wy.wait())
        store.set("ferroccl-test/behind", "set")
        try:
            fut.wait()
        except RuntimeError as e:
            assert "would wait for itself" in str(e) and "rank 0" in str(e), e
        else:
            raise AssertionError("a wait for an operation queued behind its callback returned")
        wy.wait()
    else:
        store.wait(["ferroccl-test/behind"])
        dist.all_reduce(x)
        dist.all_reduce(y)
    half = float(world * (world - 1) // 2)
    assert torch.equal(y, torch.full((BIG,), half, dtype=torch.float64)), "y"


def inline_error(rank, world):
    # Sizes that differ across ranks fail the small operation while it runs on this thread:
    # the call returns a completed work holding the error, as a queued operation would.
    t = torch.ones(5 + rank)
    w = dist.all_reduce(t, async_op=True)
    assert w.is_completed()
    try:
        w.wait()
    except ferroccl.Error as e:
        assert "all_reduce" in str(e), e
    else:
        raise AssertionError("wait() raised nothing")
    try:
        w.get_future().wait()
    except RuntimeError as e:
        assert "all_reduce" in str(e), e
    else:
        raise AssertionError("the future held no exception")


def main():
    res = harness.Results()
    for world in (2, 3):
        res.run(f"inline work, future, then [{world}]", harness.spawn, inline_future, world)
        res.run(f"small and large interleaved, issue order [{world}]", harness.spawn, interleave, world)
        res.run(f"large then small broadcast, issue order [{world}]", harness.spawn, broadcast_interleave, world)
    for world in (2, 3):
        res.run(f"operations issued and waited in callbacks [{world}]", harness.spawn, callbacks, world, timeout_s=60)
    res.run("inline error in the work and its future [3]", harness.spawn, inline_error, 3, timeout_s=10)
    res.finish("test_inline")


if __name__ == "__main__":
    main()
