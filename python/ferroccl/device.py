"""Where a tensor's memory lives, and stream order for tensors in device memory.

The process group asks the installed adapter (:func:`adapter`) for its temporary tensors
(:meth:`TorchCuda.empty`) and, for a call on device tensors:

- :meth:`TorchCuda.where`: the device and the stream the call is queued on;
- :meth:`TorchCuda.issued` and :meth:`TorchCuda.begin`: tie that stream to the caller's work
  (for a send or receive, the work issued before it) before the call is queued;
- :meth:`TorchCuda.settle` and :meth:`TorchCuda.ordered`: where the call's own tensor copies
  (``all_gather`` into a list, ...) run after it;
- :meth:`TorchCuda.mark`: what ``Work.wait()`` makes the waiting stream wait for;
- :meth:`TorchCuda.future`: the future DDP's communication hooks chain on.

:class:`TorchCuda` is the adapter for PyTorch's CUDA tensors, in ProcessGroupNCCL's manner: each
process group has a side stream per device; a call's side stream first waits for the caller's current
stream, the call is queued on the side stream (ferroccl's stream-ordered calls return at once),
every tensor is marked as used there (``record_stream``, so PyTorch's allocator does not reuse
its memory early), and ``Work.wait()`` makes the waiting thread's current stream wait for an
event recorded after the call. A call queued on the default stream itself would run in the
blocking form (ferroccl cannot order a call on the legacy default stream), so the side stream
also keeps the default-stream user's calls asynchronous.

Tests on machines without a GPU install another adapter (:func:`install`) whose "device
tensors" are host tensors over the host stand-in provider's device memory
(``FERRO_DEVICE_PROVIDER=host``).
"""

import contextlib

import torch


class TorchCuda:
    """PyTorch's CUDA tensors, queued on a side stream per process group and device."""

    def where(self, t, streams):
        """``None`` for a CPU tensor, else ``(device index, side stream handle, side
        stream)``; ``streams`` is the process group's cache of side streams by device."""
        if t.device.type != "cuda":
            return None
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        s = streams.get(index)
        if s is None:
            s = streams[index] = torch.cuda.Stream(device=index)
        return index, s.cuda_stream, s

    def empty(self, numel, like):
        """A new 1-D tensor of ``numel`` elements of ``like``'s dtype where ``like`` lives."""
        return torch.empty(numel, dtype=like.dtype, device=like.device)

    def issued(self, t):
        """For a send or receive queued now and started later: an event on the current
        stream of ``t``'s device, which its side stream will wait for (``None`` on the
        host)."""
        if t.device.type != "cuda":
            return None
        _refuse_capture(t.device.index)
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(t.device))
        return ev

    def begin(self, on, tensors, after=None):
        """Before a call on ``tensors`` is queued: its side stream waits for the current
        stream's work (or, given ``after``, for those events), and each tensor is marked as
        used on it. A stream being captured into a CUDA graph is refused: the call runs on a
        host thread, outside any graph."""
        index, _, side = on
        current = torch.cuda.current_stream(index)
        _refuse_capture(index)
        if after is None:
            side.wait_stream(current)
        else:
            for ev in after:
                side.wait_event(ev)
        for t in tensors:
            if t.device.type == "cuda":
                t.record_stream(side)

    def settle(self, on):
        """Before the call's own tensor copies: nothing (they are queued after it)."""

    def ordered(self, on):
        """The context the call's own copies, its mark and its future's result are made in."""
        return torch.cuda.stream(on[2])

    def mark(self, on):
        """An event recorded on the call's stream after the call (and its copies)."""
        ev = torch.cuda.Event()
        ev.record(on[2])
        return _CudaMark(ev, on[0])

    def future(self, on):
        """A future that, once completed with CUDA tensors, makes its waiters' streams wait."""
        return torch.futures.Future(devices=[torch.device("cuda", on[0])])


def _refuse_capture(index):
    """Raises if the current stream of device ``index`` is being captured into a CUDA graph:
    a ferroccl call runs on a host thread, outside any graph."""
    with torch.cuda.device(index):
        capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        raise RuntimeError(
            "ferroccl: the current CUDA stream is being captured into a CUDA graph; "
            "ferroccl's collectives cannot be captured (run them outside the capture)"
        )


class _CudaMark:
    def __init__(self, ev, index):
        self._ev = ev
        self._index = index

    def wait(self):
        # The current stream of the call's device: another device's would wait in vain.
        torch.cuda.current_stream(self._index).wait_event(self._ev)

    def query(self):
        return self._ev.query()


class HostOrder:
    """What an adapter whose device work is run by waiting (the stand-in) needs for
    :meth:`TorchCuda.begin` and :meth:`TorchCuda.ordered`: nothing."""

    def issued(self, t):
        return None

    def begin(self, on, tensors, after=None):
        pass

    def ordered(self, on):
        return contextlib.nullcontext()


_ADAPTER = TorchCuda()


def adapter():
    """The adapter in use."""
    return _ADAPTER


def install(a):
    """Uses ``a`` (an object with :class:`TorchCuda`'s methods) from now on; returns the old one."""
    global _ADAPTER
    old, _ADAPTER = _ADAPTER, a
    return old
