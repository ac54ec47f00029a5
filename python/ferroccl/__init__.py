"""ferroccl as a ``torch.distributed`` backend.

Importing this package registers the backend ``"ferroccl"`` for CPU tensors::

    import ferroccl  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group("ferroccl")        # torchrun, env://, tcp://, file:// all work
    dist.all_reduce(torch.ones(4))

Errors from ferroccl are raised as :class:`ferroccl.Error` (a ``RuntimeError``) carrying
ferroccl's message: operation, sequence number, rank and peer.
"""

from ._ferroccl import Error
from .backend import ProcessGroupFerroccl, register

__all__ = ["Error", "ProcessGroupFerroccl", "register"]

register()
