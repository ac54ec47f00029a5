"""Work handles: what every ferroccl operation returns to torch.distributed."""

import datetime
import threading

import torch
import torch.distributed as dist

from ._ferroccl import Error


class Work(dist.Work):
    """One operation (possibly several native steps) running on the communicator's worker.

    ``get_future()`` is a ``torch.futures.Future`` completed with the output tensors (what
    DDP's communication hooks expect); ``wait(timeout)`` blocks with the GIL released and
    raises :class:`ferroccl.Error` if the operation failed.
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
        self._event = threading.Event()
        self._future = torch.futures.Future()
        self._lock = threading.Lock()

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
        if self._error is None and self._post is not None:
            try:
                self._post()
            except Exception as e:  # noqa: BLE001 - surfaced through wait() and the future
                self._error = Error(f"ferroccl: copying out the result failed: {e}")
        self._keep = ()
        self._post = None
        self._event.set()
        if self._error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(self._error)

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
        if not self._event.wait(secs if secs > 0 else None):
            raise Error(f"ferroccl: operation did not complete within {secs:.3f} s (wait timeout)")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        self._start()
        return self._event.is_set()

    def is_success(self):
        return self._event.is_set() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._outputs

    def get_future(self):
        self._start()
        return self._future

    def synchronize(self):
        pass
