"""The ``ferroccl`` process group: torch.distributed's operations on ferroccl's communicator.

Tensors: CPU tensors run on the host; CUDA tensors run in stream order on the current stream
of their device, as NCCL's calls do (``ferroccl.device``). One call takes tensors of one kind
and one device.

Rendezvous: rank 0 starts a ferroccl store server on an ephemeral port and publishes its
128-byte unique id through the store PyTorch hands the backend factory (already prefixed per
group), so every init method of PyTorch works with no extra variable or port. Every group
(``new_group`` included) is its own communicator, met the same way under its own prefix.
"""

import atexit
import datetime
import math
import os
import sys
import weakref

import torch
import torch.distributed as dist

from . import _ferroccl, device
from ._ferroccl import Error
from .work import DoneWork, Work

BACKEND_NAME = "ferroccl"

# Groups not shut down yet: at interpreter exit their stream-ordered work is let finish (a
# process that left with it queued would fail its peers mid-collective).
_LIVE = weakref.WeakSet()


@atexit.register
def _finish_all():
    for pg in list(_LIVE):
        if pg._p2p:
            # Sends and receives never waited for start only now: each waits for its peer,
            # up to the group's timeout, and the process cannot leave before.
            print(
                f"ferroccl rank {pg._rank} WARN: at exit, {len(pg._p2p)} send/recv issued "
                "but never waited for run now; each waits for its peer (up to the timeout)",
                file=sys.stderr,
                flush=True,
            )
        try:
            pg.shutdown()
        except Exception as e:  # noqa: BLE001 - exiting: say it, do not raise
            print(f"ferroccl rank {pg._rank}: shutting the group down at exit: {e}",
                  file=sys.stderr, flush=True)

# Collectives whose buffers are at most this many bytes run on the calling thread (GIL
# released) when nothing is queued or running; larger ones go to the worker thread, so that
# asynchronous calls (DDP's gradient buckets) overlap with computation.
INLINE_MAX_BYTES = int(os.environ.get("FERRO_PY_INLINE_BYTES", 256 << 10))

_DTYPES = {
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "bfloat16",
}
for _name, _code in (
    ("uint32", "uint32"),
    ("uint64", "uint64"),
    ("float8_e4m3fn", "float8_e4m3fn"),
    ("float8_e5m2", "float8_e5m2"),
):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code

_R = dist.ReduceOp.RedOpType
_OPS = {
    _R.SUM: "sum",
    _R.PRODUCT: "product",
    _R.MIN: "min",
    _R.MAX: "max",
    _R.AVG: "avg",
}
# bool tensors reduce as logical or / and over their 0/1 bytes.
_BOOL_OPS = {"sum": "max", "max": "max", "product": "min", "min": "min"}


def _check(t, op, rank, what="tensor"):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"ferroccl {op} on rank {rank}: {what} is {type(t).__name__}, not a tensor")
    if t.layout != torch.strided:
        raise Error(f"ferroccl {op} on rank {rank}: {what} has layout {t.layout}; only dense tensors")
    if t.device.type not in ("cpu", "cuda"):
        raise Error(
            f"ferroccl {op} on rank {rank}: {what} is on {t.device}; only CPU and CUDA tensors"
        )
    if not t.is_contiguous():
        raise Error(
            f"ferroccl {op} on rank {rank}: {what} of shape {tuple(t.shape)} and strides "
            f"{t.stride()} is not contiguous; call .contiguous() first"
        )
    if t.dtype not in _DTYPES:
        raise Error(f"ferroccl {op} on rank {rank}: unsupported dtype {t.dtype}")
    return t


def _tensors(x):
    """The tensors in ``x``: a tensor, or lists and tuples of them."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _on(name, rank, tensors, streams):
    """Where a call on ``tensors`` runs: ``None`` on the host, else the adapter's ``(device,
    stream handle, stream)``; ``streams`` is the group's cache of side streams."""
    where = device.adapter().where
    first, on = None, None
    for t in tensors:
        w = where(t, streams)
        if first is None:
            first, on = t, w
        elif (w is None) != (on is None) or (w is not None and w[0] != on[0]):
            raise Error(
                f"ferroccl {name} on rank {rank}: one call on tensors in different places "
                f"({first.device} and {t.device}); every tensor of a call must be on the host, "
                f"or all on one device"
            )
    return on


def _overlap(a, b):
    """Whether the memory of tensors ``a`` and ``b`` overlaps."""
    pa, na, pb, nb = a.data_ptr(), _nbytes(a), b.data_ptr(), _nbytes(b)
    return na > 0 and nb > 0 and pa < pb + nb and pb < pa + na


def _cat(tensors):
    """The tensors' elements, one after another, in a new tensor where the first one lives."""
    flat = device.adapter().empty(sum(t.numel() for t in tensors), tensors[0])
    torch.cat([t.reshape(-1) for t in tensors], out=flat)
    return flat


def _nbytes(t):
    return t.numel() * t.element_size()


def _reduce_op(opts, dtype, op, rank):
    red = dist.ReduceOp.SUM if opts is None else opts.reduceOp
    code = _OPS.get(red.op if hasattr(red, "op") else red)
    if code is None:
        raise Error(f"ferroccl {op} on rank {rank}: unsupported reduce op {red}")
    if dtype == torch.bool:
        code = _BOOL_OPS.get(code)
        if code is None:
            raise Error(f"ferroccl {op} on rank {rank}: reduce op {red} is undefined for bool")
    return code


def _current_device():
    """This process's current CUDA device where CUDA is already initialized in it (a program
    calls torch.cuda.set_device before it makes its process group), else None: the group's p2p
    receive slots go on that device. Never initializes CUDA itself."""
    if torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None


class ProcessGroupFerroccl(dist.ProcessGroup):
    """A process group whose operations run on one ferroccl communicator."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        secs = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0.0
        self._timeout = secs
        # The n-th communicator made on this (prefixed) store by this rank: keeps a re-created
        # group from reading an older unique id.
        gen = store.add(f"ferroccl/gen/{rank}", 1)
        key = f"ferroccl/uid/{gen}"
        self._server = None
        if rank == 0:
            uid, self._server = _ferroccl.create_unique_id()
            store.set(key, uid)
        else:
            uid = store.get(key)
        self._comm = _ferroccl.Comm(bytes(uid), rank, size, secs, _current_device())
        # Side streams of this group per device (CUDA tensors): as NCCL's, one per group, so
        # that groups used in different orders on different ranks never wait for each other.
        self._streams = {}
        self._inline_max = INLINE_MAX_BYTES
        # Sends and receives wait here until someone waits on one of them or another operation
        # is issued; then they run as one group, so pairs of blocking transfers never deadlock.
        self._p2p = []
        self._group_name = ""
        self._group_desc = ""
        _LIVE.add(self)

    # ----- identity -----

    # torch >= 2.15's batch_isend_irecv asks every ProcessGroup for its per-device backend; a
    # process group written in Python has none registered, so torch's lookup raises. The group
    # is its own backend for CPU: it does not coalesce in torch's NCCL style (sends and
    # receives are grouped here) and it cannot be split by torch.
    supports_coalescing = False
    supports_splitting = False

    def _get_backend(self, device):
        try:
            return super()._get_backend(device)
        except RuntimeError:
            if torch.device(device).type in ("cpu", "cuda"):
                return self
            raise

    def getBackendName(self):
        return BACKEND_NAME

    def name(self):
        return BACKEND_NAME

    # torch keeps a Python process group's name and description only if it stores them itself.
    def setGroupName(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    @property
    def comm(self):
        """The native communicator (``transport(peer)`` says how this rank reaches a peer)."""
        return self._comm

    def __repr__(self):
        return f"ProcessGroupFerroccl(rank={self._rank}, size={self._size})"

    # ----- plumbing -----

    def _coll(self, work, kind, send, recv, count, dtype, op="sum", root=0):
        """Runs (small, nothing queued) or queues one native collective as a step of ``work``;
        on a device, queues it on the stream ``work`` runs on."""
        if send is not None and _overlap(send, recv):
            # FSDP2 gathers into the tensor its input is a block of: that is the in-place
            # all_gather. Any other overlap would let the output be written while read.
            block = _nbytes(send)
            if kind == "all_gather" and _nbytes(recv) == self._size * block and (
                send.data_ptr() == recv.data_ptr() + self._rank * block
            ):
                send = None
            else:
                work._done(
                    Error(
                        f"ferroccl {kind} on rank {self._rank}: the input tensor overlaps the "
                        f"output tensor (only all_gather into the output whose block "
                        f"{self._rank} is the input runs in place)"
                    )
                )
                return
        if work._on is not None:
            try:
                self._comm.collective_on_stream(
                    kind,
                    None if send is None else send.data_ptr(),
                    0 if send is None else _nbytes(send),
                    recv.data_ptr(),
                    _nbytes(recv),
                    _DTYPES[dtype],
                    op,
                    root,
                    1.0,
                    *work._on[:2],
                )
            except Error as e:
                work._done(e)
                return
            work._done(None)
            return
        args = (
            kind,
            None if send is None else send.data_ptr(),
            0 if send is None else _nbytes(send),
            recv.data_ptr(),
            _nbytes(recv),
            count,
            _DTYPES[dtype],
            op,
            root,
            1.0,
        )
        if max(args[2], args[4]) <= self._inline_max:
            try:
                ran = self._comm.collective_now(*args)
            except Error as e:
                work._done(e)
                return
            if ran:
                work._done(None)
                return
        self._comm.collective(*args, work._done)

    def _run(self, work, steps, name="operation"):
        """Starts ``work`` as the list of native ``steps`` (callables taking the work): on the
        host, or in stream order where its tensors are device memory."""
        self._flush()
        work._comm = self._comm
        used = list(_tensors([work._outputs, work._keep]))
        work._on = _on(name, self._rank, used, self._streams)
        if work._on is not None:
            work._async = self._comm.async_error
            device.adapter().begin(work._on, used)
        work._expect(len(steps))
        for i, step in enumerate(steps):
            try:
                step(work)
            except Exception as e:
                # Steps already queued still call back; the ones never queued count as done.
                for _ in range(len(steps) - i):
                    work._done(e if isinstance(e, Error) else Error(str(e)))
                raise
        return work

    def _flush(self):
        ops, self._p2p = self._p2p, []
        if not ops:
            return
        works = [w for _, _, _, w in ops]
        for w in works:
            w._flush = None

        def done(err):
            for w in works:
                w._done(err)

        try:
            on = _on("send/recv", self._rank, [t for _, t, _, _ in ops], self._streams)
            if on is None:
                self._comm.p2p([(s, t.data_ptr(), _nbytes(t), p) for s, t, p, _ in ops], done)
                return
            for w in works:
                w._on, w._async = on, self._comm.async_error
            # The side stream waits for where each send and receive was issued (the stream
            # current then), not for the stream current now.
            issued = [w._issued for w in works if w._issued is not None]
            device.adapter().begin(on, [t for _, t, _, _ in ops], after=issued)
            self._comm.p2p_on_stream(
                [(s, t.data_ptr(), _nbytes(t), p) for s, t, p, _ in ops], *on[:2]
            )
            done(None)
        except Exception as e:
            for w in works:
                w._fail(e if isinstance(e, Error) else Error(str(e)))

    # ----- collectives -----

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            _check(t, "broadcast", self._rank)

        def step(t):
            return lambda w: self._coll(w, "broadcast", None, t, t.numel(), t.dtype, root=root)

        return self._run(Work(tensors, keep=tensors), [step(t) for t in tensors], "broadcast")

    def allreduce(self, tensors, opts=None):
        if len(tensors) == 1:
            # The common call (DDP's buckets, dist.all_reduce): checked and, when small and
            # nothing is queued, run here and returned as a completed work.
            t = tensors[0]
            _check(t, "all_reduce", self._rank)
            nbytes = t.nbytes
            if (
                nbytes <= self._inline_max
                and not self._p2p
                and device.adapter().where(t, self._streams) is None
            ):
                op = _reduce_op(opts, t.dtype, "all_reduce", self._rank)
                try:
                    ran = self._comm.collective_now(
                        "all_reduce", None, 0, t.data_ptr(), nbytes, t.numel(), _DTYPES[t.dtype],
                        op, 0, 1.0,
                    )
                except Error as e:
                    return DoneWork(tensors, e)
                if ran:
                    return DoneWork(tensors)
        steps = []
        for t in tensors:
            _check(t, "all_reduce", self._rank)
            op = _reduce_op(opts, t.dtype, "all_reduce", self._rank)
            steps.append(
                lambda w, t=t, op=op: self._coll(w, "all_reduce", None, t, t.numel(), t.dtype, op)
            )
        return self._run(Work(tensors, keep=tensors), steps, "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        for t in tensors:
            _check(t, "all_reduce_coalesced", self._rank)
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1 or len(tensors) == 1:
            return self.allreduce(tensors, opts)
        dtype = tensors[0].dtype
        op = _reduce_op(opts, dtype, "all_reduce_coalesced", self._rank)
        flat = _cat(tensors)

        def post():
            off = 0
            for t in tensors:
                n = t.numel()
                t.view(-1).copy_(flat[off : off + n])
                off += n

        work = Work(tensors, keep=(flat,), post=post)
        return self._run(
            work, [lambda w: self._coll(w, "all_reduce", None, flat, flat.numel(), dtype, op)],
            "all_reduce_coalesced",
        )

    def reduce(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        steps = []
        for t in tensors:
            _check(t, "reduce", self._rank)
            op = _reduce_op(opts, t.dtype, "reduce", self._rank)
            steps.append(
                lambda w, t=t, op=op: self._coll(
                    w, "reduce", None, t, t.numel(), t.dtype, op, root=root
                )
            )
        return self._run(Work(tensors, keep=tensors), steps, "reduce")

    def allgather(self, output_lists, inputs, opts=None):
        if len(output_lists) != len(inputs):
            raise Error(
                f"ferroccl all_gather on rank {self._rank}: {len(output_lists)} output lists "
                f"for {len(inputs)} inputs"
            )
        steps, keep = [], []
        for outs, t in zip(output_lists, inputs):
            _check(t, "all_gather", self._rank, "input")
            if len(outs) != self._size:
                raise Error(
                    f"ferroccl all_gather on rank {self._rank}: {len(outs)} output tensors, "
                    f"group size {self._size}"
                )
            for o in outs:
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise Error(
                        f"ferroccl all_gather on rank {self._rank}: output of {o.numel()} "
                        f"{o.dtype} for input of {t.numel()} {t.dtype}"
                    )
            flat = device.adapter().empty(self._size * t.numel(), t)
            keep += [t, flat]
            steps.append(
                lambda w, t=t, flat=flat: self._coll(
                    w, "all_gather", t, flat, t.numel(), t.dtype
                )
            )

        def post():
            for outs, flat in zip(output_lists, keep[1::2]):
                for o, part in zip(outs, flat.chunk(self._size) if flat.numel() else outs):
                    if part is not o:
                        o.copy_(part.view(o.shape))

        return self._run(Work(output_lists, keep=keep, post=post), steps, "all_gather")

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        # output_lists[r][i] receives rank r's inputs[i].
        if len(output_lists) != self._size:
            raise Error(
                f"ferroccl all_gather_coalesced on rank {self._rank}: {len(output_lists)} "
                f"output lists, group size {self._size}"
            )
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise Error(
                    f"ferroccl all_gather_coalesced on rank {self._rank}: output list {r} "
                    f"holds {len(outs)} tensors for {len(inputs)} inputs"
                )
        per_input = [[outs[i] for outs in output_lists] for i in range(len(inputs))]
        work = self.allgather(per_input, inputs, opts)
        work._outputs = output_lists
        return work

    def all_gather_single(self, output, input, opts=None):
        _check(output, "all_gather_into_tensor", self._rank, "output")
        _check(input, "all_gather_into_tensor", self._rank, "input")
        if output.dtype != input.dtype:
            raise Error(
                f"ferroccl all_gather_into_tensor on rank {self._rank}: output dtype "
                f"{output.dtype} differs from input dtype {input.dtype}"
            )
        return self._run(
            Work([output], keep=(output, input)),
            [lambda w: self._coll(w, "all_gather", input, output, input.numel(), input.dtype)],
            "all_gather_into_tensor",
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        steps = []
        for o, i in zip(outputs, inputs):
            _check(o, "all_gather_into_tensor_coalesced", self._rank, "output")
            _check(i, "all_gather_into_tensor_coalesced", self._rank, "input")
            steps.append(lambda w, o=o, i=i: self._coll(w, "all_gather", i, o, i.numel(), i.dtype))
        return self._run(
            Work(outputs, keep=(outputs, inputs)), steps, "all_gather_into_tensor_coalesced"
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        steps, keep = [], []
        for o, ins in zip(outputs, input_lists):
            _check(o, "reduce_scatter", self._rank, "output")
            if len(ins) != self._size:
                raise Error(
                    f"ferroccl reduce_scatter on rank {self._rank}: {len(ins)} input tensors, "
                    f"group size {self._size}"
                )
            for i in ins:
                if i.numel() != o.numel() or i.dtype != o.dtype:
                    raise Error(
                        f"ferroccl reduce_scatter on rank {self._rank}: input of {i.numel()} "
                        f"{i.dtype} for output of {o.numel()} {o.dtype}"
                    )
            op = _reduce_op(opts, o.dtype, "reduce_scatter", self._rank)
            flat = _cat(ins)
            keep += [o, flat]
            steps.append(
                lambda w, o=o, flat=flat, op=op: self._coll(
                    w, "reduce_scatter", flat, o, o.numel(), o.dtype, op
                )
            )
        return self._run(Work(outputs, keep=keep), steps, "reduce_scatter")

    def reduce_scatter_single(self, output, input, opts=None):
        _check(output, "reduce_scatter_tensor", self._rank, "output")
        _check(input, "reduce_scatter_tensor", self._rank, "input")
        if output.dtype != input.dtype:
            raise Error(
                f"ferroccl reduce_scatter_tensor on rank {self._rank}: output dtype "
                f"{output.dtype} differs from input dtype {input.dtype}"
            )
        op = _reduce_op(opts, output.dtype, "reduce_scatter_tensor", self._rank)
        return self._run(
            Work([output], keep=(output, input)),
            [
                lambda w: self._coll(
                    w, "reduce_scatter", input, output, output.numel(), output.dtype, op
                )
            ],
            "reduce_scatter_tensor",
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        steps = []
        for o, i in zip(outputs, inputs):
            _check(o, "reduce_scatter_tensor_coalesced", self._rank, "output")
            _check(i, "reduce_scatter_tensor_coalesced", self._rank, "input")
            op = _reduce_op(opts, o.dtype, "reduce_scatter_tensor_coalesced", self._rank)
            steps.append(
                lambda w, o=o, i=i, op=op: self._coll(
                    w, "reduce_scatter", i, o, o.numel(), o.dtype, op
                )
            )
        return self._run(
            Work(outputs, keep=(outputs, inputs)), steps, "reduce_scatter_tensor_coalesced"
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ----- rooted and personalised exchanges (sends and receives run as one group) -----

    def _exchange(self, name, sends, recvs, outputs, post=None):
        """One group of ``sends``/``recvs`` ((tensor, peer) pairs) as one work."""
        self._flush()
        ops = [(True, t, p) for t, p in sends] + [(False, t, p) for t, p in recvs]
        work = Work(outputs, keep=[t for _, t, _ in ops], post=post)
        work._comm = self._comm
        used = list(_tensors([outputs, work._keep]))
        work._on = _on(name, self._rank, used, self._streams)
        work._expect(1)
        spans = [(s, t.data_ptr(), _nbytes(t), p) for s, t, p in ops]
        try:
            if work._on is None:
                self._comm.p2p(spans, work._done)
            else:
                work._async = self._comm.async_error
                device.adapter().begin(work._on, used)
                self._comm.p2p_on_stream(spans, *work._on[:2])
                work._done(None)
        except Exception as e:
            work._done(e if isinstance(e, Error) else Error(str(e)))
            raise
        return work

    def gather(self, output_lists, inputs, opts=None):
        root, me = (opts.rootRank if opts is not None else 0), self._rank
        (t,) = inputs
        _check(t, "gather", me, "input")
        if me != root:
            return self._exchange("gather", [(t, root)], [], output_lists)
        outs = output_lists[0]
        if len(outs) != self._size:
            raise Error(f"ferroccl gather on root {me}: {len(outs)} outputs, group size {self._size}")
        for o in outs:
            _check(o, "gather", me, "output")
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise Error(
                    f"ferroccl gather on root {me}: output of {o.numel()} {o.dtype} for input "
                    f"of {t.numel()} {t.dtype}"
                )
        outs[me].copy_(t)
        recvs = [(o, p) for p, o in enumerate(outs) if p != me]
        return self._exchange("gather", [], recvs, output_lists)

    def scatter(self, outputs, input_lists, opts=None):
        root, me = (opts.rootRank if opts is not None else 0), self._rank
        (o,) = outputs
        _check(o, "scatter", me, "output")
        if me != root:
            return self._exchange("scatter", [], [(o, root)], outputs)
        ins = input_lists[0]
        if len(ins) != self._size:
            raise Error(f"ferroccl scatter on root {me}: {len(ins)} inputs, group size {self._size}")
        for i in ins:
            _check(i, "scatter", me, "input")
            if i.numel() != o.numel() or i.dtype != o.dtype:
                raise Error(
                    f"ferroccl scatter on root {me}: input of {i.numel()} {i.dtype} for output "
                    f"of {o.numel()} {o.dtype}"
                )
        o.copy_(ins[me])
        sends = [(i, p) for p, i in enumerate(ins) if p != me]
        return self._exchange("scatter", sends, [], outputs)

    def alltoall(self, outputs, inputs, opts=None):
        me = self._rank
        if len(outputs) != self._size or len(inputs) != self._size:
            raise Error(
                f"ferroccl all_to_all on rank {me}: {len(inputs)} inputs and {len(outputs)} "
                f"outputs, group size {self._size}"
            )
        for t in list(outputs) + list(inputs):
            _check(t, "all_to_all", me)
        outputs[me].copy_(inputs[me])
        sends = [(t, p) for p, t in enumerate(inputs) if p != me]
        recvs = [(t, p) for p, t in enumerate(outputs) if p != me]
        return self._exchange("all_to_all", sends, recvs, outputs)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        me, n = self._rank, self._size
        _check(output, "all_to_all_single", me, "output")
        _check(input, "all_to_all_single", me, "input")
        if not output_splits and not input_splits:
            if input.numel() % n or output.numel() != input.numel():
                raise Error(
                    f"ferroccl all_to_all_single on rank {me}: input of {input.numel()} and "
                    f"output of {output.numel()} elements; both must be equal multiples of "
                    f"group size {n}"
                )
            return self._run(
                Work([output], keep=(output, input)),
                [
                    lambda w: self._coll(
                        w, "all_to_all", input, output, input.numel() // n, input.dtype
                    )
                ],
                "all_to_all_single",
            )

        def blocks(t, splits, what):
            rows = t.shape[0] if t.dim() else 1
            splits = list(splits) or [rows // n] * n
            if len(splits) != n or sum(splits) != rows:
                raise Error(
                    f"ferroccl all_to_all_single on rank {me}: {what} splits {splits} do not "
                    f"cover {rows} rows in {n} parts"
                )
            flat = t.view(rows, math.prod(t.shape[1:]) if t.dim() else 1)
            out, off = [], 0
            for s in splits:
                out.append(flat[off : off + s])
                off += s
            return out

        ins = blocks(input, input_splits, "input")
        outs = blocks(output, output_splits, "output")
        outs[me].copy_(ins[me])
        sends = [(t, p) for p, t in enumerate(ins) if p != me]
        recvs = [(t, p) for p, t in enumerate(outs) if p != me]
        return self._exchange("all_to_all_single", sends, recvs, [output])

    alltoall_base = all_to_all_single

    # ----- point to point -----

    def _p2p_op(self, is_send, tensors, peer, name):
        (t,) = tensors
        _check(t, name, self._rank)
        if not 0 <= peer < self._size:
            raise Error(
                f"ferroccl {name} on rank {self._rank}: invalid peer {peer} (0..{self._size - 1})"
            )
        work = Work(tensors, keep=(t,), flush=self._flush)
        work._comm = self._comm
        work._steps = 1
        # A device tensor's send or receive runs after the work issued before it on the stream
        # current now (it starts when flushed, maybe under another current stream).
        work._issued = device.adapter().issued(t)
        self._p2p.append((is_send, t, peer, work))
        return work

    def send(self, tensors, dst, tag=0):
        return self._p2p_op(True, tensors, dst, "send")

    def recv(self, tensors, src, tag=0):
        return self._p2p_op(False, tensors, src, "recv")

    def recv_anysource(self, tensors, tag=0):
        raise Error("ferroccl recv: receiving from any source is not supported; name the peer")

    def barrier(self, opts=None):
        self._flush()
        try:
            if self._comm.barrier_now():
                return DoneWork([])
        except Error as e:
            return DoneWork([], e)
        work = Work([])
        work._comm = self._comm
        work._expect(1)
        self._comm.barrier(work._done)
        return work

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.barrier().wait(timeout or datetime.timedelta(0))

    # ----- lifetime -----

    def shutdown(self):
        """Lets every operation issued so far finish (stream-ordered ones included), then
        stops the group's worker thread."""
        _LIVE.discard(self)
        self._flush()
        self._comm.close()

    def abort(self):
        _LIVE.discard(self)
        self._comm.abort()
        self._comm.close()


def _create(store, rank, size, timeout):
    return ProcessGroupFerroccl(store, rank, size, timeout)


def register():
    """Registers the backend ``"ferroccl"`` (done on import; calling again is harmless)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        # Not conditional on torch.cuda.is_available(): that initializes the CUDA driver, after
        # which processes forked from this one cannot use CUDA. The group replaces torch's
        # per-device dispatch (it is a ProcessGroup), so listing "cuda" changes nothing on a
        # machine without a GPU.
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
