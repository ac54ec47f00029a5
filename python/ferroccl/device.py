"""Where a tensor's memory lives, and stream order for tensors in device memory.

The process group asks the installed adapter (:func:`adapter`) for its temporary tensors
(:meth:`TorchCuda.empty`) and four things about a device tensor's call: where it runs (:meth:`TorchCuda.where`: the device index and the handle of the
stream the call is ordered on), what to do before the call's own tensor copies
(:meth:`TorchCuda.settle`), how a waiter catches up with the call (:meth:`TorchCuda.mark`), and
the future a DDP communication hook chains on (:meth:`TorchCuda.future`).

:class:`TorchCuda` is the adapter for PyTorch's CUDA tensors: a call is queued on the current
stream of the tensor's device (as NCCL's calls are) and returns at once; the call's copies
(``all_gather`` into a list, ...) are queued on the same stream after it; ``Work.wait()`` makes
the waiting thread's current stream wait for the call. Tests on machines without a GPU install
another adapter (:func:`install`) whose "device tensors" are host tensors over the host
stand-in provider's device memory (``FERRO_DEVICE_PROVIDER=host``).
"""

import torch


class TorchCuda:
    """PyTorch's CUDA tensors, ordered on the current stream of their device."""

    def where(self, t):
        """``None`` for a CPU tensor, else ``(device index, stream handle)``."""
        if t.device.type != "cuda":
            return None
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return index, torch.cuda.current_stream(index).cuda_stream

    def empty(self, numel, like):
        """A new 1-D tensor of ``numel`` elements of ``like``'s dtype where ``like`` lives."""
        return torch.empty(numel, dtype=like.dtype, device=like.device)

    def settle(self, on):
        """Before the call's own tensor copies: nothing, they are queued on the same stream."""

    def mark(self, on):
        """An event recorded on the call's stream after the call (and its copies)."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(on[0]))
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


_ADAPTER = TorchCuda()


def adapter():
    """The adapter in use."""
    return _ADAPTER


def install(a):
    """Uses ``a`` (an object with :class:`TorchCuda`'s methods) from now on; returns the old one."""
    global _ADAPTER
    old, _ADAPTER = _ADAPTER, a
    return old
