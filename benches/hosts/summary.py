#!/usr/bin/env python3
"""Summarises benches/hosts/run.sh: per size, out-of-place time (us) and busbw (GB/s) of each
algorithm, the algorithm `auto` ran, and the three ratios the benchmark is about:

  * small messages (8 B .. 8 KiB): ring time / auto time (target >= 2);
  * 64 MiB: hier busbw / ring busbw (target >= 1.5);
  * every size: auto time / best forced time (target <= 1.10), and the same for the choice
    alone: the forced time of the algorithm auto ran / best forced time (where rounds of auto
    ran different algorithms, the worst of them). Where auto runs the best algorithm, the
    first ratio is run-to-run noise of one algorithm; the second is 1.

usage: summary.py OUT_DIR NRANKS ALGO...
(reads OUT_DIR/{small,large}-ALGO.txt and OUT_DIR/{small,large}-rN-ALGO.txt; with several
rounds, the fastest per size)
"""

import sys
from pathlib import Path


def rows(path, nranks):
    """{size: (time_us, busbw, algo)} from an all_reduce_perf table (out-of-place block);
    busbw recomputed from the time (the table rounds it to 2 decimals):
    size / time x 2 (n - 1) / n, in GB/s."""
    out = {}
    for line in Path(path).read_text().splitlines():
        f = line.split()
        if not f or not f[0].isdigit() or len(f) < 13:
            continue
        size, t = int(f[0]), float(f[5])
        algo = f[13] if len(f) > 13 else "-"
        bus = size / t / 1e3 * 2 * (nranks - 1) / nranks if t > 0 else 0.0
        out[size] = (t, bus, algo)
    return out


def main():
    out_dir, nranks, algos = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    data = {a: {} for a in algos}
    # Every algorithm auto ran per size, over all rounds.
    chosen = {}
    for a in algos:
        for phase in ("small", "large"):
            # Several rounds (PHASE-rN-ALGO.txt): the fastest round per size.
            paths = [out_dir / f"{phase}-{a}.txt"] + sorted(out_dir.glob(f"{phase}-r*-{a}.txt"))
            for p in paths:
                if not p.exists():
                    continue
                for size, v in rows(p, nranks).items():
                    if a == "auto":
                        chosen.setdefault(size, set()).add(v[2])
                    if size not in data[a] or v[0] < data[a][size][0]:
                        data[a][size] = v
    setup = out_dir / "setup.txt"
    if setup.exists():
        print(setup.read_text().rstrip())
    sizes = sorted(set().union(*[d.keys() for d in data.values()]))
    forced = [a for a in algos if a != "auto"]
    head = f"{'size':>10} " + " ".join(f"{a + ' us':>11}" for a in algos)
    head += f" {'auto ran':>9} {'best forced':>11} {'auto/best':>9} {'choice/best':>11}"
    print("\n# out-of-place time per call (us)")
    print(head)
    worst = 0.0
    worst_choice = 0.0
    for s in sizes:
        cells = []
        for a in algos:
            v = data[a].get(s)
            cells.append(f"{v[0]:>11.1f}" if v else f"{'-':>11}")
        line = f"{s:>10} " + " ".join(cells)
        best = min(((data[a][s][0], a) for a in forced if s in data[a]), default=None)
        if "auto" in data and s in data["auto"] and best:
            ratio = data["auto"][s][0] / best[0]
            worst = max(worst, ratio)
            line += f" {data['auto'][s][2]:>9} {best[1]:>11} {ratio:>9.2f}"
            picks = [data[a][s][0] for a in chosen.get(s, ()) if a in data and s in data[a]]
            if picks:
                c = max(picks) / best[0]
                worst_choice = max(worst_choice, c)
                line += f" {c:>11.2f}"
        print(line)
    print("\n# busbw (GB/s, from the out-of-place time)")
    print(f"{'size':>10} " + " ".join(f"{a:>8}" for a in algos))
    for s in sizes:
        cells = []
        for a in algos:
            v = data[a].get(s)
            cells.append(f"{v[1]:>8.4f}" if v else f"{'-':>8}")
        print(f"{s:>10} " + " ".join(cells))

    print("\n# targets")
    if "auto" in data and "ring" in data:
        small = [s for s in sizes if 8 <= s <= 8192 and s in data["auto"] and s in data["ring"]]
        if small:
            r = [data["ring"][s][0] / data["auto"][s][0] for s in small]
            print(
                f"small (8 B - 8 KiB) ring time / auto time: min {min(r):.2f}, "
                f"max {max(r):.2f} (target >= 2: {'met' if min(r) >= 2 else 'MISSED'})"
            )
    big = 64 << 20
    if "hier" in data and "ring" in data and big in data["hier"] and big in data["ring"]:
        r = data["hier"][big][1] / data["ring"][big][1]
        print(
            f"64 MiB busbw hier / ring: {data['hier'][big][1]:.4f} / {data['ring'][big][1]:.4f} "
            f"= {r:.2f} (target >= 1.5: {'met' if r >= 1.5 else 'MISSED'})"
        )
    if worst:
        print(
            f"auto time / best forced time, worst size: {worst:.2f} "
            f"(target <= 1.10: {'met' if worst <= 1.10 else 'MISSED'})"
        )
    if worst_choice:
        print(
            f"forced time of auto's choice / best forced time, worst size: {worst_choice:.2f} "
            f"(target <= 1.10: {'met' if worst_choice <= 1.10 else 'MISSED'})"
        )


if __name__ == "__main__":
    main()
