"""POAD vs NTPO vs MS-GRPO on the text kitchen's easiest task (tomato salad) with the embedded SmolLM2-135M,
side by side on the CPU: the same preset (`experiment=kitchen_learn`), seed and wall-clock budget, one
process per algorithm started together, one torch thread each, so machine noise hits all three alike.

Each run evaluates its greedy policy on the standard task every `algo.eval_every` iterations. The script
reports, per algorithm: minutes and iterations to the first greedy eval with success >= the target and to
the first from which every later eval stays there ("held from"), the final greedy success and return, and
the NTPO/POAD and MS-GRPO/POAD ratios of iterations (and minutes) to the target; it writes `summary.json`,
`summary.md` and `learning_curves.png` into `--out`.

    .venv/bin/python benchmarks/poad_vs_ntpo.py                        # 30 minutes each, side by side
    .venv/bin/python benchmarks/poad_vs_ntpo.py --minutes 10 --algos poad ntpo
    .venv/bin/python benchmarks/poad_vs_ntpo.py --summarize outputs/bench/poad_vs_ntpo   # re-read runs
    .venv/bin/python benchmarks/poad_vs_ntpo.py --warmup --algos poad ntpo twosome --minutes 55

With `--warmup` a format warm-up runs first (`experiment=kitchen_warmup`: SFT on random valid actions
written in the answer format, into `<out>/warmup`, skipped when a complete one is there) and every
algorithm starts from it (`init_from`); its minutes are in the summary, to be counted in the budget.

Extra arguments are Hydra overrides for every run (e.g. `algo.learning_rate=1e-5`); the `env.` and `agent.`
ones go to the warm-up too (e.g. `env.actions=feasible`: each state lists only the actions that do something).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared step runner (rlft_bandit.py)
ALGOS = ("poad", "ntpo", "msgrpo")
CHOICES = (*ALGOS, "twosome")
NAMES = {"poad": "POAD", "ntpo": "NTPO", "msgrpo": "MS-GRPO", "twosome": "TWOSOME"}


def interface_overrides(extra: list[str]) -> list[str]:
    """The overrides among `extra` that the warm-up needs too: the env's and the agent's (the
    demonstrations are written through the same prompt and answer interface the runs train with)."""
    return [o for o in extra if o.lstrip("+~").startswith(("env.", "agent."))]


def warmup(
    out: Path,
    seed: int,
    threads: int,
    extra: list[str] = (),
    episodes: int | None = None,
    updates: int | None = None,
    demonstrations: str | None = None,
) -> float:
    """`agentrl train experiment=kitchen_warmup` into `<out>/warmup` through the shared step runner (a
    complete warm-up there is reused), with the env and agent overrides of `extra` and, where given, its
    demonstration episodes and updates; its minutes from start to end (status.json)."""
    from datetime import datetime

    from rlft_bandit import BenchmarkError, run_step

    args = ["train", "experiment=kitchen_warmup", f"seed={seed}", f"algo.torch_threads={threads}"]
    args += interface_overrides(list(extra))
    if episodes is not None:
        args.append(f"algo.episodes={episodes}")
    if updates is not None:
        args.append(f"algo.max_updates={updates}")
    if demonstrations is not None:
        args.append(f"algo.demonstrations={demonstrations}")
    try:
        run = run_step("warmup", args, out, threads)
    except BenchmarkError as exc:
        sys.exit(str(exc))
    saved = json.loads((run / "status.json").read_text())
    started, ended = (datetime.fromisoformat(saved[k]) for k in ("first_started", "ended"))
    return (ended - started).total_seconds() / 60


def launch(
    algo: str, out: Path, minutes: float, seed: int, threads: int, extra: list[str], share: float = 1.0
) -> subprocess.Popen:
    run = out / algo
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        "experiment=kitchen_learn",
        f"algo={algo}",
        f"seed={seed}",
        f"algo.time_limit_minutes={minutes}",
        f"algo.torch_threads={threads}",
        f"algo.memory_share={share:.4g}",  # the runs side by side split the machine's memory
        f"hydra.run.dir={run}",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "AGENTRL_NO_PROGRESS": "1"}
    log = open(out / f"{algo}.log", "w")  # noqa: SIM115 - closed when the process ends
    print(" ".join(cmd[2:]), flush=True)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def read_run(run: Path) -> dict:
    """Greedy eval points (iteration, minutes, success, return) and the final eval of one run."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    points = []
    before = run / "eval_before.json"
    if before.is_file():
        b = json.loads(before.read_text())
        points.append((0, 0.0, b["success_rate"], b["mean_return"]))
    for r in rows:
        if r.get("eval/success_rate") is not None:
            points.append((r["iteration"], r["time_s"] / 60, r["eval/success_rate"], r["eval/mean_return"]))
    final = json.loads((run / "eval.json").read_text()) if (run / "eval.json").is_file() else {}
    if final and rows:
        points.append(
            (rows[-1]["iteration"], rows[-1]["time_s"] / 60, final["success_rate"], final["mean_return"])
        )
    return {
        "points": points,
        "iterations": rows[-1]["iteration"] if rows else 0,
        "minutes": rows[-1]["time_s"] / 60 if rows else 0.0,
        "final_success": final.get("success_rate"),
        "final_return": final.get("mean_return"),
        "iteration_s": sum(r.get("iteration_s", 0) for r in rows) / max(len(rows), 1),
        "train_invalid_last": rows[-1].get("train/invalid_rate") if rows else None,
        "final_untagged": final.get("untagged_rate"),
    }


def first_at(points: list[tuple], target: float) -> tuple[int | None, float | None]:
    for iteration, minutes, success, _ in points:
        if success >= target:
            return iteration, minutes
    return None, None


def held_from(points: list[tuple], target: float) -> tuple[int | None, float | None]:
    """The first greedy eval from which every later one is at the target too (None when the last is not):
    a policy that reaches the target once and loses it again has not learned the task."""
    held: tuple[int | None, float | None] = (None, None)
    for iteration, minutes, success, _ in points:
        if success < target:
            held = (None, None)
        elif held[0] is None:
            held = (iteration, minutes)
    return held


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def task_of(out: Path, algos: list[str]) -> tuple[str, float]:
    """The kitchen task the runs trained on (their saved config) and its optimal return (the planner's)."""
    from omegaconf import OmegaConf

    from agentrl.envs.kitchen import TASKS, KitchenState, action_values

    task = "tomato_salad"
    for algo in algos:
        saved = out / algo / ".hydra" / "config.yaml"
        if saved.is_file():
            task = str(OmegaConf.load(saved).env.task)
            break
    return task, max(action_values(frozenset(TASKS[task]), KitchenState(), 20)) / 1000


def summarize(out: Path, algos: list[str], target: float, warmup_minutes: float | None = None) -> dict:
    runs = {a: read_run(out / a) for a in algos if (out / a / "metrics.jsonl").is_file()}
    task, optimal = task_of(out, algos)
    for data in runs.values():
        data["target_iteration"], data["target_minutes"] = first_at(data["points"], target)
        data["held_iteration"], data["held_minutes"] = held_from(data["points"], target)
    previous = out / "summary.json"
    if warmup_minutes is None and previous.is_file():  # --summarize keeps what the run measured
        warmup_minutes = json.loads(previous.read_text()).get("warmup_minutes")
    summary: dict = {"task": task, "target": target, "warmup_minutes": warmup_minutes, "runs": runs}
    if "poad" in runs:
        for other in ("ntpo", "msgrpo"):
            if other in runs:
                summary[f"{other}/poad_iterations"] = ratio(
                    runs[other]["target_iteration"], runs["poad"]["target_iteration"]
                )
                summary[f"{other}/poad_minutes"] = ratio(
                    runs[other]["target_minutes"], runs["poad"]["target_minutes"]
                )
                summary[f"{other}/poad_held_iterations"] = ratio(
                    runs[other]["held_iteration"], runs["poad"]["held_iteration"]
                )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    lines = [
        f"# {' vs '.join(NAMES[a] for a in runs)}, kitchen {task.replace('_', ' ')} (target greedy success >= {target})",
        "",
        *(
            [
                f"Every run started from the format warm-up `{out / 'warmup'}` ({warmup_minutes:.1f} min, not in the minutes below).",
                "",
            ]
            if warmup_minutes is not None
            else []
        ),
        "| algo | iterations | minutes | s/iteration | first at target (iteration, minutes) |"
        " held from (iteration, minutes) | final success | final return | untagged_rate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def when(iteration: int | None, minutes: float | None) -> str:
        return "-" if iteration is None else f"{iteration}, {minutes:.1f}"

    for name, d in runs.items():
        lines.append(
            f"| {name} | {d['iterations']} | {d['minutes']:.1f} | {d['iteration_s']:.0f} |"
            f" {when(d['target_iteration'], d['target_minutes'])} | {when(d['held_iteration'], d['held_minutes'])} |"
            f" {d['final_success']} | {d['final_return']} | {d['final_untagged']} |"
        )
    for key in (
        "ntpo/poad_iterations",
        "ntpo/poad_minutes",
        "ntpo/poad_held_iterations",
        "msgrpo/poad_iterations",
        "msgrpo/poad_minutes",
        "msgrpo/poad_held_iterations",
    ):
        if key in summary:
            lines.append(f"\n{key}: {summary[key]}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    plot(runs, target, out / "learning_curves.png", task, optimal)
    print("\n".join(lines))
    return summary


def plot(runs: dict, target: float, path: Path, task: str = "tomato_salad", optimal: float = 1.396) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, d) in enumerate(runs.items()):
        if not d["points"]:
            continue
        iterations, minutes, success, returns = zip(*d["points"], strict=True)
        axes[0].plot(iterations, success, "o-", color=f"C{i}", label=name)
        axes[1].plot(minutes, returns, "o-", color=f"C{i}", label=name)
    axes[0].axhline(target, color="0.5", ls="--", lw=1, label=f"target {target}")
    axes[0].set_xlabel("iteration")
    axes[0].set_ylabel("greedy success (standard task)")
    axes[0].set_ylim(-0.03, 1.03)
    axes[1].axhline(optimal, color="0.5", ls=":", lw=1, label=f"optimal return {optimal:g}")
    axes[1].set_xlabel("training wall-clock (minutes, side by side)")
    axes[1].set_ylabel("greedy return")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"Kitchen ({task.replace('_', ' ')}), SmolLM2-135M on CPU: {' vs '.join(NAMES[a] for a in runs)}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget of each run")
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=CHOICES)
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="start every run from a format warm-up (experiment=kitchen_warmup)",
    )
    parser.add_argument(
        "--warmup-episodes",
        type=int,
        default=None,
        help="the warm-up's demonstration episodes (algo.episodes)",
    )
    parser.add_argument(
        "--warmup-updates", type=int, default=None, help="the warm-up's updates of 8 rows (algo.max_updates)"
    )
    parser.add_argument(
        "--warmup-demonstrations",
        choices=("random", "scored"),
        default=None,
        help="the warm-up's demonstrations (algo.demonstrations; the preset's: random)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench" / "poad_vs_ntpo")
    parser.add_argument(
        "--summarize", type=Path, default=None, help="only summarise existing runs in this dir"
    )
    args, extra = parser.parse_known_args()
    if args.summarize:
        summarize(args.summarize, args.algos, args.target)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    warmup_minutes = None
    if args.warmup:
        warmup_minutes = warmup(
            args.out,
            args.seed,
            args.threads * len(args.algos),
            extra,
            args.warmup_episodes,
            args.warmup_updates,
            args.warmup_demonstrations,
        )
        extra = [f"init_from={args.out / 'warmup'}", *extra]
    start = time.perf_counter()
    share = 1 / len(args.algos)
    procs = {a: launch(a, args.out, args.minutes, args.seed, args.threads, extra, share) for a in args.algos}
    codes = {a: p.wait() for a, p in procs.items()}
    print(f"all runs ended after {(time.perf_counter() - start) / 60:.1f} min; exit codes {codes}")
    summarize(args.out, args.algos, args.target, warmup_minutes)


if __name__ == "__main__":
    main()
