"""DDP and FSDP2 train a small model a few steps on ferroccl and on gloo: same parameters.

Every rank draws its own batch from a seed of its rank, so the gradients differ per rank and
the averaged result depends on the collectives being right.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

STEPS = 5


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
    )


def batches(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
            for _ in range(STEPS)]


def train(m, rank):
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches(rank):
        opt.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()


def ddp(rank, world, out):
    m = nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=0.01)
    train(m, rank)
    if rank == 0:
        torch.save({k: v.detach() for k, v in m.module.state_dict().items()}, out)


def fsdp2(rank, world, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # An explicit CPU mesh: without one FSDP2 picks the GPU where PyTorch sees one.
    mesh = init_device_mesh("cpu", (world,))
    m = model()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    train(m, rank)
    full = {k: v.full_tensor().detach() for k, v in m.state_dict().items()}
    if rank == 0:
        torch.save(full, out)


def compare(fn, world):
    with tempfile.TemporaryDirectory() as d:
        got = {}
        for backend in ("gloo", "ferroccl"):
            path = os.path.join(d, backend)
            harness.spawn(fn, world, backend=backend, timeout_s=60, args=(path,))
            got[backend] = torch.load(path)
    ref = model().state_dict()
    moved = False
    for k, v in got["gloo"].items():
        torch.testing.assert_close(got["ferroccl"][k], v, rtol=1e-5, atol=1e-6, msg=lambda m: f"{k}: {m}")
        moved |= not torch.allclose(v, ref[k])
    assert moved, "training did not change the parameters"


def main():
    res = harness.Results()
    for world in [int(a) for a in sys.argv[1:]] or (2, 3):
        res.run(f"DDP matches gloo, world {world}", compare, ddp, world)
        res.run(f"FSDP2 matches gloo, world {world}", compare, fsdp2, world)
    res.finish("test_train")


if __name__ == "__main__":
    main()
