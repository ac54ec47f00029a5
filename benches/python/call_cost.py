#!/usr/bin/env python3
"""Where the time of a small torch.distributed.all_reduce goes, layer by layer (2 ranks, one host).

    python benches/python/call_cost.py [--iters 2000] [--bytes 8]

Every rank holds the default group on ferroccl, a gloo group and a group on a do-nothing
Python backend (torch's dispatch, the pybind trampoline and a finished work, nothing sent).
Each layer is timed back to back on both ranks in turn, two rounds; rank 0 prints the second
round in microseconds per call:

- ``null dist.all_reduce``: the do-nothing backend through ``dist.all_reduce``
- ``native queued + event``: ``Comm.collective`` on the worker thread, a ``threading.Event``
  set by its callback (two thread hand-offs)
- ``native on caller``: ``Comm.collective_now`` (this thread, GIL released)
- ``pg.allreduce().wait()``: the process group's method, without torch's dispatch
- ``ferroccl dist.all_reduce`` / ``gloo dist.all_reduce``: the whole call
- ``Work()`` / ``Future()``: constructing a queued operation's work / a torch future
"""

import argparse
import datetime
import os
import tempfile
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class _NullWork(dist.Work):
    def __init__(self, out):
        super().__init__()
        self._out = out

    def wait(self, timeout=datetime.timedelta(0)):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        f = torch.futures.Future()
        f.set_result(self._out)
        return f


class _NullPG(dist.ProcessGroup):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)

    def getBackendName(self):
        return "nullpg"

    def allreduce(self, tensors, opts=None):
        return _NullWork(tensors)

    def barrier(self, opts=None):
        return _NullWork([])


def _per_call(f, iters):
    for _ in range(max(1, iters // 10)):
        f()
    start = time.perf_counter()
    for _ in range(iters):
        f()
    return (time.perf_counter() - start) / iters * 1e6


def rank_main(rank, a, init):
    import ferroccl
    from ferroccl.work import Work

    dist.Backend.register_backend("nullpg", _NullPG, devices=["cpu"])
    torch.set_num_threads(1)
    dist.init_process_group("ferroccl", init_method=init, rank=rank, world_size=2)
    gloo = dist.new_group(backend="gloo")
    null = dist.new_group(backend="nullpg")
    pg = dist.group.WORLD
    comm = pg.comm
    t = torch.ones(max(1, a.bytes // 4))
    args = ("all_reduce", None, 0, t.data_ptr(), t.numel() * 4, t.numel(), "float32", "sum",
            0, 1.0)
    ev = threading.Event()

    def queued():
        ev.clear()
        comm.collective(*args, lambda err: ev.set())
        ev.wait()

    layers = [
        ("null dist.all_reduce", lambda: dist.all_reduce(t, group=null)),
        ("native queued + event", queued),
        ("native on caller", lambda: comm.collective_now(*args)),
        ("pg.allreduce().wait()", lambda: pg.allreduce([t]).wait()),
        ("ferroccl dist.all_reduce", lambda: dist.all_reduce(t)),
        ("gloo dist.all_reduce", lambda: dist.all_reduce(t, group=gloo)),
        ("Work()", lambda: Work([t])),
        ("Future()", torch.futures.Future),
    ]
    res = {}
    for _ in range(2):
        for name, f in layers:
            dist.barrier(group=gloo)
            res[name] = _per_call(f, a.iters)
    if rank == 0:
        print(f"# {t.numel() * 4} B float32 all_reduce, 2 ranks, {a.iters} calls per layer")
        for name, us in res.items():
            print(f"{name:28s} {us:9.1f} us")
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--bytes", type=int, default=8)
    a = p.parse_args()
    fd, path = tempfile.mkstemp(prefix="ferroccl-bench-")
    os.close(fd)
    os.unlink(path)
    mp.start_processes(rank_main, args=(a, f"file://{path}"), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()
