#!/usr/bin/env python3
"""Allreduce bandwidth of PyTorch's gloo backend on CPU tensors, timed like nccl-tests.

Starts N processes (one thread each) on this host, sweeps sizes, and prints rows
`size count type redop time algbw busbw` (time in microseconds, bandwidth in GB/s, busbw =
algbw * 2(n-1)/n), so they can be put beside all_reduce_perf's out-of-place columns.

    python3 gloo_allreduce.py -n 2 -b 8 -e 64M -f 2 --iters 20 --warmup 5
"""
import argparse
import os
import sys
import time


def parse_size(s):
    s = s.strip()
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(s[:-1] if mul != 1 else s) * mul


def worker(rank, args, port):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.nranks)
    n = args.nranks
    size = args.minbytes
    rows = []
    while size <= args.maxbytes:
        count = max(size // 4, 1)
        x = torch.arange(count, dtype=torch.float32) + rank
        for _ in range(args.warmup):
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        dt = (time.perf_counter() - t0) / args.iters
        t = torch.tensor([dt], dtype=torch.float64)
        dist.all_reduce(t)  # average over ranks, as nccl-tests' -a 1
        dt = t.item() / n
        algbw = count * 4 / dt / 1e9
        busbw = algbw * 2 * (n - 1) / n
        rows.append((count * 4, count, dt * 1e6, algbw, busbw))
        size *= args.stepfactor
    if rank == 0:
        print(f"# gloo allreduce, torch {torch.__version__}, {n} ranks, 1 thread each")
        print(f"# {'size':>10} {'count':>12} {'type':>6} {'redop':>6} {'time':>10} {'algbw':>7} {'busbw':>7}")
        for size, count, us, algbw, busbw in rows:
            print(f"  {size:>10} {count:>12} {'float':>6} {'sum':>6} {us:>10.2f} {algbw:>7.2f} {busbw:>7.2f}")
        sys.stdout.flush()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=29600)
    args = p.parse_args()
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args, args.port), nprocs=args.nranks, join=True)


if __name__ == "__main__":
    main()
