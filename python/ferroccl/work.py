"""Work handles: what every ferroccl operation returns to torch.distributed."""

import datetime
import threading

import torch
import torch.distributed as dist

from . import device
from ._ferroccl import Error


class Work(dist.Work):
    """One operation (possibly several native steps) running on the communicator's worker.

    ``get_future()`` is a ``torch.futures.Future`` completed with the output tensors (what
    DDP's communication hooks expect); ``wait(timeout)`` blocks with the GIL released and
    raises :class:`ferroccl.Error` if the operation failed.

    On a device (``_on`` set: device index and stream), the native steps are queued on the
    stream and call back as soon as they are queued; ``wait()`` then makes the waiting thread's
    current stream wait for the operation (NCCL's semantics), ``is_completed()`` asks the
    device, and the future is the adapter's (``ferroccl.device``). An error of a queued step
    shows at the next ``wait()`` and in every later operation.
    """

    def __init__(self, outputs, keep=(), post=None, flush=None):
        super().__init__()
        self._outputs = outputs
        # Tensors whose memory the native side uses until the operation ends.
        self._keep = keep
        # Runs on success before the future completes (copies out of staging buffers).
        self._post = post
        # Called before waiting (sends and receives are queued until someone waits on them).
        self._flush = flush
        self._steps = 0
        self._error = None
        self._completed = False
        self._event = threading.Event()
        # Made on the first get_future(): most works are only waited on.
        self._future = None
        self._lock = threading.Lock()
        # On a device: the adapter's (device index, stream handle, stream); the mark recorded
        # after the operation; the communicator's asynchronous error (a callable).
        self._on = None
        self._mark = None
        self._async = None
        # A send or receive on a device: where it was issued (the adapter's token).
        self._issued = None
        # The native communicator it runs on (its ``on_worker`` says whether the calling
        # thread is the one that would complete it).
        self._comm = None

    def _expect(self, steps):
        """The operation completes after ``steps`` native steps have called back."""
        self._steps = steps
        if steps == 0:
            self._finish()

    def _done(self, err):
        """Callback of one native step (runs on the worker thread, GIL held)."""
        with self._lock:
            if err is not None and self._error is None:
                self._error = err
            self._steps -= 1
            last = self._steps == 0
        if last:
            self._finish()

    def _finish(self):
        on = self._on
        if on is None:
            self._post_copy()
            self._keep = ()
        else:
            # On a device: the copies and the mark are queued after the call on its stream,
            # and the tensors stay referenced while the work lives.
            ad = device.adapter()
            try:
                if self._error is None:
                    ad.settle(on)
                with ad.ordered(on):
                    self._post_copy()
                    if self._error is None:
                        self._mark = ad.mark(on)
            except Exception as e:  # noqa: BLE001 - surfaced through wait() and the future
                self._error = Error(f"ferroccl: ordering the result on the device failed: {e}")
        self._post = None
        with self._lock:
            self._completed = True
            fut = self._future
        self._event.set()
        if fut is not None:
            self._complete(fut)

    def _post_copy(self):
        if self._error is None and self._post is not None:
            try:
                self._post()
            except Exception as e:  # noqa: BLE001 - surfaced through wait() and the future
                self._error = Error(f"ferroccl: copying out the result failed: {e}")

    def _complete(self, fut):
        """Completes ``fut``; on a device, in the call's stream order (its events mark it)."""
        if self._on is None or self._error is not None:
            _complete(fut, self._outputs, self._error)
            return
        with device.adapter().ordered(self._on):
            _complete(fut, self._outputs, self._error)

    def _fail(self, err):
        self._error = err
        self._steps = 0
        self._finish()

    def _start(self):
        if self._flush is not None:
            flush, self._flush = self._flush, None
            flush()

    def wait(self, timeout=datetime.timedelta(0)):
        self._start()
        if isinstance(timeout, datetime.timedelta):
            secs = timeout.total_seconds()
        else:
            secs = float(timeout or 0)
        comm = self._comm
        if not self._event.is_set() and comm is not None and comm.on_worker:
            # A callback (a future's ``then``) waiting for an operation queued before it was
            # issued: that operation runs on this thread after the callback returns.
            raise Error(
                f"ferroccl: wait() on rank {comm.rank} in a callback on the communicator's "
                "worker thread, for an operation queued behind the callback: it would wait "
                "for itself (chain it with get_future().then(...) instead)"
            )
        if not self._event.wait(secs if secs > 0 else None):
            raise Error(f"ferroccl: operation did not complete within {secs:.3f} s (wait timeout)")
        if self._error is not None:
            raise self._error
        self._device_wait()
        return True

    def _device_wait(self):
        if self._async is not None:
            err = self._async()
            if err is not None:
                raise Error(err)
        if self._mark is not None:
            self._mark.wait()

    def is_completed(self):
        self._start()
        return self._event.is_set() and (self._mark is None or self._mark.query())

    def is_success(self):
        return self._event.is_set() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._outputs

    def get_future(self):
        self._start()
        with self._lock:
            fut, now = self._future, False
            if fut is None:
                if self._on is not None:
                    fut = self._future = device.adapter().future(self._on)
                else:
                    fut = self._future = torch.futures.Future()
                now = self._completed
        if now:
            self._complete(fut)
        return fut

    def synchronize(self):
        if self._event.is_set() and self._error is None:
            self._device_wait()


def _complete(fut, outputs, error):
    if error is None:
        fut.set_result(outputs)
    else:
        fut.set_exception(error)


class DoneWork(dist.Work):
    """An operation that completed before its call returned (small messages run on the calling
    thread when nothing else is queued): the same interface as :class:`Work`, with no event,
    lock or callback; ``error`` is the operation's :class:`ferroccl.Error`, or ``None``.
    """

    def __init__(self, outputs, error=None):
        super().__init__()
        self._outputs = outputs
        self._error = error

    def wait(self, timeout=datetime.timedelta(0)):
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._outputs

    def get_future(self):
        fut = torch.futures.Future()
        _complete(fut, self._outputs, self._error)
        return fut

    def synchronize(self):
        pass
