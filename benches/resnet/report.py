#!/usr/bin/env python3
"""Results of benches/resnet/scaling.sh: a CSV of runs, then a markdown table and PNG plots.

    report.py add CSV LOG --mode weak|strong --repeat R   append LOG's `RESULT {json}` line to CSV
    report.py table CSV --md docs/SCALING.md --plots docs/scaling [--meta KEY=VALUE ...]
    report.py selftest                                    check both on a small made-up CSV

Every run adds one CSV row (columns in COLUMNS). `table` keeps, for each implementation, mode
and number of ranks, the median of every number over the repeats, and writes:

- the markdown table: images/s in total and per rank, scaling efficiency against 1 rank of the
  same implementation and mode (images/s at N ranks / (N x images/s at 1 rank); for strong
  scaling this is the speed-up over N), the fraction of the step spent waiting on
  communication, and ferroccl's images/s over PyTorch DDP's in the same configuration;
- PLOTS/weak.png and PLOTS/strong.png: images/s against ranks, with each implementation's ideal
  line (N x its 1-rank images/s);
- PLOTS/breakdown.png: the step time split into forward, backward, communication wait,
  optimizer and the rest, per implementation, mode and ranks.

The step phases in a RESULT line are disjoint: forward + backward + comm_wait + optimizer is
the step time less loop overhead (total). A missing or null comm_wait counts as unknown.
"""
import argparse
import csv
import json
import os
import statistics
import sys
import tempfile

COLUMNS = (
    "impl", "mode", "nranks", "repeat", "arch", "image_size", "threads", "batch_per_rank",
    "global_batch", "steps", "images_per_sec", "images_per_sec_per_rank", "forward_ms",
    "backward_ms", "comm_wait_ms", "optimizer_ms", "total_ms", "comm_hidden_fraction",
)
NUMERIC = COLUMNS[10:]
PHASES = (("forward_ms", "forward"), ("backward_ms", "backward"), ("comm_wait_ms", "comm wait"),
          ("optimizer_ms", "optimizer"))
OURS = "ferroccl"
BASELINE = "torch-ddp-gloo"
MODES = ("weak", "strong")


# --- add --------------------------------------------------------------------------------------


def result_from_log(path):
    """The JSON object of the last `RESULT {...}` line in the file (ferrorun's `[0] ` prefix
    allowed)."""
    found = None
    with open(path, errors="replace") as f:
        for line in f:
            i = line.find("RESULT {")
            if i >= 0:
                found, _ = json.JSONDecoder().raw_decode(line[i + len("RESULT "):])
    if found is None:
        raise ValueError(f"{path}: no RESULT line")
    return found


def row_from_result(res, mode, repeat):
    steps = res.get("step_ms") or {}
    row = {
        "impl": res["impl"], "mode": mode, "nranks": int(res["nranks"]), "repeat": repeat,
        "arch": res.get("arch", ""), "image_size": res.get("image_size", ""),
        "threads": res.get("threads", ""), "batch_per_rank": res.get("batch_per_rank", ""),
        "global_batch": res.get("global_batch", ""), "steps": res.get("steps", ""),
        "images_per_sec": res["images_per_sec"],
        "images_per_sec_per_rank": res.get("images_per_sec_per_rank",
                                           res["images_per_sec"] / int(res["nranks"])),
        "comm_hidden_fraction": res.get("comm_hidden_fraction"),
    }
    for col, key in (("forward_ms", "forward"), ("backward_ms", "backward"),
                     ("comm_wait_ms", "comm_wait"), ("optimizer_ms", "optimizer"),
                     ("total_ms", "total")):
        row[col] = steps.get(key)
    return {k: ("" if v is None else v) for k, v in row.items()}


def append_row(csv_path, row):
    new = not os.path.exists(csv_path) or os.path.getsize(csv_path) == 0
    with open(csv_path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        if new:
            w.writeheader()
        w.writerow(row)


def cmd_add(args):
    row = row_from_result(result_from_log(args.log), args.mode, args.repeat)
    append_row(args.csv, row)
    print(f"{row['impl']:>15} {row['mode']:>6} n={row['nranks']} global batch {row['global_batch']}: "
          f"{float(row['images_per_sec']):.1f} images/s")
    return 0


# --- table ------------------------------------------------------------------------------------


def num(v):
    if v is None or v == "":
        return None
    try:
        return float(v)
    except ValueError:
        return None


def median(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def load(csv_path):
    """{(impl, mode, nranks): {column: median}}, implementations in order of appearance."""
    groups, impls = {}, []
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            key = (r["impl"], r["mode"], int(r["nranks"]))
            if r["impl"] not in impls:
                impls.append(r["impl"])
            groups.setdefault(key, []).append(r)
    med = {}
    for key, rows in groups.items():
        m = {c: median([num(r.get(c)) for r in rows]) for c in NUMERIC}
        for c in ("arch", "image_size", "threads", "batch_per_rank", "global_batch", "steps"):
            m[c] = rows[0].get(c, "")
        m["repeats"] = len(rows)
        med[key] = m
    impls.sort(key=lambda i: (i != OURS, i != BASELINE, i))
    return med, impls


def efficiency(med, impl, mode, n):
    base, cur = med.get((impl, mode, 1)), med.get((impl, mode, n))
    if not base or not cur or not base["images_per_sec"] or cur["images_per_sec"] is None:
        return None
    return cur["images_per_sec"] / (n * base["images_per_sec"])


def wait_fraction(m):
    if m["comm_wait_ms"] is None or not m["total_ms"]:
        return None
    return m["comm_wait_ms"] / m["total_ms"]


def f1(v):
    return "—" if v is None else f"{v:.1f}"


def pct(v):
    return "—" if v is None else f"{100 * v:.0f} %"


def ratio_str(v):
    return "—" if v is None else f"{v:.2f}"


def table_rows(med, impls):
    rows = []
    for mode in MODES:
        ns = sorted({n for (_, m, n) in med if m == mode})
        for n in ns:
            for impl in impls:
                m = med.get((impl, mode, n))
                if m is None:
                    continue
                ratio = None
                if impl == OURS:
                    other = med.get((BASELINE, mode, n))
                    if other and other["images_per_sec"] and m["images_per_sec"] is not None:
                        ratio = m["images_per_sec"] / other["images_per_sec"]
                rows.append((impl, mode, n, m, efficiency(med, impl, mode, n), ratio))
    return rows


def markdown(med, impls, meta, plots_rel, csv_name):
    rows = table_rows(med, impls)
    out = ["# Scaling study: data-parallel ResNet training, ferroccl beside PyTorch DDP (Gloo)", ""]
    out.append("Generated by `benches/resnet/scaling.sh` (table and plots by "
               f"`benches/resnet/report.py` from `{csv_name}`).")
    out.append("")
    if meta:
        for k, v in meta:
            out.append(f"- {k}: {v}")
        out.append("")
    out += [
        "Weak scaling keeps the images per rank fixed (the global batch grows with the ranks);",
        "strong scaling keeps the global batch fixed and divides it among the ranks. Synthetic",
        "data (one random batch per rank, made before timing), so the figures measure compute",
        "and gradient synchronisation only. Every number is the median over repeats.",
        "",
        "| impl | mode | ranks | global batch | images/s | images/s per rank | scaling efficiency "
        "| comm wait / step | step ms | ferroccl / torch |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for impl, mode, n, m, eff, ratio in rows:
        gb = m["global_batch"] or "—"
        out.append(f"| {impl} | {mode} | {n} | {gb} | {f1(m['images_per_sec'])} | "
                   f"{f1(m['images_per_sec_per_rank'])} | {pct(eff)} | {pct(wait_fraction(m))} | "
                   f"{f1(m['total_ms'])} | {ratio_str(ratio)} |")
    out.append("")
    out += [
        "Columns: scaling efficiency = images/s at N ranks / (N × images/s at 1 rank) for the",
        "same implementation and mode (for strong scaling, the speed-up divided by N);",
        "comm wait / step = time a step spends waiting for gradient allreduces that backward did",
        "not hide, over the step time; ferroccl / torch = ratio of total images/s in the same",
        "mode and ranks.",
        "",
        f"How the wait is measured: `{OURS}` times its wait for outstanding bucket allreduces",
        "after backward directly. PyTorch DDP waits inside `loss.backward()`, so for",
        f"`{BASELINE}` it is estimated as backward time minus the backward time of the same",
        "steps run under `no_sync()` (no allreduce); its backward column is the difference.",
        "",
    ]
    # Step-time breakdown, in ms.
    out += ["## Step time (ms, per rank, medians)", "",
            "| impl | mode | ranks | forward | backward | comm wait | optimizer | total | comm hidden |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for impl, mode, n, m, _, _ in rows:
        out.append(f"| {impl} | {mode} | {n} | {f1(m['forward_ms'])} | {f1(m['backward_ms'])} | "
                   f"{f1(m['comm_wait_ms'])} | {f1(m['optimizer_ms'])} | {f1(m['total_ms'])} | "
                   f"{pct(m['comm_hidden_fraction'])} |")
    out.append("")
    out.append("comm hidden: the share of the allreduce time that overlapped backward "
               f"(`{BASELINE}`: 1 − comm wait / time of the same allreduces run alone).")
    out.append("")
    # Targets, when there are multi-rank ferroccl figures.
    nmax = max((n for (i, m, n) in med if i == OURS and m == "weak"), default=1)
    if nmax > 1:
        eff = efficiency(med, OURS, "weak", nmax)
        ours, base = med.get((OURS, "weak", nmax)), med.get((BASELINE, "weak", nmax))
        out += ["## Targets", ""]
        if eff is not None:
            mark = "met" if eff >= 0.9 else "not met"
            out.append(f"- weak scaling efficiency of {OURS} at {nmax} ranks ≥ 90 %: "
                       f"{pct(eff)} ({mark})")
        if ours and base and base["images_per_sec"]:
            r = ours["images_per_sec"] / base["images_per_sec"]
            mark = "met" if r >= 1.0 else "not met"
            out.append(f"- {OURS} images/s ≥ PyTorch DDP's at {nmax} ranks (weak): "
                       f"{r:.2f}× ({mark})")
        out.append("")
    if plots_rel:
        out += ["## Plots", ""]
        for name, what in (("weak", "Weak scaling"), ("strong", "Strong scaling"),
                           ("breakdown", "Step-time breakdown")):
            out.append(f"![{what}]({plots_rel}/{name}.png)")
            out.append("")
    return "\n".join(out)


def plot(med, impls, plots_dir):
    """Writes the PNGs; returns False (with a message) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib not importable, no plots", file=sys.stderr)
        return False
    os.makedirs(plots_dir, exist_ok=True)
    colors = {}
    for i, impl in enumerate(impls):
        colors[impl] = f"C{i}"
    for mode in MODES:
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        any_line = False
        for impl in impls:
            ns = sorted(n for (i, m, n) in med if i == impl and m == mode)
            ys = [med[(impl, mode, n)]["images_per_sec"] for n in ns]
            if not ns:
                continue
            any_line = True
            ax.plot(ns, ys, "o-", color=colors[impl], label=impl)
            base = med.get((impl, mode, 1))
            if base and base["images_per_sec"]:
                ax.plot(ns, [n * base["images_per_sec"] for n in ns], "--", color=colors[impl],
                        alpha=0.5, label=f"{impl} ideal")
        if not any_line:
            plt.close(fig)
            continue
        allns = sorted({n for (_, m, n) in med if m == mode})
        ax.set_xticks(allns)
        ax.set_xlabel("ranks")
        ax.set_ylabel("images/s (all ranks)")
        what = "fixed images per rank" if mode == "weak" else "fixed global batch"
        ax.set_title(f"{mode.capitalize()} scaling ({what})")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(plots_dir, f"{mode}.png"), dpi=110)
        plt.close(fig)

    rows = table_rows(med, impls)
    if rows:
        fig, ax = plt.subplots(figsize=(max(6.4, 0.8 * len(rows) + 2), 4.6))
        labels, bottoms = [], [0.0] * len(rows)
        for k, (col, name) in enumerate(PHASES + (("other", "other"),)):
            vals = []
            for j, (impl, mode, n, m, _, _) in enumerate(rows):
                if col == "other":
                    parts = sum(m[c] or 0.0 for c, _ in PHASES)
                    v = max(0.0, (m["total_ms"] or 0.0) - parts)
                else:
                    v = m[col] or 0.0
                vals.append(v)
            ax.bar(range(len(rows)), vals, bottom=bottoms, label=name, color=f"C{k}")
            bottoms = [b + v for b, v in zip(bottoms, vals)]
        for impl, mode, n, _, _, _ in rows:
            labels.append(f"{impl}\n{mode} n={n}")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("ms per step")
        ax.set_title("Step time by phase (median, per rank)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(plots_dir, "breakdown.png"), dpi=110)
        plt.close(fig)
    return True


def print_table(med, impls):
    print(f"{'impl':>15} {'mode':>6} {'n':>2} {'batch':>5} {'img/s':>9} {'/rank':>8} {'eff':>6} "
          f"{'wait':>6} {'ratio':>6}")
    for impl, mode, n, m, eff, ratio in table_rows(med, impls):
        print(f"{impl:>15} {mode:>6} {n:>2} {str(m['global_batch']):>5} {f1(m['images_per_sec']):>9} "
              f"{f1(m['images_per_sec_per_rank']):>8} {pct(eff):>6} {pct(wait_fraction(m)):>6} "
              f"{ratio_str(ratio):>6}")


def cmd_table(args):
    med, impls = load(args.csv)
    if not med:
        print(f"report.py: {args.csv} has no rows", file=sys.stderr)
        return 1
    meta = [tuple(kv.split("=", 1)) for kv in args.meta if "=" in kv]
    plots_rel = None
    if args.plots and plot(med, impls, args.plots):
        plots_rel = os.path.relpath(args.plots, os.path.dirname(os.path.abspath(args.md)) or ".")
    os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
    with open(args.md, "w") as f:
        f.write(markdown(med, impls, meta, plots_rel, os.path.relpath(args.csv)))
    print_table(med, impls)
    print(f"wrote {args.md}" + (f" and {args.plots}/{{weak,strong,breakdown}}.png" if plots_rel else ""))
    return 0


# --- selftest ---------------------------------------------------------------------------------


def cmd_selftest(_args):
    def result(impl, n, per_rank, ips, wait):
        return {"impl": impl, "arch": "resnet18", "image_size": 32, "nranks": n,
                "batch_per_rank": per_rank, "global_batch": per_rank * n, "steps": 3,
                "images_per_sec": ips, "images_per_sec_per_rank": ips / n, "threads": 1,
                "step_ms": {"forward": 10.0, "backward": 20.0, "comm_wait": wait,
                            "optimizer": 2.0, "total": 1000.0 * per_rank / (ips / n)},
                "comm_hidden_fraction": None if wait is None else 0.5}

    with tempfile.TemporaryDirectory() as d:
        csv_path = os.path.join(d, "results.csv")
        runs = [("weak", 1, result(OURS, 1, 32, 100.0, 0.0)),
                ("weak", 1, result(BASELINE, 1, 32, 90.0, None)),
                ("weak", 2, result(OURS, 2, 32, 190.0, 1.0)),
                ("weak", 2, result(OURS, 2, 32, 180.0, 3.0)),  # a second repeat: median 185
                ("weak", 2, result(BASELINE, 2, 32, 160.0, 4.0)),
                ("strong", 1, result(OURS, 1, 64, 110.0, 0.0)),
                ("strong", 2, result(OURS, 2, 32, 200.0, 2.0)),
                ("strong", 2, result(BASELINE, 2, 32, 150.0, 5.0))]
        for k, (mode, n, res) in enumerate(runs):
            log = os.path.join(d, f"run{k}.log")
            with open(log, "w") as f:
                f.write("some progress output\n")
                f.write(("[0] " if k % 2 else "") + "RESULT " + json.dumps(res) + "\n")
            append_row(csv_path, row_from_result(result_from_log(log), mode, 1))
        with open(csv_path) as f:
            assert len(f.read().strip().splitlines()) == len(runs) + 1
        med, impls = load(csv_path)
        assert impls == [OURS, BASELINE], impls
        assert med[(OURS, "weak", 2)]["images_per_sec"] == 185.0
        assert abs(efficiency(med, OURS, "weak", 2) - 0.925) < 1e-9
        assert efficiency(med, BASELINE, "strong", 2) is None  # no 1-rank baseline
        md_path = os.path.join(d, "SCALING.md")
        plots = os.path.join(d, "scaling")
        ns = argparse.Namespace(csv=csv_path, md=md_path, plots=plots, meta=["machine=test"])
        assert cmd_table(ns) == 0
        text = open(md_path).read()
        assert "| ferroccl | weak | 2 | 64 | 185.0 | 92.5 | 92 % |" in text, text
        assert "| 1.16 |" in text  # 185 / 160
        assert "(met)" in text
        try:
            import matplotlib  # noqa: F401
            for name in ("weak", "strong", "breakdown"):
                p = os.path.join(plots, f"{name}.png")
                assert os.path.getsize(p) > 1000, p
        except ImportError:
            pass
    print("report.py selftest: ok")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add", help="append a run's RESULT line to the CSV")
    a.add_argument("csv")
    a.add_argument("log")
    a.add_argument("--mode", required=True, choices=MODES)
    a.add_argument("--repeat", type=int, default=1)
    t = sub.add_parser("table", help="markdown table and plots from the CSV")
    t.add_argument("csv")
    t.add_argument("--md", default="docs/SCALING.md")
    t.add_argument("--plots", default="docs/scaling", help="directory for the PNGs ('' for none)")
    t.add_argument("--meta", action="append", default=[], help="KEY=VALUE line for the header")
    sub.add_parser("selftest", help="check add and table on made-up results")
    args = p.parse_args()
    return {"add": cmd_add, "table": cmd_table, "selftest": cmd_selftest}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
