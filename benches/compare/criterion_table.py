#!/usr/bin/env python3
"""Condenses `cargo bench` (criterion) output into one line per benchmark: name, median
time, median throughput.

    cargo bench -p ferroccl-perf --bench transport 2>&1 | python3 criterion_table.py
"""
import re
import sys


def main():
    name, out = None, {}
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line.startswith("Benchmarking"):
            continue
        m = re.match(r"^([A-Za-z0-9_]+/\S+)", line)
        if m:
            name = m.group(1)
        if "%" in line or not name:  # "change:" lines compare with the previous run
            continue
        t = re.search(r"time:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]", line)
        if t and name not in out:
            out[name] = [t.group(1), ""]
        th = re.search(r"thrpt:\s+\[\S+ \S+ (\S+ \S+) \S+ \S+\]", line)
        if th and name in out and not out[name][1]:
            out[name][1] = th.group(1)
    width = max((len(n) for n in out), default=10)
    print(f"{'benchmark':<{width}} {'median time':>12} {'median thrpt':>14}")
    for n, (t, th) in out.items():
        print(f"{n:<{width}} {t:>12} {th:>14}")


if __name__ == "__main__":
    main()
