#!/usr/bin/env python3
"""Accuracy against TTFT speedup, one PNG per prompt length, from pruneserve-eval's
--summary CSV: each strategy at (speedup over full, accuracy pooled over the tasks)
with its 95% interval, full's interval shaded. Usage: eval_plots.py SUMMARY.csv OUTDIR;
writes OUTDIR/NAME.LENGTH.png, NAME the summary's file name less ".summary.csv".
Needs matplotlib: installed into .cache/plot-venv from PyPI on first use."""
import csv
import os
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".cache", "plot-venv")


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    python = os.path.join(VENV, "bin", "python")
    if os.environ.get("PS_PLOT_VENV") != "1":
        if not os.path.exists(python):
            venv.create(VENV, with_pip=True)
            subprocess.check_call([python, "-m", "pip", "install", "-q", "matplotlib"])
        os.execve(python, [python] + sys.argv, dict(os.environ, PS_PLOT_VENV="1"))
    raise SystemExit("eval_plots.py: matplotlib is not available")


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    ensure_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["task"] == "all" and int(r["n"]) > 0]
    model = rows[0]["model"] if rows else "model"
    name = os.path.basename(sys.argv[1]).removesuffix(".summary.csv")
    for length in sorted({int(r["length"]) for r in rows}):
        at = [r for r in rows if int(r["length"]) == length]
        if all(r["speedup"] in ("nan", "") for r in at):
            continue  # no timing yet: no point to place
        fig, ax = plt.subplots(figsize=(7, 4.5))
        full = next((r for r in at if r["strategy"] == "full"), None)
        if full is not None:
            ax.axhspan(float(full["lo"]), float(full["hi"]), color="0.85", label="full's 95% interval")
        for i, r in enumerate(at):  # labels staggered: strategies that run as full sit on one spot
            speedup = float(r["speedup"]) if r["speedup"] not in ("nan", "") else float("nan")
            if speedup != speedup:  # not timed: no point to place
                continue
            score, lo, hi = float(r["score"]), float(r["lo"]), float(r["hi"])
            ax.errorbar(speedup, score, yerr=[[score - lo], [hi - score]], fmt="o", capsize=3)
            ax.annotate(r["strategy"], (speedup, score), textcoords="offset points", xytext=(6, 8 - 10 * (i % 4)), fontsize=8)
        ax.set_xlabel("TTFT speedup over full (median of the timing repeats)")
        ax.set_ylabel("accuracy, all tasks (95% interval)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{model}, {length} tokens (n = {full['n'] if full else '?'} prompts per strategy)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
        out = os.path.join(sys.argv[2], f"{name}.{length}.png")
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        print(out)


if __name__ == "__main__":
    main()
