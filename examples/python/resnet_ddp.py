#!/usr/bin/env python3
"""Data-parallel ResNet-18 training on synthetic images, on ferroccl or gloo.

    pip install ./python                   # the ferroccl package (needs torch, torchvision)
    torchrun --nproc-per-node 2 examples/python/resnet_ddp.py --backend ferroccl
    torchrun --nproc-per-node 2 examples/python/resnet_ddp.py --backend gloo
    torchrun --nproc-per-node 2 examples/python/resnet_ddp.py --device cuda   # on GPUs

Each rank trains on its own batches (seeded by rank) with torch's DistributedDataParallel;
rank 0 prints the loss and the throughput in images/s over all ranks, after warm-up steps, and
at the end a checksum of the parameters (equal on every backend up to float rounding).
With ``--device cuda`` the model and batches live on GPU ``LOCAL_RANK`` modulo the GPUs seen
(several ranks may share one) and ferroccl runs DDP's gradient buckets in stream order.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="ferroccl", help="ferroccl or gloo")
    p.add_argument("--batch", type=int, default=16, help="images per rank per step")
    p.add_argument("--image", type=int, default=64, help="image side in pixels")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores/ranks)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where to train")
    a = p.parse_args()

    if a.backend == "ferroccl":
        import ferroccl  # noqa: F401  (registers the backend)
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    threads = a.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)

    dev = torch.device("cpu")
    if a.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", rank))
        dev = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(dev)

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(dev)
    ids = [dev.index] if dev.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(a.batch, 3, a.image, a.image, generator=g).to(dev)
    y = torch.randint(0, 10, (a.batch,), generator=g).to(dev)

    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for i in range(a.steps):
        loss = step()
        if rank == 0:
            print(f"step {i}: loss {loss:.4f}", flush=True)
    dist.barrier()
    secs = time.perf_counter() - start
    images = a.steps * a.batch * world
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    if rank == 0:
        print(
            f"backend {a.backend} on {a.device}: {world} ranks x {threads} threads, batch {a.batch}/rank, "
            f"{a.image}px: {images / secs:.1f} images/s ({secs / a.steps * 1e3:.1f} ms/step); "
            f"parameter sum {total:.6f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
