"""PyTorch's data-parallel anchor (issue 16): the reference LSTM step of torch_anchor.py,
trained with DistributedDataParallel over NCCL, eager and as one whole-step CUDA graph
per rank, at a per-GPU batch of 32, t=64, h=256.

Run: python3 torch_ddp_anchor.py [--world N] [--kinds unrolled,cudnn] [--iters 50]
It starts one process per rank (N defaults to every visible GPU) and prints one JSON line
per measurement from rank 0: milliseconds per step, the median of five rounds of `iters`
steps timed with CUDA events, as torch_anchor.py times them. With N=1 the step still
runs DDP's all-reduce (over one rank): the reference for scaling efficiency.

Whole-step capture with DDP follows PyTorch's CUDA-graph notes: NCCL >= 2.9.6, async
error handling off, DDP built and warmed up (11 iterations) on a side stream before the
capture. NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as on every machine here.
"""
import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_anchor import Net  # noqa: E402  the same model as the single-GPU anchor

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def bench(rank, world, kind, graphed, b, t, h, iters, d_in=32):
    dev = torch.device("cuda", rank)
    torch.manual_seed(0)
    model = Net(kind, d_in, h).to(dev)
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        ddp = DDP(model, device_ids=[rank], gradient_as_bucket_view=True)
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3, capturable=graphed)
        gen = torch.Generator(device=dev).manual_seed(rank)
        x = torch.randn(b, t, d_in, device=dev, generator=gen)
        y = torch.randn(b, t, 1, device=dev, generator=gen)

        def step():
            opt.zero_grad(set_to_none=False)
            loss = ((ddp(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            return loss

        for _ in range(11):
            step()
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    run = step
    if graphed:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        run = g.replay
    for _ in range(5):
        run()
    torch.cuda.synchronize(dev)
    times = []
    for _ in range(5):
        dist.barrier()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        torch.cuda.synchronize(dev)
        times.append(start.elapsed_time(end) / iters)
    return statistics.median(times)


def worker(rank, world, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    b, t, h = args.size
    for kind in args.kinds.split(","):
        for graphed in (False, True):
            try:
                ms = bench(rank, world, kind, graphed, b, t, h, args.iters)
            except Exception as e:  # reported, and the other rows still run
                ms = f"ERR {type(e).__name__}: {e}"[:160]
            if rank == 0:
                row = dict(anchor="torch-ddp", world=world, b=b, t=t, h=h, kind=kind, graphed=graphed, ms=ms)
                print(json.dumps(row), flush=True)
    if rank == 0:
        print(json.dumps(dict(torch=torch.__version__, nccl=".".join(map(str, torch.cuda.nccl.version())),
                              gpu=torch.cuda.get_device_name(0), world=world)), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=torch.cuda.device_count())
    parser.add_argument("--kinds", default="unrolled,cudnn")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--size", type=lambda s: tuple(int(v) for v in s.split("/")), default=(32, 64, 256))
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    if args.world > torch.cuda.device_count():
        sys.exit(f"--world {args.world}: only {torch.cuda.device_count()} GPU(s) visible")
    mp.spawn(worker, args=(args.world, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
