#!/usr/bin/env python3
"""Sums one profiled step from an `ncu --csv --metrics gpu__time_duration.sum` log.

Usage: ncu_sum.py LOG TARGET SIZE [WALL_S]

Prints one JSON line: {"bench": "ncu", "target", "size", "kernels", "gpu_ms", "wall_s",
"top": [[name, count, ms], ...]}: the number of kernels profiled, their summed
gpu__time_duration, and the heaviest kernel names (template arguments cut off).
Runs on the GPU machine, which has python3 but no Rust; standard library only.
"""
import csv
import json
import re
import sys
from collections import defaultdict

METRIC = "gpu__time_duration.sum"
TO_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3,
         "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}


def rows(path):
    """The CSV rows of the log; ncu's own ==PROF== lines before the header are skipped."""
    with open(path, newline="", errors="replace") as f:
        lines = f.readlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return []
    return list(csv.DictReader(lines[start:]))


def stem(name):
    """A kernel's name without template arguments or parameter lists."""
    return re.split(r"[<(]", name, maxsplit=1)[0].strip() or name


def main():
    path, target, size = sys.argv[1:4]
    wall_s = float(sys.argv[4]) if len(sys.argv) > 4 else None
    kernels, total_ms = 0, 0.0
    by_name = defaultdict(lambda: [0, 0.0])
    for row in rows(path):
        if row.get("Metric Name") != METRIC:
            continue
        unit = (row.get("Metric Unit") or "ns").strip()
        value = float((row.get("Metric Value") or "0").replace(",", ""))
        ms = value * TO_MS.get(unit, 1e-6)
        name = stem(row.get("Kernel Name") or row.get("Function Name") or "?")
        kernels += 1
        total_ms += ms
        by_name[name][0] += 1
        by_name[name][1] += ms
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:12]
    print(json.dumps({
        "bench": "ncu", "target": target, "size": size, "kernels": kernels,
        "gpu_ms": round(total_ms, 4), "wall_s": wall_s,
        "top": [[n, c, round(m, 4)] for n, (c, m) in top],
    }))


if __name__ == "__main__":
    main()
