"""Where a tensor's memory lives, and stream order for tensors in device memory.

The process group asks the installed adapter (:func:`adapter`) for its temporary tensors
(:meth:`TorchCuda.empty`) and, for a call on device tensors:

- :meth:`TorchCuda.where`: the device and the handle of the stream the call is queued on;
- :meth:`TorchCuda.begin`: ties that stream to the caller's work before the call is queued;
- :meth:`TorchCuda.settle` and :meth:`TorchCuda.ordered`: where the call's own tensor copies
  (``all_gather`` into a list, ...) run after it;
- :meth:`TorchCuda.mark`: what ``Work.wait()`` makes the waiting stream wait for;
- :meth:`TorchCuda.future`: the future DDP's communication hooks chain on.

:class:`TorchCuda` is the adapter for PyTorch's CUDA tensors, in ProcessGroupNCCL's manner: each
device has a side stream of its own; a call's side stream first waits for the caller's current
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
    """PyTorch's CUDA tensors, queued on a side stream per device."""

    def __init__(self):
        self._side = {}

    def _stream(self, index):
        s = self._side.get(index)
        if s is None:
            s = self._side[index] = torch.cuda.Stream(device=index)
        return s

    def where(self, t):
        """``None`` for a CPU tensor, else ``(device index, side stream handle)``."""
        if t.device.type != "cuda":
            return None
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return index, self._stream(index).cuda_stream

    def empty(self, numel, like):
        """A new 1-D tensor of ``numel`` elements of ``like``'s dtype where ``like`` lives."""
        return torch.empty(numel, dtype=like.dtype, device=like.device)

    def begin(self, on, tensors):
        """Before a call on ``tensors`` is queued: its stream waits for the current stream's
        work, and each tensor is marked as used on it."""
        side = self._stream(on[0])
        side.wait_stream(torch.cuda.current_stream(on[0]))
        for t in tensors:
            if t.device.type == "cuda":
                t.record_stream(side)

    def settle(self, on):
        """Before the call's own tensor copies: nothing (they are queued after it)."""

    def ordered(self, on):
        """The context the call's own copies, its mark and its future's result are made in."""
        return torch.cuda.stream(self._stream(on[0]))

    def mark(self, on):
        """An event recorded on the call's stream after the call (and its copies)."""
        ev = torch.cuda.Event()
        ev.record(self._stream(on[0]))
        return _CudaMark(ev)

    def future(self, on):
        """A future that, once completed with CUDA tensors, makes its waiters' streams wait."""
        return torch.futures.Future(devices=[torch.device("cuda", on[0])])


class _CudaMark:
    def __init__(self, ev):
        self._ev = ev

    def wait(self):
        torch.cuda.current_stream().wait_event(self._ev)

    def query(self):
        return self._ev.query()


class HostOrder:
    """What an adapter whose device work is run by waiting (the stand-in) needs for
    :meth:`TorchCuda.begin` and :meth:`TorchCuda.ordered`: nothing."""

    def begin(self, on, tensors):
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
