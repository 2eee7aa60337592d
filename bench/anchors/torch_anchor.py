# PyTorch's reference step: the project's anchor script, with a GRU (cuDNN and unrolled, at 32/64/256) added for issue 28; run by `xtask gpu run torch` (and `perf`).
"""Performance anchor: PyTorch LSTM training step, eager vs whole-step CUDA graph, on the reference configurations of ARCHITECTURE.md."""
import sys, time, json, statistics
import torch, torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"

class Unrolled(nn.Module):
    """LSTM written as a per-timestep loop of gate matmuls, as Burn's nn::Lstm does."""
    def __init__(s, d_in, h):
        super().__init__()
        s.h = h
        s.wi = nn.Linear(d_in, 4 * h)
        s.wh = nn.Linear(h, 4 * h)
    def forward(s, x):
        b, t, _ = x.shape
        h = x.new_zeros(b, s.h); c = x.new_zeros(b, s.h)
        outs = []
        for k in range(t):
            g = s.wi(x[:, k]) + s.wh(h)
            i, f, gg, o = g.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, 1)

class UnrolledGru(nn.Module):
    """GRU written as a per-timestep loop (the reset gate on the hidden projection with its
    bias, as Burn's nn::Gru with reset_after and PyTorch's nn.GRU compute it)."""
    def __init__(s, d_in, h):
        super().__init__()
        s.h = h
        s.wi = nn.Linear(d_in, 3 * h)
        s.wh = nn.Linear(h, 3 * h)
    def forward(s, x):
        b, t, _ = x.shape
        h = x.new_zeros(b, s.h)
        outs = []
        for k in range(t):
            xi, xr, xn = s.wi(x[:, k]).chunk(3, 1)
            hi, hr, hn = s.wh(h).chunk(3, 1)
            z = torch.sigmoid(xi + hi); r = torch.sigmoid(xr + hr)
            n = torch.tanh(xn + r * hn)
            h = (1 - z) * n + z * h
            outs.append(h)
        return torch.stack(outs, 1)

class Net(nn.Module):
    def __init__(s, kind, d_in, h):
        super().__init__()
        s.rnn = {
            "cudnn": lambda: nn.LSTM(d_in, h, batch_first=True),
            "unrolled": lambda: Unrolled(d_in, h),
            "cudnn-gru": lambda: nn.GRU(d_in, h, batch_first=True),
            "unrolled-gru": lambda: UnrolledGru(d_in, h),
        }[kind]()
        s.head = nn.Linear(h, 1)
        s.kind = kind
    def forward(s, x):
        out = s.rnn(x)[0] if s.kind.startswith("cudnn") else s.rnn(x)
        return s.head(out)

def bench(kind, graphed, b, t, h, d_in=32, iters=50):
    torch.manual_seed(0)
    model = Net(kind, d_in, h).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=graphed)
    x = torch.randn(b, t, d_in, device=dev); y = torch.randn(b, t, 1, device=dev)
    def step():
        opt.zero_grad(set_to_none=False)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss
    # warmup on a side stream (required before capture)
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    run = step
    if graphed:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss = step()
        run = g.replay
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
        st.record()
        for _ in range(iters):
            run()
        en.record(); torch.cuda.synchronize()
        times.append(st.elapsed_time(en) / iters)
    return statistics.median(times)

def kernels_per_step(kind, b, t, h, d_in=32):
    model = Net(kind, d_in, h).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(b, t, d_in, device=dev); y = torch.randn(b, t, 1, device=dev)
    for _ in range(2):
        opt.zero_grad(); ((model(x) - y) ** 2).mean().backward(); opt.step()
    torch.cuda.synchronize()
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        opt.zero_grad(); ((model(x) - y) ** 2).mean().backward(); opt.step(); torch.cuda.synchronize()
    return sum(e.count for e in p.key_averages() if e.device_type.name == "CUDA")

def main():
    rows = []
    for (b, t, h) in [(32, 64, 256), (8, 64, 128), (128, 32, 512)]:
        for kind in ["cudnn", "unrolled"]:
            for graphed in [False, True]:
                try:
                    ms = bench(kind, graphed, b, t, h)
                except Exception as e:
                    ms = f"ERR {type(e).__name__}: {e}"[:120]
                rows.append(dict(b=b, t=t, h=h, kind=kind, graphed=graphed, ms=ms))
                print(json.dumps(rows[-1]), flush=True)
    # GRUs (issue 28) at the size FusedGru is measured at.
    for (b, t, h) in [(32, 64, 256)]:
        for kind in ["cudnn-gru", "unrolled-gru"]:
            for graphed in [False, True]:
                try:
                    ms = bench(kind, graphed, b, t, h)
                except Exception as e:
                    ms = f"ERR {type(e).__name__}: {e}"[:120]
                rows.append(dict(b=b, t=t, h=h, kind=kind, graphed=graphed, ms=ms))
                print(json.dumps(rows[-1]), flush=True)
    for (b, t, h) in [(32, 64, 256)]:
        for kind in ["cudnn", "unrolled"]:
            try:
                print(json.dumps(dict(b=b, t=t, h=h, kind=kind, kernels_per_step=kernels_per_step(kind, b, t, h))), flush=True)
            except Exception as e:
                print("kernel count failed", kind, e)
    print(torch.__version__, torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
