"""Compare learning runs of `benchmarks/learn_frozenlake.py` (e.g. AAW vs uniform episode sampling).

Reads each run directory's `learn_summary.json` and `metrics.jsonl`, prints the minutes (and
iterations) to the first greedy eval at the target and to the first eval from which it stays there,
the ratio of each run's time to the first run's, and draws both learning curves in one PNG.

    .venv/bin/python benchmarks/learn_frozenlake.py --minutes 30 --threads 1 --out outputs/bench/aaw &
    .venv/bin/python benchmarks/learn_frozenlake.py --minutes 30 --threads 1 --out outputs/bench/uniform \\
        algo.aaw.enabled=false
    .venv/bin/python benchmarks/compare_learning.py outputs/bench/aaw outputs/bench/uniform \\
        --labels AAW uniform --out outputs/bench/aaw_vs_uniform.png

Run the compared runs side by side (one thread each on a 2-core machine), so that both see the same
machine load: the ratio is then meaningful even where bare times are noisy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from learn_frozenlake import times_to_target  # this script's directory is on sys.path


def load(run: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((run / "learn_summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return summary, rows


def ratio(value: float | None, reference: float | None) -> str:
    if value is None or reference is None:
        return "n/a"
    return f"{value / reference:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (the first is the reference)")
    parser.add_argument("--labels", nargs="*", default=None)
    parser.add_argument("--out", type=Path, default=None, help="PNG with the greedy eval curves")
    args = parser.parse_args()
    labels = args.labels or [run.name for run in args.runs]
    if len(labels) != len(args.runs):
        parser.error("give one label per run")
    loaded = [load(run) for run in args.runs]

    def minutes(row: dict | None) -> float | None:
        return None if row is None else round(row["time_s"] / 60, 2)

    def cell(row: dict | None) -> str:
        return "not reached" if row is None else f"{minutes(row)} min (iteration {row['iteration']})"

    reached = [
        times_to_target(rows, summary.get("target", 0.9), summary["after_success_rate"])
        for summary, rows in loaded
    ]
    print(
        "| run | greedy success before -> after | iterations | first eval at target | stays at target from "
        "| time to stay, vs first run | untagged_rate after |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, (summary, _), (first, stable) in zip(labels, loaded, reached, strict=True):
        print(
            f"| {label} | {summary['before_success_rate']} -> {summary['after_success_rate']} "
            f"| {summary['iterations']} | {cell(first)} | {cell(stable)} "
            f"| {ratio(minutes(stable), minutes(reached[0][1]))} | {summary.get('after_untagged_rate', 'n/a')} |"
        )

    if args.out:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for k, (label, (summary, rows)) in enumerate(zip(labels, loaded, strict=True)):
            evals = [
                (r["time_s"] / 60, r["eval/success_rate"])
                for r in rows
                if r.get("eval/success_rate") is not None
            ]
            before = summary.get("before_success_rate")
            points = ([(0.0, before)] if before is not None else []) + evals
            if points:
                ax.plot(*zip(*points, strict=True), "o-", ms=3, color=f"C{k}", label=f"{label}: greedy eval")
            ax.plot(
                [r["time_s"] / 60 for r in rows],
                [r.get("train/success_rate", 0) for r in rows],
                color=f"C{k}",
                lw=0.8,
                alpha=0.4,
                label=f"{label}: train (sampled)",
            )
        ax.axhline(0.9, color="C3", ls="--", lw=1, label="target 0.9")
        ax.set_xlabel("training wall-clock (minutes)")
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.03, 1.03)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=120)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
