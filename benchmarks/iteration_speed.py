"""Seconds and learning per training iteration, side by side: code trees and/or Hydra overrides.

A *side* is a code tree plus extra Hydra overrides. `--baseline REV` adds the side "baseline" (REV
checked out in a temporary `git worktree`, removed afterwards) and the side "current" (this tree);
`--side LABEL=OVERRIDE[,OVERRIDE...]` adds a side on this tree with those overrides. Every run is

    python -m agentrl.cli train experiment=<preset> algo.iterations=N seed=S <bench overrides> \\
        <extra overrides> <side overrides> hydra.run.dir=<out>/<preset>/<side>/seed<S>

in a subprocess whose working directory and PYTHONPATH are the side's tree, with OMP_NUM_THREADS and
algo.torch_threads = --threads. The bench overrides drop what is not the iteration (no eval before
training, no periodic evals, no checkpoints, no final model, no transcripts) and keep a small final
eval (`--eval-episodes`). Runs go one at a time, interleaved: for each seed and preset every side
runs once, the order reversed from one preset to the next, so machine noise hits all sides alike.

Per side and preset: the median `iteration_s` (and `rollout_s`, `credit_s`, `prepare_s`, `update_s`) over the iterations of all
seeds, iteration 1 excluded as warm-up when N >= 3; speedup = side's median / the reference side's
("current", else the first side); learning: the mean training return per iteration and over the
iterations, and the greedy eval after training, with standard errors.

    # issue 23: today's code against main when the issue was filed, the four CPU presets
    python benchmarks/iteration_speed.py --baseline 7474c5f --threads 2
    # precisions on today's code
    python benchmarks/iteration_speed.py --side fp32=algo.precision=fp32 \\
        --side bf16=algo.precision=bf16-mixed
    python benchmarks/iteration_speed.py --baseline 7474c5f --dry-run     # the planned commands only

Extra Hydra overrides for every side go after `--`. Results: a table on stdout, and
`--out`/iteration_speed.{json,md}. A failed run is recorded (exit code, log tail), marked in the
table, and makes the script exit 1 after the other runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("frozenlake_learn", "kitchen_learn", "snake_learn", "rlft_tictactoe")
#: credit_s: the credit assignment (with a critic, its trunk's forward over every row); prepare_s: the
#: no-grad forwards the rows carry into the update (reference and old log-probs)
PHASES = ("iteration_s", "rollout_s", "credit_s", "prepare_s", "update_s")
TRAIN_KEYS = ("train/mean_return", "train/success_rate", "train/invalid_rate", "train/untagged_rate")
#: an iteration's work, which differs between sides whose agents act differently (episode lengths, a
#: second rollout round, the update's rows); every version of `agentrl train` compared so far writes them
WORK_KEYS = ("train/episodes", "train/mean_length", "rollout_rounds", "samples", "train_tokens")
#: seconds per unit of work: the rollout's per environment step of all its episodes, the update's per
#: 1,000 tokens of its rows (prompt + completion, a shared head counted in every row)
RATES = ("rollout_s_per_step", "update_s_per_ktoken")
#: keys the benchmark sets itself: an override of one would break the run layout or the comparison
OWNED_KEYS = frozenset({"experiment", "seed", "algo.iterations", "hydra.run.dir"})
LABEL = re.compile(r"[A-Za-z0-9_.-]+")


class BenchError(Exception):
    """A problem that stops the benchmark before it measures anything (one line)."""


@dataclass
class Side:
    label: str
    overrides: list[str]
    rev: str | None = None  # None: the current tree
    commit: str = ""
    tree: Path = REPO
    plans: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        tree = str(self.tree) if self.rev is None else f"git worktree of {self.rev} ({self.commit})"
        return {
            "label": self.label,
            "overrides": self.overrides,
            "rev": self.rev or "working tree",
            "commit": self.commit,
            "tree": tree,
            "plans": self.plans,
        }


# ---- sides and commands ----------------------------------------------------------------------------
def parse_side(text: str) -> tuple[str, list[str]]:
    """`LABEL=OVERRIDE[,OVERRIDE...]` -> (label, overrides); `LABEL=` is the current code as it is."""
    label, sep, rest = text.partition("=")
    if not sep or not LABEL.fullmatch(label):
        raise BenchError(
            f"--side {text!r}: expected LABEL=OVERRIDE[,OVERRIDE...] (label: letters, digits, _.-)"
        )
    overrides = [o for o in rest.split(",") if o]
    check_overrides(overrides, f"--side {label}")
    return label, overrides


def check_overrides(overrides: list[str], where: str) -> None:
    for override in overrides:
        key, sep, _ = override.partition("=")
        if not sep:
            raise BenchError(f"{where}: {override!r} is not a KEY=VALUE override")
        if key.lstrip("+~") in OWNED_KEYS:
            raise BenchError(
                f"{where}: {key} is set by the benchmark (use --presets/--seeds/--iterations/--out)"
            )


def build_sides(baseline: str | None, side_args: list[str]) -> list[Side]:
    sides = [Side(label, overrides) for label, overrides in map(parse_side, side_args)]
    if baseline is not None or not sides:
        if all(s.label != "current" for s in sides):
            sides.insert(0, Side("current", []))
    if baseline is not None:
        if any(s.label == "baseline" for s in sides):
            raise BenchError("--side baseline: the label 'baseline' is --baseline's")
        sides.insert(0, Side("baseline", [], rev=baseline, commit=resolve_rev(baseline)))
    labels = [s.label for s in sides]
    if len(set(labels)) != len(labels):
        raise BenchError(f"side labels must be unique: {', '.join(labels)}")
    for side in sides:
        side.commit = side.commit or working_tree_commit()
    return sides


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise BenchError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout.strip()


def resolve_rev(rev: str) -> str:
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except BenchError:
        raise BenchError(f"--baseline {rev}: not a commit of {REPO}") from None


def working_tree_commit() -> str:
    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + (" + uncommitted changes" if dirty else "")
    except BenchError:  # a copy outside git can still compare overrides
        return "unknown (not a git checkout)"


def bench_overrides(args: argparse.Namespace) -> list[str]:
    """What every run sets besides the preset: nothing but the iterations and a small final eval."""
    return [
        "algo.eval_before=false",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
        "algo.save_final=false",
        "eval.transcripts=false",
        f"eval.episodes={args.eval_episodes}",
        f"algo.torch_threads={args.threads}",
    ]


def train_command(side: Side, preset: str, seed: int, args: argparse.Namespace) -> list[str]:
    run_dir = run_path(args.out, preset, side.label, seed)
    return [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        f"experiment={preset}",
        f"algo.iterations={args.iterations}",
        f"seed={seed}",
        *bench_overrides(args),
        *args.overrides,
        *side.overrides,
        f"hydra.run.dir={run_dir}",
    ]


def run_path(out: Path, preset: str, label: str, seed: int) -> Path:
    return out.resolve() / preset / label / f"seed{seed}"


def side_env(tree: Path, threads: int) -> dict[str, str]:
    """The side's tree first on PYTHONPATH, then what this process had there (packages installed beside
    the system's, as on a machine that carries its wheels)."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, AGENTRL_NO_PROGRESS="1", TOKENIZERS_PARALLELISM="false")
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def schedule(seeds: list[int], presets: list[str], sides: list[Side]) -> list[tuple[int, str, Side]]:
    """Every (seed, preset) block runs each side once; the order flips from block to block."""
    order: list[tuple[int, str, Side]] = []
    for block, (seed, preset) in enumerate((s, p) for s in seeds for p in presets):
        for side in sides if block % 2 == 0 else sides[::-1]:
            order.append((seed, preset, side))
    return order


# ---- trees and checks ------------------------------------------------------------------------------
@contextlib.contextmanager
def baseline_tree(side: Side | None) -> Iterator[None]:
    """Check the baseline out in a temporary git worktree for the block's duration; removed afterwards,
    also on Ctrl-C, SIGTERM or an error."""
    if side is None:
        yield
        return
    path = Path(tempfile.mkdtemp(prefix="agentrl-baseline-"))
    try:
        git("worktree", "add", "--detach", str(path), side.commit)
        side.tree = path
        yield
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], capture_output=True
        )
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)


def _raise_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM unwinds like Ctrl-C: the running training is ended and the worktree removed."""
    raise KeyboardInterrupt


def check_import(side: Side, threads: int) -> None:
    """The subprocess must import agentrl from the side's own tree (PYTHONPATH ahead of the venv's
    editable install)."""
    code = "import agentrl; print(agentrl.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=side.tree,
        env=side_env(side.tree, threads),
        capture_output=True,
        text=True,
    )
    found = Path(done.stdout.strip() or "?").resolve()
    if done.returncode != 0 or found.parent.parent != side.tree.resolve():
        raise BenchError(f"side {side.label}: agentrl imports from {found}, not from {side.tree}")


def check_config(side: Side, preset: str, args: argparse.Namespace) -> None:
    """`agentrl train --dry-run` with the run's own overrides: a key one side's schema lacks fails
    here, before anything trains; the plan (precision, sizes) goes into the JSON."""
    command = train_command(side, preset, 0, args)
    command.insert(4, "--dry-run")
    done = subprocess.run(
        command, cwd=side.tree, env=side_env(side.tree, args.threads), capture_output=True, text=True
    )
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "failed").splitlines()[-1]
        raise BenchError(f"side {side.label}, {preset}: the config does not compose: {last}")
    side.plans[preset] = done.stdout.strip()


# ---- one run ---------------------------------------------------------------------------------------
def run_one(side: Side, preset: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    command = train_command(side, preset, seed, args)
    run_dir = run_path(args.out, preset, side.label, seed)
    shutil.rmtree(run_dir, ignore_errors=True)  # the benchmark's own directory: a fresh run each time
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.with_suffix(".log")
    start = time.perf_counter()
    with log.open("w") as handle:
        process = subprocess.Popen(
            command,
            cwd=side.tree,
            env=side_env(side.tree, args.threads),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        rc = wait(process, args.timeout_minutes * 60)
    record = {
        "preset": preset,
        "side": side.label,
        "seed": seed,
        "command": shlex.join(command),
        "cwd": str(side.tree),
        "rc": rc,
        "wall_s": round(time.perf_counter() - start, 2),
        "run_dir": str(run_dir),
        "log": str(log),
    }
    record.update(read_run(run_dir, args.iterations))
    if rc != 0 or record.get("missing"):
        record["status"] = "failed" if rc != 124 else "timed out"
        record["log_tail"] = log.read_text(errors="replace").splitlines()[-20:]
    else:
        record["status"] = "ok"
    return record


def wait(process: subprocess.Popen, timeout_s: float) -> int:
    """The run's exit code; 124 when it ran past the timeout. Its whole process group is ended on a
    timeout or an interrupt, so no training outlives the benchmark."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 124
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


# ---- reading and summarising -----------------------------------------------------------------------
def read_run(run_dir: Path, iterations: int) -> dict[str, Any]:
    """A run's iterations (metrics.jsonl), the medians of its phase times, and its eval after training
    (eval.json, the episodes' returns from episodes.jsonl); `missing` lists what it did not write."""
    missing = [name for name in ("metrics.jsonl", "eval.json") if not (run_dir / name).is_file()]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    kept = ("iteration", *PHASES, *TRAIN_KEYS, *WORK_KEYS)
    result: dict[str, Any] = {"iterations": [with_rates({k: row.get(k) for k in kept}) for row in rows]}
    if len(rows) < iterations:
        missing.append(f"iterations {len(rows) + 1}..{iterations}")
    result["median"] = phase_medians(result["iterations"], warmup=iterations >= 3)
    if (run_dir / "eval.json").is_file():
        result["eval"] = json.loads((run_dir / "eval.json").read_text())
        result["eval_returns"] = [e.get("return") for e in read_jsonl(run_dir / "episodes.jsonl")]
    if missing:
        result["missing"] = missing
    return result


def with_rates(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its rollout steps and its seconds per unit of work (None where a key is missing)."""
    episodes, length = row.get("train/episodes"), row.get("train/mean_length")
    steps = (
        episodes * length if isinstance(episodes, int | float) and isinstance(length, int | float) else None
    )
    tokens = row.get("train_tokens")
    return {
        **row,
        "rollout_steps": steps,
        "rollout_s_per_step": per(row.get("rollout_s"), steps),
        "update_s_per_ktoken": per(
            row.get("update_s"), tokens / 1000 if isinstance(tokens, int | float) else None
        ),
    }


def per(value: Any, amount: Any) -> float | None:
    ok = isinstance(value, int | float) and isinstance(amount, int | float) and amount > 0
    return value / amount if ok else None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def timed(rows: list[dict[str, Any]], warmup: bool) -> list[dict[str, Any]]:
    """The rows whose times count: all but iteration 1 when it is a warm-up."""
    return [r for r in rows if not (warmup and r.get("iteration") == 1)]


def phase_medians(rows: list[dict[str, Any]], warmup: bool) -> dict[str, float | None]:
    counted = timed(rows, warmup)
    return {phase: median([r.get(phase) for r in counted]) for phase in PHASES}


def median(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    return statistics.median(numbers) if numbers else None


def mean_se(values: list[Any]) -> tuple[float | None, float | None]:
    """Mean and standard error (None where there are too few values)."""
    numbers = [float(v) for v in values if isinstance(v, int | float)]
    if not numbers:
        return None, None
    se = statistics.stdev(numbers) / math.sqrt(len(numbers)) if len(numbers) > 1 else None
    return statistics.mean(numbers), se


def summarize(
    runs: list[dict[str, Any]], sides: list[str], presets: list[str], warmup: bool, reference: str
) -> list[dict[str, Any]]:
    """One row per preset and side; speedups against the reference side of the same preset."""
    rows = []
    for preset in presets:
        block = {
            label: summarize_side([r for r in runs if (r["preset"], r["side"]) == (preset, label)], warmup)
            for label in sides
        }
        ref = block.get(reference, {})
        for label in sides:
            row = {"preset": preset, "side": label, **block[label]}
            for phase in (*PHASES, *RATES):
                row[f"speedup_{phase}"] = ratio(row[f"median_{phase}"], ref.get(f"median_{phase}"))
            rows.append(row)
    return rows


def summarize_side(runs: list[dict[str, Any]], warmup: bool) -> dict[str, Any]:
    ok = [r for r in runs if r["status"] == "ok"]
    pooled = [row for r in ok for row in timed(r["iterations"], warmup)]
    summary: dict[str, Any] = {"runs": len(runs), "failed": len(runs) - len(ok)}
    summary.update({f"median_{phase}": median([row.get(phase) for row in pooled]) for phase in PHASES})
    work = ("rollout_steps", "train_tokens", "rollout_rounds", *RATES)
    summary.update({f"median_{key}": median([row.get(key) for row in pooled]) for key in work})
    summary.update(learning(ok))
    return summary


def learning(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Training return per iteration and its mean over the iterations (mean, SE over seeds: the
    iterations of one run are no samples of one quantity while it learns), and the eval after training
    (SE over the pooled episodes)."""
    per_run = [{row["iteration"]: row.get("train/mean_return") for row in r["iterations"]} for r in runs]
    steps = sorted({k for run in per_run for k in run})
    curve = []
    for k in steps:
        mean, se = mean_se([run.get(k) for run in per_run])
        curve.append({"iteration": k, "mean": mean, "se": se})
    train_return, train_se = mean_se([mean_se(list(run.values()))[0] for run in per_run])
    evals = [r.get("eval", {}) for r in runs]
    episodes = [x for r in runs for x in r.get("eval_returns", [])]
    eval_mean, eval_se = mean_se(episodes or [e.get("mean_return") for e in evals])
    return {
        "train_return_per_iteration": curve,
        "train_return": train_return,
        "train_return_se": train_se,
        "train_success_rate": mean_se(
            [row.get("train/success_rate") for r in runs for row in r["iterations"]]
        )[0],
        "train_invalid_rate": mean_se(
            [row.get("train/invalid_rate") for r in runs for row in r["iterations"]]
        )[0],
        "eval_return": eval_mean,
        "eval_return_se": eval_se,
        "eval_success_rate": mean_se([e.get("success_rate") for e in evals])[0],
        "eval_invalid_rate": mean_se([e.get("invalid_rate") for e in evals])[0],
        "eval_episodes": len(episodes),
    }


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


# ---- output ----------------------------------------------------------------------------------------
def cell(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def seconds(value: float | None) -> str:
    """Three significant figures up to 100 s (tiny test runs take hundredths)."""
    if value is None:
        return "n/a"
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def pm(mean: float | None, se: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.2f}" + (f"±{se:.2f}" if se is not None else "")


def table(rows: list[dict[str, Any]]) -> str:
    """The stdout table (80 columns with the usual labels)."""
    p = max([len("preset"), *(len(r["preset"]) for r in rows)])
    s = max([len("side"), *(len(r["side"]) for r in rows)])
    head = f"{'preset':<{p}} {'side':<{s}} {'s/iter':>6} {'rollout':>7} {'update':>6} {'speedup':>7} "
    lines = [head + f"{'train ret':>11} {'eval ret':>11}"]
    for r in rows:
        per_iteration = "FAILED" if r["failed"] == r["runs"] else seconds(r["median_iteration_s"])
        lines.append(
            f"{r['preset']:<{p}} {r['side']:<{s}} {per_iteration:>6} {seconds(r['median_rollout_s']):>7} "
            f"{seconds(r['median_update_s']):>6} {cell(r['speedup_iteration_s'], '.2f', 'x'):>7} "
            f"{pm(r['train_return'], r['train_return_se']):>11} {pm(r['eval_return'], r['eval_return_se']):>11}"
            + (f"  {r['failed']} failed" if 0 < r["failed"] < r["runs"] else "")
        )
    return "\n".join(lines)


def notes(result: dict[str, Any]) -> list[str]:
    warm = "iteration 1 excluded as warm-up" if result["warmup_excluded"] else "every iteration counted"
    lines = [
        f"seconds: medians over iterations ({warm}); speedup = side's s/iter / {result['reference']}'s",
        "train ret: mean training return over the iterations, ± SE over seeds (none with one seed);",
        "eval ret: greedy eval after training, ± SE over its episodes",
    ]
    for run in result["runs"]:
        if run["status"] != "ok":
            lines.append(
                f"{run['status']}: {run['preset']}/{run['side']}/seed{run['seed']} rc={run['rc']}, "
                f"log {run['log']}"
            )
    return lines


def markdown(result: dict[str, Any]) -> str:
    rows = result["summary"]
    lines = [
        "# Seconds and learning per iteration",
        "",
        f"`{result['command']}`",
        "",
        f"{result['cpu_model']}{_emulation(result.get('cpu_environment'))}, threads {result['threads']}; "
        f"load average {result['load_average']['start']} "
        f"at the start, {result['load_average']['end']} at the end; seeds {result['seeds']}, "
        f"{result['iterations']} iterations per run.",
        "",
        *(f"- {s['label']}: {s['tree']} {' '.join(s['overrides'])}".rstrip() for s in result["sides"]),
        "",
        "| preset | side | s/iter | rollout s | credit s | prepare s | update s | speedup | train return | "
        "train success | train invalid | eval return | eval success | runs (failed) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['side']} | {seconds(r['median_iteration_s'])} | {seconds(r['median_rollout_s'])} "
            f"| {seconds(r['median_credit_s'])} | {seconds(r['median_prepare_s'])} | {seconds(r['median_update_s'])} | {cell(r['speedup_iteration_s'], '.2f', 'x')} "
            f"| {pm(r['train_return'], r['train_return_se'])} | {cell(r['train_success_rate'], '.2f')} "
            f"| {cell(r['train_invalid_rate'], '.2f')} | {pm(r['eval_return'], r['eval_return_se'])} "
            f"| {cell(r['eval_success_rate'], '.2f')} | {r['runs']} ({r['failed']}) |"
        )
    lines += [
        "",
        "Work per iteration (medians over the same iterations) and seconds per unit of it: the sides' agents "
        "act differently, so an iteration's rollout steps and update tokens differ between them:",
        "",
        "| preset | side | rollout steps | rollout rounds | update tokens | rollout ms/step | speedup "
        "| update ms/1k tokens | speedup |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms = [None if r[f"median_{k}"] is None else 1000 * r[f"median_{k}"] for k in RATES]
        lines.append(
            f"| {r['preset']} | {r['side']} | {cell(r['median_rollout_steps'], '.0f')} "
            f"| {cell(r['median_rollout_rounds'], '.0f')} | {cell(r['median_train_tokens'], '.0f')} "
            f"| {cell(ms[0], '.0f')} | {cell(r['speedup_rollout_s_per_step'], '.2f', 'x')} "
            f"| {cell(ms[1], '.0f')} | {cell(r['speedup_update_s_per_ktoken'], '.2f', 'x')} |"
        )
    steps = max((len(r["train_return_per_iteration"]) for r in rows), default=0)
    lines += [
        "",
        "Training return per iteration (mean ± SE over seeds):",
        "",
        "| preset | side | " + " | ".join(f"it {k + 1}" for k in range(steps)) + " |",
        "|---|---|" + "---|" * steps,
    ]
    for r in rows:
        points = [pm(c["mean"], c["se"]) for c in r["train_return_per_iteration"]]
        lines.append(f"| {r['preset']} | {r['side']} | " + " | ".join(points) + " |")
    return "\n".join([*lines, "", *notes(result), ""])


#: what makes a CPU run as another: agentrl's probes (agentrl/kernels/features.py) and torch's libraries
CPU_ENVIRONMENT = (
    "AGENTRL_CPU_FEATURES",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
)


def cpu_environment() -> dict[str, str]:
    """The variables of CPU_ENVIRONMENT set for the runs (every side inherits them)."""
    return {name: os.environ[name] for name in CPU_ENVIRONMENT if os.environ.get(name)}


def _emulation(environment: dict[str, str] | None) -> str:
    return f" with {', '.join(f'{k}={v}' for k, v in environment.items())}" if environment else ""


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


# ---- main ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", metavar="REV", help="git revision to compare with (side 'baseline')")
    parser.add_argument(
        "--side",
        action="append",
        default=[],
        metavar="LABEL=OVERRIDE[,OVERRIDE...]",
        help="a side on this tree with these overrides (repeatable)",
    )
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--iterations", type=int, default=3, help="iterations per run (default 3)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS and algo.torch_threads")
    parser.add_argument("--eval-episodes", type=int, default=4, help="episodes of the eval after training")
    parser.add_argument("--timeout-minutes", type=float, default=60.0, help="per run (default 60)")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/iteration_speed"))
    parser.add_argument("--dry-run", action="store_true", help="print the planned commands and exit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every side (after --)")
    args = parser.parse_args(argv)
    for name in ("iterations", "threads", "eval_episodes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.timeout_minutes <= 0:
        parser.error("--timeout-minutes must be positive")
    return args


def print_plan(sides: list[Side], args: argparse.Namespace) -> None:
    for side in sides:
        where = (
            f"$BASELINE_TREE = a temporary git worktree of {side.rev} ({side.commit})"
            if side.rev
            else side.tree
        )
        print(
            f"side {side.label}: {where}"
            + (f"; overrides {' '.join(side.overrides)}" if side.overrides else "")
        )
    for seed, preset, side in schedule(args.seeds, args.presets, sides):
        tree = "$BASELINE_TREE" if side.rev else shlex.quote(str(side.tree))
        env = f"PYTHONPATH={tree}${{PYTHONPATH:+:$PYTHONPATH}} OMP_NUM_THREADS={args.threads} AGENTRL_NO_PROGRESS=1"
        print(f"cd {tree} && {env} {shlex.join(train_command(side, preset, seed, args))}")


def measure(sides: list[Side], args: argparse.Namespace) -> dict[str, Any]:
    for side in sides:
        check_import(side, args.threads)
        for preset in args.presets:
            check_config(side, preset, args)
    load_start = os.getloadavg()
    runs = []
    plan = schedule(args.seeds, args.presets, sides)
    for k, (seed, preset, side) in enumerate(plan, 1):
        print(f"[{k}/{len(plan)}] {preset} / {side.label} / seed {seed}", flush=True)
        runs.append(run_one(side, preset, seed, args))
        print(
            f"    {runs[-1]['status']}: {seconds(runs[-1]['median']['iteration_s'])} s/iteration", flush=True
        )
    reference = "current" if any(s.label == "current" for s in sides) else sides[0].label
    warmup = args.iterations >= 3
    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "threads": args.threads,
        "iterations": args.iterations,
        "seeds": args.seeds,
        "presets": args.presets,
        "warmup_excluded": warmup,
        "reference": reference,
        "cpu_model": cpu_model(),
        "cpu_environment": cpu_environment(),
        "load_average": {
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()],
        },
        "sides": [s.describe() for s in sides],
        "runs": runs,
        "summary": summarize(runs, [s.label for s in sides], args.presets, warmup, reference),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        check_overrides(args.overrides, "overrides after --")
        sides = build_sides(args.baseline, args.side)
        if args.dry_run:
            print_plan(sides, args)
            return 0
        with baseline_tree(next((s for s in sides if s.rev), None)):
            result = measure(sides, args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (the running training was ended, no results written)", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "iteration_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "iteration_speed.md").write_text(markdown(result))
    print("\n".join([table(result["summary"]), "", *notes(result)]))
    print(f"wrote {args.out / 'iteration_speed.json'} and iteration_speed.md")
    return 1 if any(r["status"] != "ok" for r in result["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
