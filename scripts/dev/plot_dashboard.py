#!/usr/bin/env python3
"""Draws the Grafana dashboard's queries from a real run, with matplotlib.

    VRAMHOOK_FLEET_DATA=/tmp/fleet cargo test -p vramhook --test agent_backends two_hosts
    python3 scripts/dev/plot_dashboard.py /tmp/fleet/queries.json docs/dashboard-fleet.png

queries.json is what the test wrote: every query of deploy/grafana/vramhook.json (as
Prometheus ran it) with its range result over the run, from two agents (hosts gpu-a and
gpu-b) through one collector into Prometheus. One plot per query, one line per series.
"""
import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The labels that name a series in a legend, in this order (instance first: the host).
LEGEND_LABELS = ["instance", "hw_name", "process_executable_name", "process_pid", "device", "kind", "verdict"]


def legend(metric):
    parts = []
    for key in LEGEND_LABELS:
        if key in metric and metric[key] != "":
            value = metric[key]
            parts.append(f"pid {value}" if key == "process_pid" else (f"gpu {value}" if key == "device" else value))
    return " ".join(parts) or metric.get("__name__", "")


def scale(query, values):
    """Bytes in MiB, ratios as they are."""
    if "ratio" in query or "/ hw_gpu" in query or "increase(" in query:
        return values, ""
    return [v / (1 << 20) for v in values], " (MiB)"


def main(src, out):
    with open(src) as f:
        panels = [p for p in json.load(f) if not p["query"].startswith("group by")]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 3.6 * rows), squeeze=False)
    t0 = min((float(v[0]) for p in panels for s in p["result"] for v in s["values"]), default=0.0)
    for ax, panel in zip(axes.flat, panels):
        series = sorted(panel["result"], key=lambda s: legend(s["metric"]))
        # Series that stay at zero are left out where others are not (every verdict and
        # kind is exported from zero); a panel of zeros keeps them.
        nonzero = [s for s in series if any(float(v[1]) != 0 for v in s["values"])]
        hidden = len(series) - len(nonzero) if nonzero else 0
        series = nonzero or series
        unit = ""
        for s in series[:12]:
            xs = [float(v[0]) - t0 for v in s["values"]]
            ys, unit = scale(panel["query"], [float(v[1]) for v in s["values"]])
            ax.plot(xs, ys, label=legend(s["metric"]), linewidth=1.4)
        ax.set_title("\n".join(textwrap.wrap(panel["query"].replace('{instance=~".*"}', ""), 62)), fontsize=7.5)
        ax.set_xlabel("s since the test started", fontsize=7)
        ax.tick_params(labelsize=7)
        if unit:
            ax.set_ylabel(unit.strip(" ()"), fontsize=7)
        if hidden:
            ax.plot([], [], " ", label=f"({hidden} series at 0 not drawn)")
        ax.legend(fontsize=6, loc="best")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(
        "vramhook dashboard queries, two agents (gpu-a, gpu-b) through one collector into Prometheus 3 "
        "(drawn by scripts/dev/plot_dashboard.py with matplotlib)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=90)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_dashboard.py QUERIES.json OUT.png")
    main(sys.argv[1], sys.argv[2])
