#!/usr/bin/env python3
"""PyTorch DDP (gloo backend, CPU) ResNet throughput benchmark: the baseline beside resnet_ddp.

The same experiment as `ferrorun -n N -- resnet_ddp --data synthetic ...`: torchvision's
ResNet-18/34/50 (with the small-image stem when --image-size <= 64: conv1 3x3 stride 1, no max
pool), one synthetic batch per rank made once before timing (random images, fixed labels), SGD
with momentum 0.9 and weight decay 5e-4, cross-entropy, DistributedDataParallel over gloo with
--bucket-mb buckets. After --warmup-steps steps, --steps steps are timed; rank 0 prints

    RESULT {"impl": "torch-ddp-gloo", "arch": ..., "images_per_sec": ..., "step_ms": {...}, ...}

Launch, either way:

    python torch_ddp.py --nranks 2 --arch resnet18 --batch-size 32 --steps 20
    torchrun --standalone --nproc_per_node 2 torch_ddp.py --arch resnet18 --batch-size 32 --steps 20

With --nranks N (and no RANK/WORLD_SIZE in the environment) the script starts N copies of
itself on this machine with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) and a free port, waits for them and stops the others when one fails. Without
either, it runs as a single rank.

Timing. Every timed step is split into forward (model and loss), loss.backward() (which with
DDP launches the bucket allreduces and waits for the last of them) and optimizer (step +
zero_grad); total is the wall time of the loop divided by the steps. Phase times are averaged
over ranks; images/s uses the slowest rank's wall time.

The step_ms phases are disjoint, as resnet_ddp reports them (forward + backward + comm_wait +
optimizer = total, less loop overhead). DDP waits for its allreduces inside backward, so
comm_wait is an estimate: after the timed steps, --nosync-steps pairs of steps run, one
ordinary and one under `no_sync()` (no allreduce); comm_wait is the mean difference of their
backward times (at least 0), and step_ms.backward is the measured backward less comm_wait
(the measured one is backward_incl_comm_wait). comm_ms is the time to allreduce the whole
gradient in --bucket-mb pieces with nothing else running, and comm_hidden_fraction =
1 - comm_wait / comm_ms (clamped to 0..1; null on one rank). --nosync-steps 0 skips the
estimate: comm_wait, comm_ms and comm_hidden_fraction are then null and backward includes
the wait.

DDP's default of broadcasting batch-norm buffers from rank 0 before every forward is off here,
as in resnet_ddp (buffers are broadcast once, at start); --broadcast-buffers turns it on.
"""
import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

ARCHS = ("resnet18", "resnet34", "resnet50")
IMPL = "torch-ddp-gloo"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    p.add_argument("--arch", default="resnet18", choices=ARCHS)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--width", type=int, default=64,
                   help="base channel count (64 is torchvision's ResNet)")
    b = p.add_mutually_exclusive_group()
    b.add_argument("--batch-size", type=int, default=None, help="images per rank per step (default 32)")
    b.add_argument("--global-batch", type=int, default=None,
                   help="images per step over all ranks; each rank takes global/nranks")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--data", default="synthetic", choices=("synthetic",),
                   help="only synthetic data (accepted for symmetry with resnet_ddp)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nosync-steps", type=int, default=None,
                   help="steps with no_sync() backward for the comm_wait estimate "
                        "(default min(steps, 10); 0 skips the estimate)")
    p.add_argument("--broadcast-buffers", action="store_true",
                   help="DDP broadcast_buffers=True (rank 0's batch-norm buffers before every forward)")
    p.add_argument("--gradient-as-bucket-view", action="store_true",
                   help="DDP gradient_as_bucket_view=True (gradients live in the buckets, one copy less)")
    p.add_argument("--malloc", default="keep", choices=("keep", "system"),
                   help="freed memory: keep it for the next step (glibc mallopt: blocks up to 1 GiB "
                        "from the heap, no trim below 1 GiB free), or the C library's defaults; "
                        "resnet_ddp's --malloc does the same")
    p.add_argument("--nranks", type=int, default=None,
                   help="start this many local ranks (unless RANK/WORLD_SIZE are set, as by torchrun)")
    p.add_argument("--master-port", type=int, default=0, help="with --nranks: port (default: a free one)")
    p.add_argument("--timeout", type=float, default=600.0, help="gloo collective timeout, seconds")
    args = p.parse_args(argv)
    for name in ("steps", "threads", "image_size", "num_classes", "width"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    if args.warmup_steps < 0:
        p.error(f"--warmup-steps must be at least 0 (got {args.warmup_steps})")
    if args.bucket_mb <= 0:
        p.error(f"--bucket-mb must be positive (got {args.bucket_mb})")
    if args.nranks is not None and args.nranks < 1:
        p.error(f"--nranks must be at least 1 (got {args.nranks})")
    nranks = int(os.environ.get("WORLD_SIZE", args.nranks or 1))
    if args.global_batch is not None and args.global_batch < nranks:
        p.error(f"--global-batch {args.global_batch} is smaller than the number of ranks ({nranks})")
    return args


# --- launcher ---------------------------------------------------------------------------------


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    """Starts args.nranks copies of this script with torchrun's environment; returns the exit
    status (the first failing rank's, after stopping the rest)."""
    n = args.nranks
    port = args.master_port or free_port()
    procs = []
    for rank in range(n):
        env = dict(os.environ)
        env.update(RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("OMP_NUM_THREADS", str(args.threads))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + argv,
                                      env=env, stdin=subprocess.DEVNULL))
    status = 0
    pending = list(enumerate(procs))
    try:
        while pending:
            for item in list(pending):
                rank, proc = item
                rc = proc.poll()
                if rc is None:
                    continue
                pending.remove(item)
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 128 - rc
                    print(f"torch_ddp.py: rank {rank} exited with status {rc}; stopping the others",
                          file=sys.stderr)
                    for _, other in pending:
                        other.terminate()
            time.sleep(0.05)
    except KeyboardInterrupt:
        for proc in procs:
            proc.terminate()
        status = 130
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return status


# --- model ------------------------------------------------------------------------------------


def build_model(args):
    import torch.nn as nn
    import torchvision

    model = getattr(torchvision.models, args.arch)(weights=None, num_classes=args.num_classes)
    w = args.width
    if w != 64:
        # torchvision fixes the base width at 64; rebuild the stages with base w through the
        # class's own layer builder, then re-initialise as torchvision does.
        block = type(model.layer1[0])
        depths = [len(getattr(model, f"layer{i}")) for i in range(1, 5)]
        model.inplanes = w
        model.conv1 = nn.Conv2d(3, w, kernel_size=7, stride=2, padding=3, bias=False)
        model.bn1 = nn.BatchNorm2d(w)
        model.layer1 = model._make_layer(block, w, depths[0])
        model.layer2 = model._make_layer(block, 2 * w, depths[1], stride=2)
        model.layer3 = model._make_layer(block, 4 * w, depths[2], stride=2)
        model.layer4 = model._make_layer(block, 8 * w, depths[3], stride=2)
        model.fc = nn.Linear(8 * w * block.expansion, args.num_classes)
    if args.image_size <= 64:
        # Small-image stem (as for CIFAR): 3x3 stride-1 first convolution, no max pool.
        model.conv1 = nn.Conv2d(3, w, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


# --- worker -----------------------------------------------------------------------------------


def configure_malloc(mode):
    """resnet_ddp's --malloc: with "keep", glibc serves blocks up to 1 GiB from its heap and
    keeps up to 1 GiB of freed memory instead of unmapping it. Returns whether it took."""
    if mode == "system":
        return True
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    keep = 1 << 30
    return all(mallopt(p, keep) == 1 for p in (m_mmap_threshold, m_trim_threshold, m_top_pad))


def worker(args):
    if not configure_malloc(args.malloc):
        print(f"torch_ddp: --malloc {args.malloc}: the C allocator did not take these settings; "
              "using its defaults", file=sys.stderr)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    rank = int(os.environ.get("RANK", "0"))
    nranks = int(os.environ.get("WORLD_SIZE", "1"))
    if "MASTER_ADDR" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.master_port or free_port()))
    import datetime
    dist.init_process_group("gloo", rank=rank, world_size=nranks,
                            timeout=datetime.timedelta(seconds=args.timeout))

    if args.global_batch is not None:
        per_rank = args.global_batch // nranks
        if per_rank < 1:
            raise SystemExit(f"torch_ddp.py: --global-batch {args.global_batch} is smaller than "
                             f"the number of ranks ({nranks})")
        if rank == 0 and per_rank * nranks != args.global_batch:
            print(f"torch_ddp.py: --global-batch {args.global_batch} is not a multiple of "
                  f"{nranks} ranks; using {per_rank} per rank ({per_rank * nranks} in all)",
                  file=sys.stderr)
    else:
        per_rank = args.batch_size if args.batch_size is not None else 32
    global_batch = per_rank * nranks

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = build_model(args)
    # Buffers are synchronised once at construction; per forward only with --broadcast-buffers.
    # Newer releases name the per-forward switch forward_sync_buffers.
    import inspect
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        sync = {"forward_sync_buffers": args.broadcast_buffers}
    else:
        sync = {"broadcast_buffers": args.broadcast_buffers}
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb,
              gradient_as_bucket_view=args.gradient_as_bucket_view, **sync)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)
    loss_fn = nn.CrossEntropyLoss()

    # One synthetic batch per rank, made before any timing.
    g = torch.Generator().manual_seed(args.seed * 1000003 + rank)
    x = torch.randn(per_rank, 3, args.image_size, args.image_size, generator=g)
    y = torch.randint(0, args.num_classes, (per_rank,), generator=g)

    clock = time.perf_counter

    def step(times=None, sync=True):
        # DDP decides in forward whether the coming backward allreduces, so no_sync() covers
        # both; a step without sync only measures, it does not update the weights.
        with contextlib.nullcontext() if sync else ddp.no_sync():
            t0 = clock()
            loss = loss_fn(ddp(x), y)
            t1 = clock()
            loss.backward()
            t2 = clock()
        if sync:
            opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = clock()
        if times is not None:
            times[0] += t1 - t0
            times[1] += t2 - t1
            times[2] += t3 - t2
        return loss

    for _ in range(args.warmup_steps):
        step()
    dist.barrier()
    phases = [0.0, 0.0, 0.0]
    start = clock()
    for _ in range(args.steps):
        loss = step(phases)
    wall = clock() - start
    last_loss = float(loss.detach())

    nosync = args.nosync_steps if args.nosync_steps is not None else min(args.steps, 10)
    wait_s = comm_ms = None
    if nosync > 0:
        # Pairs of steps, with and without the allreduce, so that both halves of the difference
        # see the same load from elsewhere on the machine.
        dist.barrier()
        with_sync, without = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
        for _ in range(nosync):
            step(with_sync)
            step(without, sync=False)
        wait_s = (with_sync[1] - without[1]) / nosync
        # The whole gradient, allreduced in bucket-sized pieces with nothing else running.
        numel = sum(p.numel() for p in ddp.parameters() if p.requires_grad)
        bucket = max(1, int(args.bucket_mb * (1 << 20)) // 4)
        pieces = [torch.zeros(min(bucket, numel - off)) for off in range(0, numel, bucket)]
        for piece in pieces:  # warm-up
            dist.all_reduce(piece)
        dist.barrier()
        reps = 3
        t0 = clock()
        for _ in range(reps):
            works = [dist.all_reduce(piece, async_op=True) for piece in pieces]
            for w in works:
                w.wait()
        comm_ms = (clock() - t0) / reps * 1e3

    # Phase times averaged over ranks; throughput from the slowest rank's wall time.
    vals = [phases[0], phases[1], phases[2], wait_s or 0.0, comm_ms or 0.0]
    mean = torch.tensor(vals, dtype=torch.float64)
    dist.all_reduce(mean)
    mean /= nranks
    slowest = torch.tensor([wall], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)

    if rank == 0:
        fwd, bwd, optim = (float(v) / args.steps * 1e3 for v in mean[:3])
        total_ms = float(slowest[0]) / args.steps * 1e3
        comm_wait = hidden = comm_est = None
        bwd_incl = bwd
        if nosync > 0:
            comm_wait = min(bwd_incl, max(0.0, float(mean[3]) * 1e3))
            bwd = bwd_incl - comm_wait
            comm_est = float(mean[4])
            if nranks > 1 and comm_est > 0:
                hidden = min(1.0, max(0.0, 1.0 - comm_wait / comm_est))
        ips = global_batch * args.steps / float(slowest[0])
        result = {
            "impl": IMPL,
            "arch": args.arch,
            "image_size": args.image_size,
            "nranks": nranks,
            "batch_per_rank": per_rank,
            "global_batch": global_batch,
            "steps": args.steps,
            "images_per_sec": round(ips, 3),
            "images_per_sec_per_rank": round(ips / nranks, 3),
            "step_ms": {
                "forward": round(fwd, 3),
                "backward": round(bwd, 3),
                "comm_wait": None if comm_wait is None else round(comm_wait, 3),
                "optimizer": round(optim, 3),
                "total": round(total_ms, 3),
            },
            "comm_hidden_fraction": None if hidden is None else round(hidden, 4),
            "backward_incl_comm_wait": round(bwd_incl, 3),
            "comm_ms": None if comm_est is None else round(comm_est, 3),
            "comm_wait_method": "backward minus no_sync backward" if nosync > 0 else None,
            "threads": args.threads,
            "bucket_mb": args.bucket_mb,
            "warmup_steps": args.warmup_steps,
            "width": args.width,
            "broadcast_buffers": args.broadcast_buffers,
            "gradient_as_bucket_view": args.gradient_as_bucket_view,
            "malloc": args.malloc,
            "loss": round(last_loss, 5),
            "torch": torch.__version__,
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main():
    argv = sys.argv[1:]
    args = parse_args(argv)
    if args.nranks is not None and "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return launch(args, argv)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
