#!/usr/bin/env python3
"""torch.distributed.all_reduce on ferroccl vs gloo, interleaved in one run, 8 B .. 64 MiB.

Starts N ranks on this host; every rank holds one process group per backend (the default group
on ferroccl, a `new_group` on gloo), and per size runs --warmup calls then --iters timed calls
on each backend in turn, so both see the same machine state. float32 sums, in place; time is
the mean over ranks of elapsed / iters; algbw = size / time; busbw = algbw * 2(n-1)/n (as
nccl-tests). After timing, one call per backend is checked element by element.

    python benches/python/allreduce_sweep.py -n 2 -b 8 -e 64M -f 4 --iters 20 --warmup 5

Rank 0 prints rows: size, count, then time (us) and busbw (GB/s) per backend, the time ratio
and #wrong. Needs torch and the ferroccl package (`pip install ./python`).

Ranks on several hosts (network namespaces, see docs/PYTORCH.md): start one process per rank
with `--rank R --init tcp://HOST:PORT` (and GLOO_SOCKET_IFNAME / FERRO_SOCKET_IFNAME naming
the interface between the hosts).
"""

import argparse
import datetime
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B")
    return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)


def timed(t, group, iters):
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - start) / iters


def rank_main(rank, a, init):
    import ferroccl  # noqa: F401

    n = a.nranks
    torch.set_num_threads(1)
    dist.init_process_group(
        "ferroccl", init_method=init, rank=rank, world_size=n,
        timeout=datetime.timedelta(seconds=120),
    )
    groups = {"ferroccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    sizes, size = [], a.begin
    while size <= a.end:
        sizes.append(size)
        size *= a.factor
    if sizes[-1] != a.end:
        sizes.append(a.end)  # the last size is always timed, as asked
    rows = []
    for size in sizes:
        count = max(1, size // 4)
        t = torch.ones(count)
        res = {}
        for name, g in groups.items():
            for _ in range(a.warmup):
                dist.all_reduce(t, group=g)
            secs = torch.tensor([timed(t, g, a.iters)], dtype=torch.float64)
            dist.all_reduce(secs, group=groups["gloo"])
            check = torch.arange(count, dtype=torch.float32) % 97 + rank
            dist.all_reduce(check, group=g)
            want = (torch.arange(count, dtype=torch.float32) % 97) * n + n * (n - 1) / 2
            res[name] = (secs.item() / n, int((check != want).sum()))
        rows.append((size, count, res))
    if rank == 0:
        bus = 2 * (n - 1) / n
        links = dist.group.WORLD.comm.transport(1) if n > 1 else None
        print(f"# all_reduce float32 sum in place, {n} ranks, iters {a.iters}, warmup {a.warmup}, "
              f"ferroccl rank 0 -> 1: {links}")
        print(f"# {'size':>10} {'count':>10} {'ferro_us':>10} {'ferro_busbw':>11} "
              f"{'gloo_us':>10} {'gloo_busbw':>10} {'gloo/ferro':>10} {'#wrong':>6}")
        for size, count, res in rows:
            (ft, fw), (gt, gw) = res["ferroccl"], res["gloo"]
            nbytes = count * 4
            print(f"  {nbytes:>10} {count:>10} {ft * 1e6:>10.1f} {nbytes / ft / 1e9 * bus:>11.3f} "
                  f"{gt * 1e6:>10.1f} {nbytes / gt / 1e9 * bus:>10.3f} {gt / ft:>10.2f} {fw + gw:>6}")
        if any(r["ferroccl"][1] or r["gloo"][1] for _, _, r in rows):
            sys.exit(1)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("-b", "--begin", type=parse_size, default=8)
    p.add_argument("-e", "--end", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rank", type=int, default=None, help="run only this rank (with --init)")
    p.add_argument("--init", default=None, help="init method for --rank, e.g. tcp://host:port")
    a = p.parse_args()
    if a.rank is not None:
        if not a.init:
            p.error("--rank needs --init")
        rank_main(a.rank, a, a.init)
        return
    fd, path = tempfile.mkstemp(prefix="ferroccl-bench-")
    os.close(fd)
    os.unlink(path)
    mp.start_processes(rank_main, args=(a, f"file://{path}"), nprocs=a.nranks, start_method="spawn")


if __name__ == "__main__":
    main()
