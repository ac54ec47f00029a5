#!/usr/bin/env python3
"""Simulator against measurement: for one configuration measured by benches/hosts/run.sh or
benches/hosts/validate.sh, writes a ferroccl-sim topology file whose link constants are the
ones FERRO_TUNE=measure logged (ping-pong: latency = half the 8-byte round trip, bandwidth =
slope between 1 MiB and 4 MiB round trips) and, where the log has one, the reduction rate
(`TUNING: reduce X GB/s`, written as a `reduce X` line; older logs have none and the
simulator's default applies), runs ferroccl-sim for every algorithm and size that was
measured, and prints a markdown table of measured (the fastest round) vs predicted time with
the ratio, and how far the rounds of one point lie apart (slowest / fastest): a point whose
rounds differ by more than 25 % cannot be predicted within 25 % of every round, so the
summary also counts the points that repeat within 25 % and how many of those fit.

usage: validate.py SIM_BIN OUT_DIR NRANKS PER_HOST PLACEMENT LABEL ALGO...
  OUT_DIR holds {small,large}[-rN]-ALGO.txt tables and *.err logs with the calibration line;
  PLACEMENT is host-major or round-robin (ferrorun --netns places round-robin).
  Environment: SIM_CALLS (default 4): the simulator predicts the time per call of that many
  back-to-back calls after the first, as all_reduce_perf measures it (a loop of calls with
  no barrier between them: a rank starts its next call when it finished the last, so calls
  overlap where an algorithm leaves ranks idle, and links, NIC queues and token buckets
  carry over); 1 predicts one call on idle links. SIM_ARGS: more ferroccl-sim options (e.g.
  "--nic-burst 512K": the shaped links' tbf bucket).
"""

import os
import re
from statistics import median
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from summary import rows  # noqa: E402

CALIB = re.compile(r"TUNING: calibrated (.*)")
LINK = re.compile(r"(shm|tcp) ([0-9.]+) us, ([0-9.]+) GB/s")
REDUCE = re.compile(r"TUNING: reduce ([0-9.]+) GB/s")


def calibration(out_dir):
    """{link: (alpha_us, beta_gbps)}: per link, the medians of latency and bandwidth over every
    calibration line in OUT_DIR/*.err (each run calibrates anew, and on a shared 2-core
    machine one run's figures can be far from the others': shm latency 0.9 us in one, 14.6 us
    in the next)."""
    seen = {}
    for p in sorted(Path(out_dir).glob("*.err")):
        for line in p.read_text().splitlines():
            m = CALIB.search(line)
            if m:
                for link, a, b in LINK.findall(m.group(1)):
                    seen.setdefault(link, []).append((float(a), float(b)))
    if not seen:
        sys.exit(f"validate.py: no 'TUNING: calibrated' line in {out_dir}/*.err")
    return {
        link: (median(a for a, _ in v), median(b for _, b in v)) for link, v in seen.items()
    }


def reduce_rate(out_dir):
    """The median reduction rate in GB/s over the positive 'TUNING: reduce' lines in
    OUT_DIR/*.err, or None where no log has one (logs from before the library timed its
    reduction)."""
    rates = []
    for p in sorted(Path(out_dir).glob("*.err")):
        for line in p.read_text().splitlines():
            m = REDUCE.search(line)
            if m:
                try:
                    rate = float(m.group(1))
                except ValueError:
                    continue
                if rate > 0:
                    rates.append(rate)
    return median(rates) if rates else None


def measured(out_dir, nranks, algo):
    """{size: [time_us of each round]} over every {small,large}[-rN]-ALGO.txt table in OUT_DIR,
    fastest first."""
    data = {}
    paths = sorted(Path(out_dir).glob(f"*-{algo}.txt"))
    for p in paths:
        if not re.fullmatch(rf"(small|large)(-r\d+)?-{re.escape(algo)}\.txt", p.name):
            continue
        for size, v in rows(p, nranks).items():
            data.setdefault(size, []).append(v[0])
    return {size: sorted(times) for size, times in data.items()}


def sim_options():
    """The ferroccl-sim options from the environment: the loop of SIM_CALLS calls, then SIM_ARGS."""
    return ["--calls", os.environ.get("SIM_CALLS", "4")] + os.environ.get("SIM_ARGS", "").split()


def simulate(sim, topo_file, algo, sizes):
    """{size: predicted us} for the sizes (one run per contiguous power-of-two range)."""
    out = {}
    lo, hi = min(sizes), max(sizes)
    args = [sim, "--topology", str(topo_file), "--algo", algo, "-b", str(lo), "-e", str(hi),
            "-f", "2", "--slice", "4M"] + sim_options()
    text = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 7 and f[0].isdigit() and f[5] == algo:
            out[int(f[0])] = float(f[6])
    return out


def main():
    sim, out_dir, nranks, per_host, placement, label = sys.argv[1:7]
    algos = sys.argv[7:]
    nranks, per_host = int(nranks), int(per_host)
    links = calibration(out_dir)
    topo = Path(out_dir) / "sim-topology.txt"
    lines = [f"ranks {nranks}", f"ranks_per_host {per_host}", f"placement {placement}",
             "intra shm", "inter tcp"]
    lines += [f"link {l} {a} {b}" for l, (a, b) in sorted(links.items())]
    reduce = reduce_rate(out_dir)
    if reduce is not None:
        lines.append(f"reduce {reduce}")
    topo.write_text("\n".join(lines) + "\n")
    extra = " ".join(sim_options())
    print(f"<!-- {label}: ferroccl-sim --topology {topo} {extra} with: " + "; ".join(lines)
          + " -->")
    print("| configuration | algo | size (B) | measured (us) | predicted (us) | predicted / measured "
          "| rounds: slowest / fastest |")
    print("|---|---|---:|---:|---:|---:|---:|")
    # Points within 25 %; points whose rounds agree within 25 % (the measurement repeats), and
    # how many of those are predicted within 25 %.
    within = total = steady = steady_within = 0
    for algo in algos:
        meas = measured(out_dir, nranks, algo)
        sizes = sorted(s for s in meas if s > 0)
        if not sizes:
            continue
        pred = simulate(sim, topo, algo, sizes)
        for s in sizes:
            if s not in pred:
                continue
            times = meas[s]
            r = pred[s] / times[0]
            spread = times[-1] / times[0]
            total += 1
            ok = 0.75 <= r <= 1.25
            within += ok
            repeats = len(times) > 1 and spread <= 1.25
            steady += repeats
            steady_within += repeats and ok
            flag = "" if ok else " (miss)"
            rounds = f"{spread:.2f} ({len(times)})" if len(times) > 1 else "-"
            print(f"| {label} | {algo} | {s} | {times[0]:.1f} | {pred[s]:.1f} | {r:.2f}{flag} "
                  f"| {rounds} |")
    print(f"\n{label}: {within} of {total} predictions within 25 % of measured")
    print(f"{label}: {steady} of {total} points repeat within 25 % across rounds; "
          f"{steady_within} of those {steady} predicted within 25 %")


if __name__ == "__main__":
    main()
