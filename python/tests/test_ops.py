"""Every operation x every dtype x counts {0, 1, primes, large} at world sizes 2 and 3.

Rank r's element i holds a value distinct per element and per rank where the dtype can hold
it (wide types: ``r * 1000003 + i``; narrow types: a small pattern, so sums stay exact), and
each rank checks its result against the value computed from every rank's input.

    python tests/test_ops.py            # world sizes 2 and 3
    python tests/test_ops.py 4          # another world size
"""

import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

WIDE = [torch.float32, torch.float64, torch.int32, torch.int64]
NARROW = [torch.float16, torch.bfloat16, torch.int8, torch.uint8]
DTYPES = WIDE + NARROW + [torch.bool]
COUNTS = [0, 1, 7, 131, 1021]
LARGE = 1 << 20  # plus one: 4 MiB of float32, for the float32 cases


def value(rank, count, dtype):
    """Rank ``rank``'s input of ``count`` elements (float64 reference)."""
    i = torch.arange(count, dtype=torch.float64)
    if dtype in WIDE:
        return rank * 1000003 + i
    if dtype == torch.bool:
        return ((i + rank) % 3 == 0).double()
    if dtype == torch.uint8:
        return (i * 7 + rank * 5) % 40
    return (i * 7 + rank * 5) % 40 - 20


def make(rank, count, dtype):
    return value(rank, count, dtype).to(dtype)


def reduce_ref(world, count, dtype, op):
    vals = torch.stack([value(r, count, dtype) for r in range(world)])
    if dtype == torch.bool:
        op = {"sum": "max", "product": "min"}.get(op, op)
    if op == "sum":
        out = vals.sum(0)
    elif op == "max":
        out = vals.max(0).values
    elif op == "min":
        out = vals.min(0).values
    elif op == "avg":
        out = vals.sum(0) / world
    return out.to(dtype)


OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
       "avg": dist.ReduceOp.AVG}


def same(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape:
        raise AssertionError(f"{what}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
    if got.dtype in (torch.float16, torch.bfloat16):
        ok = torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-2)
    else:
        ok = torch.equal(got, want)
    if not ok:
        bad = (got.double() != want.double()).nonzero()[:3].flatten().tolist()
        raise AssertionError(f"{what}: wrong at {bad}: got {got.flatten()[bad].tolist()} want {want.flatten()[bad].tolist()}")


def cases(rank, world, dtype, n):
    """(name, function) for every operation on ``n`` elements of ``dtype``."""
    out = []

    def add(name):
        def deco(f):
            out.append((f"{name} {dtype} n={n}", f))
            return f
        return deco

    ops = ["sum", "max", "min"] + (["avg"] if dtype.is_floating_point else [])
    for opname in ops:
        @add(f"all_reduce[{opname}]")
        def _(opname=opname):
            t = make(rank, n, dtype)
            dist.all_reduce(t, op=OPS[opname])
            same(t, reduce_ref(world, n, dtype, opname), "all_reduce")

    @add("all_reduce async+future")
    def _():
        t = make(rank, n, dtype)
        fut = dist.all_reduce(t, async_op=True).get_future()
        (res,) = fut.wait()
        same(res, reduce_ref(world, n, dtype, "sum"), "future result")

    @add("all_reduce_coalesced")
    def _():
        ts = [make(rank, n, dtype), make(rank, n + 3, dtype)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t)
        cm.wait()
        same(ts[0], reduce_ref(world, n, dtype, "sum"), "first")
        same(ts[1], reduce_ref(world, n + 3, dtype, "sum"), "second")

    root = world - 1

    @add("broadcast")
    def _():
        t = make(rank, n, dtype)
        dist.broadcast(t, src=root)
        same(t, make(root, n, dtype), "broadcast")

    @add("reduce")
    def _():
        t = make(rank, n, dtype)
        dist.reduce(t, dst=1 % world)
        if rank == 1 % world:
            same(t, reduce_ref(world, n, dtype, "sum"), "reduce")

    @add("all_gather")
    def _():
        outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, make(rank, n, dtype))
        for r in range(world):
            same(outs[r], make(r, n, dtype), f"block {r}")

    @add("all_gather_into_tensor")
    def _():
        o = torch.empty(world * n, dtype=dtype)
        dist.all_gather_into_tensor(o, make(rank, n, dtype))
        same(o, torch.cat([make(r, n, dtype) for r in range(world)]), "all_gather_into_tensor")

    @add("reduce_scatter")
    def _():
        full = make(rank, world * n, dtype)
        o = torch.empty(n, dtype=dtype)
        dist.reduce_scatter(o, list(full.chunk(world)) if n else [torch.empty(0, dtype=dtype)] * world)
        same(o, reduce_ref(world, world * n, dtype, "sum")[rank * n:(rank + 1) * n], "reduce_scatter")

    @add("reduce_scatter_tensor")
    def _():
        o = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(o, make(rank, world * n, dtype))
        same(o, reduce_ref(world, world * n, dtype, "sum")[rank * n:(rank + 1) * n], "reduce_scatter_tensor")

    @add("all_gather_into_tensor coalesced")
    def _():
        outs = [torch.empty(world * n, dtype=dtype), torch.empty(world * (n + 1), dtype=dtype)]
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_gather_into_tensor(outs[0], make(rank, n, dtype))
            dist.all_gather_into_tensor(outs[1], make(rank, n + 1, dtype))
        cm.wait()
        same(outs[1], torch.cat([make(r, n + 1, dtype) for r in range(world)]), "second")

    @add("reduce_scatter_tensor coalesced")
    def _():
        outs = [torch.empty(n, dtype=dtype), torch.empty(n + 1, dtype=dtype)]
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.reduce_scatter_tensor(outs[0], make(rank, world * n, dtype))
            dist.reduce_scatter_tensor(outs[1], make(rank, world * (n + 1), dtype))
        cm.wait()
        m = n + 1
        same(outs[1], reduce_ref(world, world * m, dtype, "sum")[rank * m:(rank + 1) * m], "second")

    @add("gather")
    def _():
        t = make(rank, n, dtype)
        if rank == root:
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.gather(t, outs, dst=root)
            for r in range(world):
                same(outs[r], make(r, n, dtype), f"block {r}")
        else:
            dist.gather(t, dst=root)

    @add("scatter")
    def _():
        o = torch.empty(n, dtype=dtype)
        if rank == 0:
            dist.scatter(o, [make(r + 10, n, dtype) for r in range(world)], src=0)
        else:
            dist.scatter(o, src=0)
        same(o, make(rank + 10, n, dtype), "scatter")

    @add("all_to_all")
    def _():
        ins = [make(rank * world + p, n, dtype) for p in range(world)]
        outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
        dist.all_to_all(outs, ins)
        for p in range(world):
            same(outs[p], make(p * world + rank, n, dtype), f"from {p}")

    @add("all_to_all_single")
    def _():
        i = torch.cat([make(rank * world + p, n, dtype) for p in range(world)])
        o = torch.empty(world * n, dtype=dtype)
        dist.all_to_all_single(o, i)
        same(o, torch.cat([make(p * world + rank, n, dtype) for p in range(world)]), "all_to_all_single")

    @add("all_to_all_single uneven")
    def _():
        # Rank r sends n + p elements to rank p.
        i = torch.cat([make(rank * world + p, n + p, dtype) for p in range(world)])
        o = torch.empty(sum(n + rank for _ in range(world)), dtype=dtype)
        dist.all_to_all_single(o, i, [n + rank] * world, [n + p for p in range(world)])
        same(o, torch.cat([make(p * world + rank, n + rank, dtype) for p in range(world)]), "uneven")

    @add("batch_isend_irecv ring")
    def _():
        right, left = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(n, dtype=dtype)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, make(rank, n, dtype), right),
            dist.P2POp(dist.irecv, got, left),
        ])
        for r in reqs:
            r.wait()
        same(got, make(left, n, dtype), "from left")

    @add("send/recv")
    def _():
        if rank == 0:
            for p in range(1, world):
                dist.send(make(p + 20, n, dtype), p)
        else:
            t = torch.empty(n, dtype=dtype)
            dist.recv(t, 0)
            same(t, make(rank + 20, n, dtype), "recv")

    return out


def body(rank, world, counts):
    failed = []
    total = 0
    for dtype in DTYPES:
        for n in counts + ([LARGE + 1] if dtype == torch.float32 else []):
            for name, f in cases(rank, world, dtype, n):
                total += 1
                try:
                    f()
                except Exception as e:  # noqa: BLE001
                    failed.append(f"{name}: {type(e).__name__}: {e}")
    dist.barrier()
    if failed:
        for f in failed:
            print(f"rank {rank} FAIL {f}", flush=True)
        raise AssertionError(f"rank {rank}: {len(failed)} of {total} cases failed")
    if rank == 0:
        print(f"world {world}: {total} cases passed on every rank", flush=True)


def main():
    worlds = [int(a) for a in sys.argv[1:]] or [2, 3]
    res = harness.Results()
    for w in worlds:
        res.run(f"ops sweep, world {w}", harness.spawn, body, w, timeout_s=120, args=(COUNTS,))
    res.finish("test_ops")


if __name__ == "__main__":
    main()
