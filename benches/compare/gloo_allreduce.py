#!/usr/bin/env python3
"""Allreduce, allgather and broadcast bandwidth of PyTorch's gloo backend on CPU tensors.

Starts N processes (one thread each) on this host and sweeps sizes with the timing rules of
benches/compare/mpi_allreduce.c (and nccl-tests):

  - float32 data; allreduce sums (in place: torch's API); allgather out of place into one
    tensor; broadcast from rank 0;
  - "size" is nccl-tests' size: the buffer of allreduce and broadcast, the whole gathered
    buffer of allgather, whose per-rank block is rounded down to a multiple of 16 bytes;
  - per size: --warmup calls, a barrier, --iters timed calls; the time of one call is the mean
    over ranks of (elapsed / iters);
  - algbw = size / time; busbw = algbw * 2(n-1)/n (allreduce), * (n-1)/n (allgather), * 1
    (broadcast);
  - after timing, one call on fresh inputs is checked element by element; a wrong value makes
    the program exit 1.

Output (rank 0): `# ` comment lines, then rows `coll size count time_us algbw busbw wrong`.

    python3 gloo_allreduce.py -n 2 -b 64 -e 64M -f 4 --iters 20 --warmup 5 -c all
    # one process per rank, e.g. on two hosts:
    python3 gloo_allreduce.py -n 2 --rank 0 --addr 10.0.0.1 &
    python3 gloo_allreduce.py -n 2 --rank 1 --addr 10.0.0.1

Needs torch (`pip install torch`; the CPU wheel is enough).
"""
import argparse
import os
import sys
import time

COLLS = ("allreduce", "allgather", "broadcast")


def parse_size(s):
    s = s.strip()
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(float(s[:-1] if mul != 1 else s) * mul)


def layout(coll, size, n):
    """(elements per rank, reported size) for nccl-tests' size `size`."""
    if coll == "allgather":
        block = size // n // 16 * 16
        return block // 4, block * n
    count = size // 4
    return count, count * 4


def bus_factor(coll, n):
    return {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n}.get(coll, 1.0)


def worker(rank, args, port, colls):
    """One rank: the sweep of every collective in `colls`; rank 0 prints the rows."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = args.addr
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.nranks)
    n = args.nranks

    def inputs(r, count, salt):
        i = torch.arange(count, dtype=torch.int64)
        return ((i * 7 + r * 13 + salt) % 1021).to(torch.float32)

    def gather_into(out, x):
        # all_gather_into_tensor where the backend has it, else a list of views.
        try:
            dist.all_gather_into_tensor(out, x)
        except (RuntimeError, AttributeError, NotImplementedError):
            dist.all_gather(list(out.chunk(n)), x)

    rows = []
    total_wrong = 0
    for coll in colls:
        size = args.minbytes
        while size <= args.maxbytes:
            count, reported = layout(coll, size, n)
            if count == 0:
                size *= args.stepfactor
                continue
            x = inputs(rank, count, 0)
            out = torch.zeros(count * n, dtype=torch.float32)
            if coll == "allreduce":
                call = lambda: dist.all_reduce(x)  # noqa: E731
            elif coll == "allgather":
                call = lambda: gather_into(out, x)  # noqa: E731
            else:
                call = lambda: dist.broadcast(x, 0)  # noqa: E731
            for _ in range(args.warmup):
                call()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                call()
            dt = (time.perf_counter() - t0) / args.iters
            t = torch.tensor([dt], dtype=torch.float64)
            dist.all_reduce(t)
            dt = t.item() / n

            salt = size % 97
            x.copy_(inputs(rank, count, salt))
            call()
            if coll == "allreduce":
                want = sum(inputs(r, count, salt) for r in range(n))
                got = x
            elif coll == "allgather":
                want = torch.cat([inputs(r, count, salt) for r in range(n)])
                got = out
            else:
                want = inputs(0, count, salt)
                got = x
            wrong = torch.tensor([int((got != want).sum().item())], dtype=torch.int64)
            dist.all_reduce(wrong)
            total_wrong += int(wrong.item())
            algbw = reported / dt / 1e9
            rows.append((coll, reported, count, dt * 1e6, algbw, algbw * bus_factor(coll, n),
                         int(wrong.item())))
            size *= args.stepfactor
    if rank == 0:
        print(f"# gloo: torch {torch.__version__}, {n} ranks, 1 thread each")
        print(f"# {'coll':<9} {'size':>12} {'count':>12} {'time':>10} {'algbw':>7} "
              f"{'busbw':>7} {'wrong':>6}")
        for coll, size, count, us, algbw, busbw, wrong in rows:
            print(f"  {coll:<9} {size:>12} {count:>12} {us:>10.2f} {algbw:>7.2f} "
                  f"{busbw:>7.2f} {wrong:>6}")
        print(f"# wrong elements: {total_wrong} {'FAILED' if total_wrong else 'OK'}")
        sys.stdout.flush()
    dist.destroy_process_group()
    if total_wrong:
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("64"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=29600)
    p.add_argument("--rank", type=int, default=None,
                   help="run only this rank in this process (start the others elsewhere, "
                        "e.g. under `ip netns exec`)")
    p.add_argument("--addr", default="127.0.0.1", help="address of rank 0")
    p.add_argument("-c", "--coll", choices=COLLS + ("all",), default="all")
    args = p.parse_args()
    if args.stepfactor < 2 or args.iters < 1 or args.minbytes > args.maxbytes:
        p.error("need -f >= 2, --iters >= 1 and -b <= -e")
    try:
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit("gloo_allreduce.py: torch is not installed for "
                 f"{sys.executable}; run `{sys.executable} -m pip install torch`")
    colls = COLLS if args.coll == "all" else (args.coll,)
    if args.rank is not None:
        worker(args.rank, args, args.port, colls)
        return
    mp.spawn(worker, args=(args, args.port, colls), nprocs=args.nranks, join=True)


if __name__ == "__main__":
    main()
