#!/usr/bin/env python3
"""Draws a merged ferroccl trace (ferroccl-trace merge ... -o all.json) as a PNG timeline:
one row per rank, one box per collective (colour by kind), the part of it spent waiting for
peers shaded darker. Needs matplotlib (the PyTorch environment of scripts/torch-env.sh has it).

    python3 scripts/trace-plot.py all.json out.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        events = [e for e in json.load(f) if e.get("ph") == "X"]
    if not events:
        sys.exit(f"{src}: no collective events")
    t0 = min(e["ts"] for e in events)
    kinds = sorted({e["name"] for e in events})
    colours = dict(zip(kinds, plt.cm.tab10.colors))
    ranks = sorted({e["pid"] for e in events})
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(ranks) + 1.5))
    for e in events:
        y = ranks.index(e["pid"])
        start = (e["ts"] - t0) / 1000.0
        dur = e["dur"] / 1000.0
        wait = min(sum(e["args"].get("wait_us", {}).values()) / 1000.0, dur)
        c = colours[e["name"]]
        ax.barh(y, dur, left=start, height=0.6, color=c, alpha=0.45, edgecolor="black", linewidth=0.3)
        ax.barh(y, wait, left=start, height=0.3, color=c, alpha=0.9)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds since the first collective")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in kinds]
    ax.legend(handles, kinds, loc="upper right", fontsize=8)
    ax.set_title(f"{len(events)} collectives on {len(ranks)} ranks (dark: time waiting for peers)")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
