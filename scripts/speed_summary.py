#!/usr/bin/env python3
"""Issue 5's speed and capture-cost table from one GPU run.

Usage: speed_summary.py SPEED_LOG NCU_LOG TORCH_LOG   (missing files are skipped)

Reads the JSON lines of gpu_graph_speed ({"bench": "speed"}), ncu_sum.py
({"bench": "ncu"}) and bench/anchors/torch_anchor.py, and prints markdown: an ncu table,
then the summary table and, when measured, the FusedLstm table. Standard library only (the GPU machine has no Rust).
"""
import json
import sys

SIZES = ["32/64/256", "8/64/128", "128/32/512"]
MIB = 1024 * 1024


def lines(path):
    if not path:
        return
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        yield json.loads(line)
                    except ValueError:
                        pass
    except OSError:
        return


def fmt(x, digits=2, suffix=""):
    return "–" if x is None else f"{x:.{digits}f}{suffix}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    speed_log, ncu_log, torch_log = (sys.argv[1:4] + [None] * 3)[:3]
    speed = {}  # (size, stack, mode) -> line
    for m in lines(speed_log):
        if m.get("bench") == "speed":
            speed[(m["size"], m["stack"], m["mode"])] = m
    ncu = {}  # (target, size) -> line
    for m in lines(ncu_log):
        if m.get("bench") == "ncu":
            ncu[(m["target"], m["size"])] = m
    torch = {}  # (size, kind, graphed) -> ms
    for m in lines(torch_log):
        if "ms" in m and isinstance(m["ms"], (int, float)):
            torch[(f'{m["b"]}/{m["t"]}/{m["h"]}', m["kind"], m["graphed"])] = m["ms"]

    if ncu:
        print("| ncu target | b/t/h | kernels | summed GPU ms | profiling wall s | heaviest kernels (count, ms) |")
        print("|---|---|---|---|---|---|")
        for (target, size), m in sorted(ncu.items()):
            top = "; ".join(f"{n} ({c}, {ms:.2f})" for n, c, ms in m.get("top", [])[:4])
            print(f"| {target} | {size} | {m['kernels']} | {fmt(m['gpu_ms'])} | {fmt(m.get('wall_s'), 0)} | {top} |")
        print()

    sizes = [s for s in SIZES if any(k[0] == s for k in speed)] + sorted(
        {k[0] for k in speed} - set(SIZES))
    bad = [(k, m["timed_not_replayed"], m.get("last_fallback")) for k, m in speed.items()
           if m.get("timed_not_replayed")]
    for key, n, why in bad:
        print(f"WARNING: {key}: {n} timed steps were not replays (last fallback: {why})")
    checks = [(size, speed[(size, stack, "graphed")], stack) for size in sizes for stack in ("fused", "cube")
              if (size, stack, "graphed") in speed and "check_ms_per_step" in speed[(size, stack, "graphed")]]
    if checks:
        print("| b/t/h | stack | host checks per step (µs) | graphed ms per step | checks / step |")
        print("|---|---|---|---|---|")
        for size, m, stack in checks:
            check_ms = m["check_ms_per_step"]
            print(f"| {size} | {stack} | {check_ms * 1e3:.1f} | {fmt(m.get('pipelined_ms'))} "
                  f"| {fmt(100 * ratio(check_ms, m.get('pipelined_ms')) if m.get('pipelined_ms') else None, 3, '%')} |")
        print()
    print("Legend: ms per step; graphed and eager times are pipelined (N steps queued, one host "
          "read, divided by N; median of rounds), graphed per-step (each step to a host read) in "
          "brackets. Kernel time: ncu gpu__time_duration.sum over one fused-stack step "
          "(a replay if `fused-replay` was profiled, else the eager step after warmup). "
          "Capture in eager steps: capture_ms / this crate's eager per-step ms. Graph memory: "
          "arena pinned bytes + device bytes the graph retains; eager memory: growth of the "
          "pools' reserved bytes over eager training (see tests/benches/gpu_graph_speed/memory.rs). "
          "Targets at 32/64/256: graphed/kernel <= 1.15, stock/graphed >= 4, capture <= 5 steps, "
          "memory <= 2x.")
    print()
    print("| b/t/h | graphed (fused) | graphed (cube, no fusion) | eager (ours, fused) | eager (stock burn-cuda) "
          "| kernels/step | kernel ms | graphed / kernel | stock / graphed | capture ms | capture in eager steps "
          "| graph MiB (arena + retained + private pool) | eager MiB (reserved) | graph / eager memory | graph launches "
          "| torch unrolled graph | torch cuDNN graph |")
    print("|" + "---|" * 17)
    for size in sizes:
        g = speed.get((size, "fused", "graphed"), {})
        c = speed.get((size, "cube", "graphed"), {})
        e = speed.get((size, "fused", "eager"), {})
        s = speed.get((size, "stock", "eager"), {})
        k = ncu.get(("fused-replay", size)) or ncu.get(("fused", size)) or {}
        graphed = g.get("pipelined_ms")
        graph_bytes = None
        if g:
            graph_bytes = (g.get("pinned_bytes") or 0) + (g.get("retained_bytes") or 0) + (g.get("pool_bytes") or 0)
        eager_bytes = e.get("reserved_bytes")
        cells = [
            size,
            f"{fmt(graphed)} ({fmt(g.get('per_step_ms'))})" if g else "–",
            fmt(c.get("pipelined_ms")),
            fmt(e.get("pipelined_ms")),
            fmt(s.get("pipelined_ms")),
            str(k["kernels"]) if k else "–",
            fmt(k.get("gpu_ms")),
            fmt(ratio(graphed, k.get("gpu_ms")), 2, "x"),
            fmt(ratio(s.get("pipelined_ms"), graphed), 1, "x"),
            fmt(g.get("capture_ms"), 0),
            fmt(ratio(g.get("capture_ms"), e.get("per_step_ms")), 1),
            fmt(graph_bytes / MIB if graph_bytes is not None else None, 1),
            fmt(eager_bytes / MIB if eager_bytes is not None else None, 1),
            fmt(ratio(graph_bytes, eager_bytes), 2, "x"),
            str(g.get("graph_launches", "–")),
            fmt(torch.get((size, "unrolled", True))),
            fmt(torch.get((size, "cudnn", True))),
        ]
        print("| " + " | ".join(cells) + " |")
    fused_lstm_table(sizes, speed, ncu, torch)


def fused_lstm_table(sizes, speed, ncu, torch):
    """FusedLstm (the batched LSTM) against nn::Lstm and PyTorch, same run (issue 12)."""
    if not any((size, "fused-lstm", "graphed") in speed for size in sizes):
        return
    print()
    print("FusedLstm (`fused-lstm`): the same model and weights with the batched LSTM, on the "
          "fused stack. Ratios to PyTorch's cuDNN whole-step graph (lower is better).")
    print()
    print("| b/t/h | FusedLstm graphed ms | FusedLstm eager ms | nn::Lstm graphed ms | nn::Lstm / FusedLstm "
          "| kernels/step | torch cuDNN graph ms | FusedLstm / cuDNN |")
    print("|" + "---|" * 8)
    for size in sizes:
        f = speed.get((size, "fused-lstm", "graphed"), {})
        fe = speed.get((size, "fused-lstm", "eager"), {})
        n = speed.get((size, "fused", "graphed"), {})
        k = ncu.get(("fused-lstm-replay", size)) or ncu.get(("fused-lstm", size)) or {}
        cudnn = torch.get((size, "cudnn", True))
        cells = [
            size,
            fmt(f.get("pipelined_ms")),
            fmt(fe.get("pipelined_ms")),
            fmt(n.get("pipelined_ms")),
            fmt(ratio(n.get("pipelined_ms"), f.get("pipelined_ms")), 2, "x"),
            str(k["kernels"]) if k else "–",
            fmt(cudnn),
            fmt(ratio(f.get("pipelined_ms"), cudnn), 2, "x"),
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
