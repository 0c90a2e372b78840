#!/usr/bin/env python3
"""Latency against throughput from pruneserve-loadtest sweeps (--sweep-rates ...
--result-file F.json): one line per file, one point per request rate.

    python3 loadtest/plot.py sweep-full.json:full sweep-mix.json:mix -o docs/latency-throughput.png

Panels: p50 and p99 TTFT, p50 TPOT and p99 E2E latency, each against the output
token throughput the run achieved; each point is labelled with its request rate."""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [("p50 / p99 TTFT (s)", ["median_ttft_ms", "p99_ttft_ms"]),
          ("p50 TPOT (ms)", ["median_tpot_ms"]),
          ("p99 end-to-end latency (s)", ["p99_e2el_ms"])]


def load(spec):
    path, _, label = spec.partition(":")
    with open(path) as f:
        doc = json.load(f)
    runs = doc["runs"]
    if not runs:
        sys.exit(f"{path}: no runs")
    return label or doc["config"].get("strategy_mix", path), runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="FILE.json or FILE.json:LABEL")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--title", default="pruneserve: latency against throughput")
    args = ap.parse_args()
    series = [load(s) for s in args.results]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.8))
    for ax, (ylabel, keys) in zip(axes, PANELS):
        for i, (label, runs) in enumerate(series):
            x = [r["output_throughput"] for r in runs]
            for key in keys:
                scale = 1e-3 if key.endswith("ttft_ms") or key.endswith("e2el_ms") else 1.0
                y = [r[key] * scale for r in runs]
                style = "--" if key.startswith("p99") and len(keys) > 1 else "-"
                name = f"{label} {key.split('_')[0].replace('median', 'p50')}" if len(keys) > 1 else label
                ax.plot(x, y, style, marker="o", color=f"C{i}", label=name)
                if key == keys[-1]:
                    for xi, yi, r in zip(x, y, runs):
                        ax.annotate(f"{r['request_rate']}/s", (xi, yi), textcoords="offset points", xytext=(4, 4),
                                    fontsize=7)
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
