#!/usr/bin/env python3
"""Pools runtime_eager_bench logs (issue 3, check 3): per run and size, ours/stock ratio of
medians and each stack's first-half/second-half median (a stack against itself: the noise
floor of one run); then, over all runs, pooled quantile ratios and a bootstrap interval
of the pooled median ratio (steps resampled within each run).

    python3 scripts/eager_bench_pool.py bench/results/raw/runtime-eager-bench-*.log
"""
import random
import re
import statistics as st
import sys


def quantile(values, p):
    v = sorted(values)
    i = p * (len(v) - 1)
    lo = int(i)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)


def steps(block, who):
    found = re.search(rf"per-step ms {who}:\s*(\[.*?\])", block)
    return [float(x) for x in found.group(1).strip("[]").split(",")]


def main(paths):
    pooled = {}
    print("| run | b/t/h | ours/stock median | stock 1st/2nd half | ours 1st/2nd half |")
    print("|---|---|---|---|---|")
    for path in paths:
        text = open(path).read()
        for block in text.split("config ")[1:]:
            size = block.split(":")[0]
            ours, stock = steps(block, "ours"), steps(block, "stock")
            half = len(ours) // 2
            print(
                f"| {path.rsplit('/', 1)[-1]} | {size} | {st.median(ours) / st.median(stock):.3f} "
                f"| {st.median(stock[:half]) / st.median(stock[half:]):.3f} "
                f"| {st.median(ours[:half]) / st.median(ours[half:]):.3f} |"
            )
            pooled.setdefault(size, []).append((ours, stock))
    qs = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9)
    print()
    print("| b/t/h | steps per stack | " + " | ".join(f"p{int(q * 100)}" for q in qs)
          + " | mean | median 95% interval |")
    print("|---|---|" + "---|" * (len(qs) + 2))
    rng = random.Random(1)
    for size, runs in pooled.items():
        ours = [x for o, _ in runs for x in o]
        stock = [x for _, s in runs for x in s]
        boot = []
        for _ in range(2000):
            o2, s2 = [], []
            for o, s in runs:
                o2 += rng.choices(o, k=len(o))
                s2 += rng.choices(s, k=len(s))
            boot.append(st.median(o2) / st.median(s2))
        boot.sort()
        cells = " | ".join(f"{quantile(ours, q) / quantile(stock, q):.3f}" for q in qs)
        print(f"| {size} | {len(ours)} | {cells} | {st.mean(ours) / st.mean(stock):.3f} "
              f"| {boot[50]:.3f}–{boot[1949]:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
