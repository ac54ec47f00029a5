#!/usr/bin/env python3
"""Merges the raw outputs of benches/compare/run.sh into one table, a CSV and plots.

Every raw file is named `<impl>.<repeat>.txt` and holds rows
`coll size count time_us algbw busbw wrong` (lines starting with `#` are comments). For each
implementation, collective and size the median over repeats is kept.

    python3 report.py RAW_DIR OUT_DIR [--order a,b,c] [--ratios a/b,a/c] [--title "..."]

Writes OUT_DIR/results.csv, OUT_DIR/table.md and, when matplotlib is importable,
OUT_DIR/busbw_<coll>.png; prints the table (busbw in GB/s, then the ratios asked for).
"""
import argparse
import csv
import os
import statistics
import sys
from collections import defaultdict

COLL_ORDER = ("allreduce", "allgather", "broadcast")


def read_raw(raw_dir):
    """{(impl, coll, size): [(time_us, algbw, busbw, count, wrong), ...]}, impl order."""
    data = defaultdict(list)
    impls = []
    for name in sorted(os.listdir(raw_dir)):
        if not name.endswith(".txt"):
            continue
        impl = name[: -len(".txt")].rsplit(".", 1)[0]
        if impl not in impls:
            impls.append(impl)
        with open(os.path.join(raw_dir, name)) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                p = line.split()
                if len(p) != 7:
                    continue
                coll, size, count = p[0], int(p[1]), int(p[2])
                t, algbw, busbw, wrong = float(p[3]), float(p[4]), float(p[5]), int(p[6])
                data[(impl, coll, size)].append((t, algbw, busbw, count, wrong))
    return data, impls


def bus_factor(coll, n):
    """nccl-tests' busbw / algbw."""
    return {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n}.get(coll, 1.0)


def fmt_bw(v):
    return f"{v:.3g}" if v < 1 else f"{v:.2f}"


def fmt_size(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw_dir")
    p.add_argument("out_dir")
    p.add_argument("--ratios", default="",
                   help="comma-separated A/B pairs of implementations: columns of busbw A / B")
    p.add_argument("--order", default="", help="comma-separated implementation order")
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--title", default="")
    args = p.parse_args()

    data, impls = read_raw(args.raw_dir)
    if args.order:
        wanted = [i for i in args.order.split(",") if i in impls]
        impls = wanted + [i for i in impls if i not in wanted]
    # Bandwidths are recomputed from the size and the median time with nccl-tests' formulas,
    # so that every implementation gets the same rounding (the tools print 2 decimals).
    med = {}
    for key, vals in data.items():
        t = statistics.median(v[0] for v in vals)
        algbw = key[2] / (t * 1e-6) / 1e9 if t > 0 else 0.0
        med[key] = {
            "time_us": t,
            "algbw": algbw,
            "busbw": algbw * bus_factor(key[1], args.nranks),
            "count": vals[0][3],
            "wrong": sum(v[4] for v in vals),
            "reps": len(vals),
        }
    colls = [c for c in COLL_ORDER if any(k[1] == c for k in med)]
    os.makedirs(args.out_dir, exist_ok=True)

    with open(os.path.join(args.out_dir, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["impl", "coll", "size", "count", "time_us", "algbw", "busbw", "wrong", "repeats"])
        for (impl, coll, size), m in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            w.writerow([impl, coll, size, m["count"], f"{m['time_us']:.2f}", f"{m['algbw']:.6g}",
                        f"{m['busbw']:.6g}", m["wrong"], m["reps"]])

    # Each ratio compares two runs over the same path (`ferroccl-tcp/gloo`, ...).
    pairs = []
    for spec in filter(None, args.ratios.split(",")):
        num, _, den = spec.partition("/")
        if num in impls and den in impls:
            pairs.append((num, den))
    head = ["coll", "size"] + impls + [f"{b}/{o}" for b, o in pairs]
    rows = []
    for coll in colls:
        sizes = sorted({k[2] for k in med if k[1] == coll})
        for size in sizes:
            row = [coll, fmt_size(size)]
            for i in impls:
                m = med.get((i, coll, size))
                row.append(fmt_bw(m["busbw"]) if m else "-")
            for b_impl, o in pairs:
                b = med.get((b_impl, coll, size))
                m = med.get((o, coll, size))
                if b and m and m["busbw"] > 0:
                    row.append(f"{b['busbw'] / m['busbw']:.2f}")
                else:
                    row.append("-")
            rows.append(row)
    widths = [max(len(str(r[c])) for r in [head] + rows) for c in range(len(head))]
    print("# busbw (GB/s), median over repeats; last columns: ratios of busbw")
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths)))
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write("| " + " | ".join(head) + " |\n")
        f.write("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|\n")
        for r in rows:
            f.write("| " + " | ".join(r) + " |\n")
    bad = [(k, m["wrong"]) for k, m in med.items() if m["wrong"]]
    for (impl, coll, size), wrong in bad:
        print(f"# WRONG: {impl} {coll} size {size}: {wrong} wrong elements", file=sys.stderr)

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib not importable: no plots (pip install matplotlib)", file=sys.stderr)
        return 1 if bad else 0
    markers = "os^vDxP*"

    def style(n, impl):
        # Runs across network-namespace hosts are dashed, runs on one host solid.
        return markers[n % len(markers)] + ("--" if impl.endswith("-veth") else "-")

    for coll in colls:
        fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.8))
        for n, impl in enumerate(impls):
            pts = sorted((k[2], m) for k, m in med.items() if k[0] == impl and k[1] == coll)
            if not pts:
                continue
            xs = [s for s, _ in pts]
            ax_bw.plot(xs, [m["busbw"] for _, m in pts], style(n, impl), label=impl,
                       markersize=4)
            ax_t.plot(xs, [m["time_us"] for _, m in pts], style(n, impl), label=impl,
                      markersize=4)
        for ax in (ax_bw, ax_t):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("size (bytes)")
            ax.grid(True, which="major", alpha=0.4)
            ticks = sorted({k[2] for k in med if k[1] == coll})
            ax.set_xticks(ticks)
            ax.set_xticklabels([fmt_size(t) for t in ticks], rotation=45, fontsize=8)
        ax_bw.set_ylabel("busbw (GB/s)")
        ax_bw.set_title(f"{coll}: bus bandwidth")
        ax_t.set_yscale("log")
        ax_t.set_ylabel("time per call (us)")
        ax_t.set_title(f"{coll}: time per call")
        ax_bw.legend(fontsize=8)
        if args.title:
            fig.suptitle(args.title, fontsize=10)
        fig.tight_layout()
        path = os.path.join(args.out_dir, f"busbw_{coll}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        print(f"# plot: {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
