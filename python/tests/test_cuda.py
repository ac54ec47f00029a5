"""On a machine with a GPU: the process group on PyTorch's CUDA tensors.

1. ``test_device.py``'s checks (every collective x dtypes x counts, sends and receives, rooted
   exchanges, errors) on CUDA tensors of device 0, ranks as processes sharing the GPU;
2. DDP and FSDP2 train ``test_train.py``'s model on CUDA tensors over ferroccl, and must end
   with the parameters gloo reaches on CPU tensors (to float rounding).

Exits 77 without a CUDA device (``scripts/gpu-check.sh`` reports that as skipped).

    python test_cuda.py [world sizes...]     # default: 2
"""

import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402
import test_device  # noqa: E402
import test_train  # noqa: E402


def on_gpu(m):
    torch.cuda.set_device(0)
    return m.cuda()


def train_cuda(m, rank):
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for x, y in test_train.batches(rank):
        opt.zero_grad()
        nn.functional.cross_entropy(m(x.cuda()), y.cuda()).backward()
        opt.step()


def ddp_cuda(rank, world, out):
    m = nn.parallel.DistributedDataParallel(
        on_gpu(test_train.model()), device_ids=[0], bucket_cap_mb=0.01
    )
    train_cuda(m, rank)
    if rank == 0:
        torch.save({k: v.detach().cpu() for k, v in m.module.state_dict().items()}, out)


def fsdp2_cuda(rank, world, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    m = on_gpu(test_train.model())
    mesh = init_device_mesh("cuda", (world,))
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    train_cuda(m, rank)
    full = {k: v.full_tensor().detach().cpu() for k, v in m.state_dict().items()}
    if rank == 0:
        torch.save(full, out)


def against_gloo_on_cpu(cuda_fn, cpu_fn, world):
    with tempfile.TemporaryDirectory() as d:
        ref, got = os.path.join(d, "gloo"), os.path.join(d, "ferroccl")
        harness.spawn(cpu_fn, world, backend="gloo", timeout_s=120, args=(ref,))
        harness.spawn(cuda_fn, world, backend="ferroccl", timeout_s=120, args=(got,))
        ref, got = torch.load(ref), torch.load(got)
    start = test_train.model().state_dict()
    moved = False
    for k, v in ref.items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")
        moved |= not torch.allclose(v, start[k])
    assert moved, "training did not change the parameters"


def gpu_seen():
    """Whether PyTorch sees a GPU, asked in a child process: asking here would initialize the
    CUDA driver in this process, and the ranks forked from it could not use CUDA."""
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def main():
    if not gpu_seen():
        print("test_cuda: PyTorch sees no CUDA device; skipped", flush=True)
        sys.exit(77)
    res = harness.Results()
    for world in [int(a) for a in sys.argv[1:]] or (2,):
        for fn in (test_device.collectives, test_device.exchanges, test_device.errors,
                   test_device.leaving):
            res.run(f"{fn.__name__} on CUDA, world {world}", harness.spawn, fn, world,
                    timeout_s=120, args=("cuda",))
        res.run(f"DDP on CUDA matches gloo on CPU, world {world}", against_gloo_on_cpu,
                ddp_cuda, test_train.ddp, world)
        res.run(f"FSDP2 on CUDA matches gloo on CPU, world {world}", against_gloo_on_cpu,
                fsdp2_cuda, test_train.fsdp2, world)
    res.finish("test_cuda")


if __name__ == "__main__":
    main()
