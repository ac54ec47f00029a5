"""The process group's device path (what CUDA tensors take) on the host stand-in provider.

``FERRO_DEVICE_PROVIDER=host`` makes the native device calls accept the stand-in's "device
memory" (host memory it registers). Tensors made over that memory here are CPU tensors to
PyTorch; the adapter installed below (``ferroccl.device.install``) tells the process group they
are device tensors of device 0 on a stand-in stream, so every operation takes the device path:
queued on the stream, its copies and waits ordered after it, errors named. The stand-in's
stream runs when it is waited for, which the adapter's ``settle`` and marks do (a GPU's runs by
itself). What this cannot run is PyTorch's CUDA itself: ``test_cuda.py`` runs the same
checks on CUDA tensors (``Cuda`` below) on a GPU.
"""

import ctypes
import os
import sys
import weakref

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

import ferroccl  # noqa: E402
from ferroccl import _ferroccl, device  # noqa: E402

STREAM = 0x5_1000  # a stand-in stream handle


class _Mark:
    def __init__(self, on):
        self._on = on

    def wait(self):
        _ferroccl.stream_synchronize(*self._on[:2])

    def query(self):
        _ferroccl.stream_synchronize(*self._on[:2])
        return True


class StandIn(device.HostOrder):
    """Stand-in device memory wrapped in CPU tensors, reported as device 0's."""

    def __init__(self):
        self.allocs = []
        # Empty tensors have no address (data_ptr 0): these are known by identity.
        self.empties = {}

    def tensor(self, values):
        """A "device" tensor holding a copy of the CPU tensor ``values``."""
        n = values.numel() * values.element_size()
        addr = _ferroccl.device_alloc(0, max(n, 16))
        self.allocs.append((addr, max(n, 16)))
        buf = (ctypes.c_char * max(n, 16)).from_address(addr)
        t = torch.frombuffer(buf, dtype=values.dtype)[: values.numel()].view(values.shape)
        t.copy_(values)
        if t.numel() == 0:
            self.empties[id(t)] = weakref.ref(t)
        return t

    def empty_of(self, shape, dtype):
        return self.tensor(torch.zeros(shape, dtype=dtype))

    def empty(self, numel, like):
        if self.where(like) is None:
            return torch.empty(numel, dtype=like.dtype)
        if numel == 0:
            return self.tensor(torch.empty(0, dtype=like.dtype))
        return self.empty_of((numel,), like.dtype)

    def where(self, t, streams=None):
        known = self.empties.get(id(t))
        if known is not None and known() is t:
            return (0, STREAM, None)
        p, n = t.data_ptr(), t.numel() * t.element_size()
        for a, size in self.allocs:
            if a <= p and p + n <= a + size:
                return (0, STREAM, None)
        return None

    # Whether a call's completion waits for its stream (its host-side copies out need the
    # results); a test whose calls copy nothing out may leave them queued, as on a GPU.
    settle_waits = True

    def settle(self, on):
        if self.settle_waits:
            _ferroccl.stream_synchronize(*on[:2])

    def mark(self, on):
        return _Mark(on)

    def future(self, on):
        return torch.futures.Future()


class Spy:
    """Counts the process group's native calls by path: stream-ordered (device) or host."""

    def __init__(self):
        pg = dist.group.WORLD
        if not isinstance(pg, ferroccl.ProcessGroupFerroccl):
            pg = pg._get_backend(torch.device("cpu"))
        self.comm, self.stream, self.host = pg._comm, 0, 0
        pg._comm = self

    def __getattr__(self, name):
        attr = getattr(self.comm, name)
        if name in ("collective_on_stream", "p2p_on_stream"):
            self.stream += 1
        elif name in ("collective", "collective_now", "p2p"):
            self.host += 1
        return attr


class Cuda:
    """PyTorch's CUDA tensors on device 0 (the default adapter's)."""

    def tensor(self, values):
        return values.to("cuda:0")

    def empty_of(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype, device="cuda:0")


def tensors(kind):
    """The maker of device tensors for ``kind`` ("standin" installs its adapter)."""
    if kind == "cuda":
        torch.cuda.set_device(0)
        return Cuda()
    sd = StandIn()
    device.install(sd)
    return sd


DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.uint8]
COUNTS = [0, 1, 7, 1031]


def values(rank, count, dtype, salt=0):
    """Distinct values per element and rank, exact in every dtype here."""
    v = (torch.arange(count, dtype=torch.int64) * 3 + rank * 5 + salt) % 61
    return v.to(dtype)


def check(got, want, what):
    if not torch.equal(got.cpu(), want):
        raise AssertionError(f"{what}: got {got[:8].tolist()}, want {want[:8].tolist()}")


def collectives(rank, world, kind="standin"):
    sd = tensors(kind)
    spy = Spy()
    for dtype in DTYPES:
        for count in COUNTS:
            tag = f"{dtype} x {count}"
            every = [values(r, count, dtype) for r in range(world)]
            t = sd.tensor(every[rank])
            dist.all_reduce(t)
            check(t, sum(e.to(torch.int64) for e in every).to(dtype), f"all_reduce {tag}")
            t = sd.tensor(every[rank])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            check(t, torch.stack(every).max(0).values, f"all_reduce max {tag}")
            root = 1 % world
            t = sd.tensor(every[rank])
            dist.broadcast(t, src=root)
            check(t, every[root], f"broadcast {tag}")
            t = sd.tensor(every[rank])
            dist.reduce(t, dst=root, op=dist.ReduceOp.MIN)
            if rank == root:
                check(t, torch.stack(every).min(0).values, f"reduce {tag}")
            outs = [sd.empty_of((count,), dtype) for _ in range(world)]
            dist.all_gather(outs, sd.tensor(every[rank]))
            for r in range(world):
                check(outs[r], every[r], f"all_gather {tag} from {r}")
            flat = sd.empty_of((world * count,), dtype)
            dist.all_gather_into_tensor(flat, sd.tensor(every[rank]))
            check(flat, torch.cat(every), f"all_gather_into_tensor {tag}")
            if count:
                # In place, as FSDP2 calls it: the input is this rank's block of the output.
                flat = sd.tensor(torch.cat([every[rank]] * world))
                dist.all_gather_into_tensor(flat, flat[rank * count : (rank + 1) * count])
                check(flat, torch.cat(every), f"all_gather_into_tensor in place {tag}")
            ins = [values(rank, count, dtype, salt=r) for r in range(world)]
            o = sd.empty_of((count,), dtype)
            dist.reduce_scatter(o, [sd.tensor(i) for i in ins])
            want = sum(values(r, count, dtype, salt=rank).to(torch.int64) for r in range(world))
            check(o, want.to(dtype), f"reduce_scatter {tag}")
            o = sd.empty_of((count,), dtype)
            dist.reduce_scatter_tensor(o, sd.tensor(torch.cat(ins)))
            check(o, want.to(dtype), f"reduce_scatter_tensor {tag}")
    # 9 native calls per dtype and count (all_gather's list is one; no in-place one for 0).
    want = len(DTYPES) * sum(9 if c else 8 for c in COUNTS)
    assert (spy.stream, spy.host) == (want, 0), (spy.stream, spy.host, want)


def exchanges(rank, world, kind="standin"):
    sd = tensors(kind)
    spy = Spy()
    dtype, count = torch.float32, 13
    # all_to_all_single, even blocks.
    src = sd.tensor(values(rank, world * count, dtype))
    out = sd.empty_of((world * count,), dtype)
    dist.all_to_all_single(out, src)
    want = torch.cat([values(r, world * count, dtype)[rank * count : (rank + 1) * count] for r in range(world)])
    check(out, want, "all_to_all_single")
    # Uneven splits: rank r sends r + k + 1 rows to rank k.
    ins = [r_k + 1 + rank for r_k in range(world)]
    outs = [rank + 1 + r for r in range(world)]
    src = sd.tensor(values(rank, sum(ins), dtype))
    out = sd.empty_of((sum(outs),), dtype)
    dist.all_to_all_single(out, src, output_split_sizes=outs, input_split_sizes=ins)
    parts = []
    for r in range(world):
        sent = [k + 1 + r for k in range(world)]
        off = sum(sent[:rank])
        parts.append(values(r, sum(sent), dtype)[off : off + sent[rank]])
    check(out, torch.cat(parts), "all_to_all_single uneven")
    # Ring of sends and receives, as a batch and one by one.
    right, left = (rank + 1) % world, (rank - 1) % world
    mine = sd.tensor(values(rank, count, dtype))
    got = sd.empty_of((count,), dtype)
    ops = [dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, got, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check(got, values(left, count, dtype), "batch_isend_irecv")
    got = sd.empty_of((count,), dtype)
    if rank % 2 == 0:
        dist.send(mine, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(mine, right)
    check(got, values(left, count, dtype), "send/recv")
    # gather, scatter, all_to_all on lists.
    root = world - 1
    outs = [sd.empty_of((count,), dtype) for _ in range(world)] if rank == root else None
    dist.gather(sd.tensor(values(rank, count, dtype)), outs, dst=root)
    if rank == root:
        for r in range(world):
            check(outs[r], values(r, count, dtype), f"gather from {r}")
    o = sd.empty_of((count,), dtype)
    ins = [sd.tensor(values(k, count, dtype, salt=7)) for k in range(world)] if rank == root else None
    dist.scatter(o, ins, src=root)
    check(o, values(rank, count, dtype, salt=7), "scatter")
    outs = [sd.empty_of((count,), dtype) for _ in range(world)]
    dist.all_to_all(outs, [sd.tensor(values(rank, count, dtype, salt=k)) for k in range(world)])
    for r in range(world):
        check(outs[r], values(r, count, dtype, salt=rank), f"all_to_all from {r}")
    # Asynchronous: the work completes through its mark; the future holds the output.
    t = sd.tensor(values(rank, count, dtype))
    w = dist.all_reduce(t, async_op=True)
    if kind == "cuda":
        w.wait()
        torch.cuda.synchronize()
    assert w.is_completed()
    fut = w.get_future()
    fut.wait()
    want = sum(values(r, count, dtype) for r in range(world))
    check(fut.value()[0], want, "all_reduce future")
    assert w.wait() is True
    assert spy.host == 0, f"{spy.host} host calls on device tensors"
    # Host tensors still take the host path beside device ones.
    h = values(rank, count, dtype)
    dist.all_reduce(h)
    check(h, want, "host all_reduce after device calls")
    assert spy.host == 1 and spy.stream > 0, (spy.stream, spy.host)


def errors(rank, world, kind="standin"):
    sd = tensors(kind)
    host = torch.zeros(4)
    dev = sd.empty_of((4 * world,), torch.float32)
    try:
        dist.all_gather_into_tensor(dev, host)
    except ferroccl.Error as e:
        assert "different places" in str(e) and f"rank {rank}" in str(e), e
    else:
        raise AssertionError("a host input with a device output was accepted")
    if kind == "standin":
        # A device tensor whose memory the provider does not know (a host tensor the adapter
        # reports as device memory) is refused by the native checks, naming call and rank.
        fake = torch.zeros(8)
        sd.allocs.append((fake.data_ptr(), 32))
        try:
            dist.all_reduce(fake)
        except ferroccl.Error as e:
            msg = str(e)
            assert "all_reduce" in msg and f"rank {rank}" in msg, msg
        else:
            raise AssertionError("host memory passed as device memory was accepted")
        sd.allocs.pop()
    # An output that overlaps the input other than in all_gather's in-place layout.
    buf = sd.tensor(torch.arange(2.0 * world))
    try:
        dist.reduce_scatter_tensor(buf[1:3], buf)
    except ferroccl.Error as e:
        assert "overlaps the output" in str(e) and f"rank {rank}" in str(e), e
    else:
        raise AssertionError("an output overlapping the input was accepted")
    # A device call from a callback on the group's worker thread (a future's then(), as DDP's
    # communication hooks chain them) is issued there, between the operation before and the
    # next. Rank 0 chains it on a host all_reduce that cannot end before the other ranks
    # issue theirs, which they do only once its callback is in place, so the callback runs
    # on the worker; the other ranks issue the same device all_reduce from their own thread.
    store = dist.distributed_c10d._get_default_store()
    big = torch.ones(100_000)
    t = sd.tensor(torch.full((3,), float(rank + 1)))
    if rank == 0:
        w = dist.all_reduce(big, async_op=True)
        fut = w.get_future().then(lambda f: dist.all_reduce(t))
        store.set("ferroccl-test/callback", "set")
        fut.wait()
    else:
        store.wait(["ferroccl-test/callback"])
        dist.all_reduce(big)
        dist.all_reduce(t)
    want = float(world * (world + 1) // 2)
    check(t, torch.full((3,), want), "device all_reduce from a callback")
    # The communicator still works: the refusals happened before anything was queued.
    t = sd.tensor(torch.ones(5))
    dist.all_reduce(t)
    check(t, torch.full((5,), float(world)), "all_reduce after refusals")


_HELD = []


def leaving(rank, world, kind="standin"):
    # The last rank shuts the group down right after queuing its calls, waiting for none of
    # them: the shutdown lets them finish, so the other ranks get their results (a rank that
    # left with its calls queued would fail them mid-collective, or leave them wrong).
    sd = tensors(kind)
    sd.settle_waits = False  # all_reduce copies nothing out: the calls stay queued
    n = (1 << 16) + 3  # in 256-byte slices: 1025 stream jobs a call
    ts = [sd.tensor(values(rank, n, torch.float32, salt=k)) for k in range(6)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    if rank == world - 1:
        # Held past the group's destruction, as a DDP module holds its group: the group is not
        # freed (which would let its calls finish) before the process ends.
        _HELD.append((dist.group.WORLD, works))
        return
    for k, (t, w) in enumerate(zip(ts, works)):
        w.wait()
        want = sum(values(r, n, torch.float32, salt=k) for r in range(world))
        check(t, want, f"all_reduce {k}, the last rank gone")


def slots_device():
    # The group's p2p receive slots go on the process's current CUDA device, where CUDA is
    # initialized when the group is made (never initialized for it); FERRO_P2P_DEVICE wins.
    uid, server = _ferroccl.create_unique_id()
    made = [_ferroccl.Comm(bytes(uid), 0, 1, 10.0, 2)]
    want = int(os.environ["FERRO_P2P_DEVICE"]) if "FERRO_P2P_DEVICE" in os.environ else 2
    assert made[0].p2p_device == want, (made[0].p2p_device, want)
    uid2, server2 = _ferroccl.create_unique_id()
    made.append(_ferroccl.Comm(bytes(uid2), 0, 1, 10.0))
    if "FERRO_P2P_DEVICE" not in os.environ:
        assert made[1].p2p_device is None, made[1].p2p_device
    for c in made:
        c.close()
    del server, server2


if __name__ == "__main__":
    os.environ["FERRO_DEVICE_PROVIDER"] = "host"
    res = harness.Results()
    res.run("the p2p slots' device", slots_device)
    for world in (2, 3):
        for fn in (collectives, exchanges, errors):
            res.run(f"{fn.__name__} world {world}", harness.spawn, fn, world)
    # Small device slices: every call of more than a few elements becomes several stream jobs,
    # the blocked layouts too, cycling through the places of the stream's arena.
    os.environ["FERRO_DEVICE_SLICE_BYTES"] = "256"
    res.run("collectives world 3, 256-byte slices", harness.spawn, collectives, 3)
    res.run("a rank shuts down with its calls queued, world 3", harness.spawn, leaving, 3)
    del os.environ["FERRO_DEVICE_SLICE_BYTES"]
    res.finish("device path on the host stand-in")
