"""Which process-group methods DDP, FSDP2 and DTensor call on CPU (docs/PYTORCH.md's table).

    python tests/calls.py

Runs each on 2 ranks with every method of ProcessGroupFerroccl counted, and prints, per user,
the methods called and how often (rank 0). A user whose run fails is reported with its error.
"""

import collections
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

from ferroccl.backend import ProcessGroupFerroccl  # noqa: E402

METHODS = [
    "broadcast", "allreduce", "allreduce_coalesced", "reduce", "allgather", "allgather_coalesced",
    "all_gather_single", "all_gather_single_coalesced", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_single_coalesced", "gather", "scatter", "alltoall", "all_to_all_single",
    "send", "recv", "barrier",
]
COUNTS = collections.Counter()


def count_calls():
    for name in METHODS:
        f = getattr(ProcessGroupFerroccl, name)

        def wrapped(self, *a, _f=f, _name=name, **k):
            COUNTS[_name] += 1
            return _f(self, *a, **k)

        setattr(ProcessGroupFerroccl, name, wrapped)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def steps(m):
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        m(torch.randn(8, 16)).sum().backward()
        opt.step()


def ddp():
    steps(nn.parallel.DistributedDataParallel(model()))


def fsdp2():
    from torch.distributed.fsdp import fully_shard

    m = model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    steps(m)


def dtensor():
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    a = distribute_tensor(torch.randn(8, 8), mesh, [Shard(0)])
    b = distribute_tensor(torch.randn(8, 8), mesh, [Shard(1)])
    c = (a @ b.redistribute(mesh, [Replicate()])).redistribute(mesh, [Replicate()])
    s = a.sum()
    c.full_tensor()
    s.full_tensor()
    a.redistribute(mesh, [Shard(1)]).full_tensor()


def body(rank, world):
    count_calls()
    for name, f in (("DDP", ddp), ("FSDP2", fsdp2), ("DTensor", dtensor)):
        COUNTS.clear()
        err = None
        try:
            f()
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        dist.barrier()
        if rank == 0:
            calls = ", ".join(f"{k} x{v}" for k, v in sorted(COUNTS.items()))
            print(f"{name}: {calls or '(none)'}" + (f"; FAILED {err}" if err else ""), flush=True)


if __name__ == "__main__":
    harness.spawn(body, 2, timeout_s=60)
