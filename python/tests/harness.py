"""Starts N ranks as processes (forked by torch.multiprocessing, file:// rendezvous) and reports
failures. The parent process never joins a process group, so no communicator thread is forked.

A test is a module-level function ``fn(rank, world, *args)``; it runs with the process group
already initialised and fails by raising.
"""

import datetime
import os
import sys
import tempfile
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

import ferroccl  # noqa: F401  (registers the backend)


def _entry(rank, fn, world, backend, init_file, timeout_s, args):
    try:
        dist.init_process_group(
            backend,
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        fn(rank, world, *args)
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def spawn(fn, world, backend="ferroccl", timeout_s=60, args=()):
    """Runs ``fn`` on ``world`` ranks; raises if any rank failed."""
    fd, init_file = tempfile.mkstemp(prefix="ferroccl-test-")
    os.close(fd)
    os.unlink(init_file)
    try:
        mp.start_processes(
            _entry,
            args=(fn, world, backend, init_file, timeout_s, args),
            nprocs=world,
            join=True,
            start_method="fork",
        )
    finally:
        if os.path.exists(init_file):
            os.unlink(init_file)


class Results:
    """Counts passed and failed cases and prints one line per failure."""

    def __init__(self):
        self.passed = 0
        self.failed = []

    def run(self, name, f, *args, **kwargs):
        try:
            f(*args, **kwargs)
            self.passed += 1
            print(f"ok    {name}", flush=True)
        except Exception as e:  # noqa: BLE001
            self.failed.append(name)
            print(f"FAIL  {name}: {type(e).__name__}: {e}", flush=True)

    def finish(self, what):
        print(f"{what}: {self.passed} passed, {len(self.failed)} failed", flush=True)
        if self.failed:
            for n in self.failed:
                print(f"  failed: {n}")
            sys.exit(1)
