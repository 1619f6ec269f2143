"""RLFT on the 5-arm button bandit with rationales: action coverage and regret of the base model, the
RLFT-trained model, UCB1 and a random agent, all on the same held-out episodes (the eval seeds of
`--seed`), CPU, the embedded SmolLM2-135M (docs/algorithms.md#rlft; Schmied et al., arXiv 2504.16078).

Runs, one after another, each through the runner itself (`python -m agentrl.cli`), `--threads` torch threads (default 1):

1. `eval agent=random` and `eval agent=planner` (UCB1 on a bandit) on the preset's bandit (its `env:`
   block, read from agentrl/conf/experiment/rlft_bandit.yaml, so all four agents play the same task);
2. `eval experiment=rlft_bandit` - the base model, greedy, with rationales (`base/`);
3. `train experiment=rlft_bandit_warmup` (`warmup/`): the format warm-up, TRL's SFTTrainer on presses of
   random buttons written in the strict answer format with a templated rationale;
4. `train experiment=rlft_bandit init_from=<out>/warmup algo.time_limit_minutes=<--minutes>` (`train/`;
   without `init_from` when `warmup/` holds no complete run); its final greedy eval on the same
   `--episodes` eval seeds is the trained model's row (`train/eval.json`);
5. `train experiment=rlft_bandit_warmup algo.demonstrations=planner` (`bc_ucb/`): behaviour cloning on
   UCB1's presses, the RLFT paper's baseline, at the warm-up's budget.

With `--state-facts` the demonstrations of 3 and 5 state the buttons not pressed yet and the best average
so far in their rationale, before the choice (`algo.state_facts=true`).
`--warmup-episodes N` and `--warmup-updates N` size 3 and 5 (their `algo.episodes` and
`algo.max_updates`; the preset's 24 episodes and 15 updates of 8 rows otherwise).

The targets compare the trained row with the base model's and with the warm-up's: coverage up by >= 0.1
(and by more than the stderr of the difference), regret down by more than that stderr, and neither counts
while more than 5% of the trained model's answers are invalid (each presses a random button, which raises
coverage whatever the model does).

Every eval.json carries `diagnostics` (agentrl/diagnostics.py: regret and coverage curves, greediness,
frequency bias, knowing-doing); the summary reuses them. It writes into `--out`:
`summary.json`, `summary.md` (mean ± stderr, n episodes, targets) and `rlft_bandit.png` (coverage over
the presses and cumulative regret, one line per agent with a ± stderr band).

    .venv/bin/python benchmarks/rlft_bandit.py                                  # 35 min of RLFT
    .venv/bin/python benchmarks/rlft_bandit.py --minutes 10 --episodes 50 algo.learning_rate=2e-5
    .venv/bin/python benchmarks/rlft_bandit.py --summarize outputs/bench/rlft_bandit   # rebuild summary
    .venv/bin/python benchmarks/rlft_bandit.py --steps train        # one step (two invocations on one
                                                                 # --out may run different steps)

Extra arguments are Hydra overrides: `env.*` ones go to every run (all agents play the same task),
`agent.*`/`model.*` to the two LLM runs, everything else to the training run only. A step whose run
directory already holds a complete eval.json is skipped (rerun into the same `--out` to resume after a
failure; delete a run directory to redo it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PRESET = "rlft_bandit"
#: run directory name -> label, in the order of the table and the legend
AGENTS = {
    "base": "base model (SmolLM2-135M)",
    "warmup": "format warm-up (random presses)",
    "trained": "RLFT-trained",
    "bc_ucb": "behaviour cloning on UCB1",
    "planner": "UCB1 (planner)",
    "random": "random",
}
STEPS = ("random", "planner", "base", "warmup", "train", "bc_ucb")
WARMUP = "rlft_bandit_warmup"
#: the coverage target: after training >= before + 0.1 (the RLFT paper: 0.40 -> 0.52 at 10 arms)
COVERAGE_GAIN = 0.1
#: a row's presses are the model's only when at most this share of its answers were invalid: an invalid
#: answer presses a random button (the preset's invalid_rule), which raises coverage by itself
MAX_INVALID = 0.05
#: not run by default: the trained model through `eval from_run=<out>/train` (for a training run stopped
#: before its own final eval; then trained/eval.json replaces train/eval.json)
EXTRA_STEPS = ("trained",)
COLORS = {"base": "C0", "warmup": "C1", "trained": "C3", "bc_ucb": "C4", "planner": "C2", "random": "0.5"}


def results_dir(value: str) -> Path | None:
    """`--results`: a directory, or 'none' for no copy, never a directory named none (also learn_snake.py's)."""
    return None if value.strip().lower() == "none" else Path(value)


class BenchmarkError(RuntimeError):
    """A step of the benchmark failed; the message says which and where its log is."""


# ---------------------------------------------------------------------------------------------
# running the steps
# ---------------------------------------------------------------------------------------------
def preset_env_overrides(preset: str = PRESET) -> list[str]:
    """`env=<name>` and `env.<key>=<value>` for the preset's env (its defaults list and `env:` block), so
    the classic agents, which cannot take the preset's agent keys, play exactly the preset's task."""
    from omegaconf import OmegaConf

    path = ROOT / "agentrl" / "conf" / "experiment" / f"{preset}.yaml"
    if not path.is_file():
        raise BenchmarkError(f"preset {path} not found")
    cfg = OmegaConf.load(path)
    out = []
    for entry in cfg.get("defaults", []):
        for key, value in dict(entry).items():
            if key == "override /env":
                out.append(f"env={value}")
    for key, value in (cfg.get("env") or {}).items():
        out.append(f"env.{key}={value}")
    if not out or not out[0].startswith("env="):
        raise BenchmarkError(f"{path}: no `override /env` in its defaults")
    return out


def split_overrides(extra: list[str]) -> dict[str, list[str]]:
    """Route pass-through overrides: env.* to every run, agent.*/model.* to the LLM runs, the rest to
    training only."""
    for item in extra:
        if "=" not in item or item.startswith("-"):
            raise BenchmarkError(
                f"unknown argument {item!r}: extra arguments must be Hydra overrides key=value"
            )
    env = [o for o in extra if o.lstrip("+~").startswith("env")]
    llm = [o for o in extra if o.lstrip("+~").startswith(("agent", "model"))]
    return {"all": env, "llm": env + llm, "train": list(extra)}


def complete(run: Path) -> bool:
    status = run / "status.json"
    if not (run / "eval.json").is_file() or not status.is_file():
        return False
    return json.loads(status.read_text()).get("status") == "complete"


def run_step(name: str, args: list[str], out: Path, threads: int, poll_s: float = 30.0) -> Path:
    """`python -m agentrl.cli <args> hydra.run.dir=<out>/<name>`, logged to <out>/<name>.log; prints a
    line of progress every `poll_s`; raises BenchmarkError on a non-zero exit. A complete run there is
    kept (the step is skipped); an unfinished training run (a killed benchmark) continues with
    `agentrl train --resume` from its newest checkpoint, under the settings it started with."""
    run = out / name
    if complete(run):
        print(f"[{name}] already complete in {run}; skipped", flush=True)
        return run
    cmd = [sys.executable, "-m", "agentrl.cli", *args, f"hydra.run.dir={run}"]
    if run.exists() and any(run.iterdir()):
        if args[:1] != ["train"]:
            raise BenchmarkError(f"[{name}] {run} holds an unfinished run: delete it to rerun this step")
        print(f"[{name}] {run} holds an unfinished training run: resuming it", flush=True)
        cmd = [sys.executable, "-m", "agentrl.cli", "train", "--resume", str(run)]
    # progress lines (every 10% of an eval's episodes, at least every 30 s) go to the log
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log_path = out / f"{name}.log"
    print(f"[{name}] agentrl {' '.join(cmd[3:])}", flush=True)
    start = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    code = proc.wait(timeout=poll_s)
                    break
                except subprocess.TimeoutExpired:
                    minutes = (time.perf_counter() - start) / 60
                    print(f"[{name}] {minutes:.1f} min: {progress_line(run, log_path)}", flush=True)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
    minutes = (time.perf_counter() - start) / 60
    if code != 0 or not (run / "eval.json").is_file():
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise BenchmarkError(f"[{name}] exited {code} after {minutes:.1f} min; log {log_path}:\n{tail}")
    print(f"[{name}] done in {minutes:.1f} min", flush=True)
    return run


def progress_line(run: Path, log_path: Path | None = None) -> str:
    """The last training iteration (metrics.jsonl), else the last line of the step's log."""
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        lines = [line for line in metrics.read_text().splitlines() if line.strip()]
        if lines:
            row = json.loads(lines[-1])
            keys = ("train/mean_return", "train/invalid_rate", "loss", "kl")
            parts = [f"{k}={row[k]:.3g}" for k in keys if isinstance(row.get(k), (int, float))]
            return f"iteration {row.get('iteration')} ({row.get('time_s', 0) / 60:.1f} min) " + " ".join(
                parts
            )
    for log in (log_path, run / "run.log"):
        if log is not None and log.is_file():
            lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
            if lines:
                return lines[-1][-150:]
    return "starting"


# ---------------------------------------------------------------------------------------------
# the summary
# ---------------------------------------------------------------------------------------------
def display_path(path: Path) -> str:
    """`path` relative to the repository when it is inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def mean_stderr(values: list[float]) -> tuple[float, float]:
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def load_eval(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BenchmarkError(f"{path} not found")
    data = json.loads(path.read_text())
    if "diagnostics" not in data:
        raise BenchmarkError(f"{path} has no `diagnostics` (not a bandit eval?)")
    return data


def eval_paths(out: Path) -> dict[str, Path]:
    return {
        "base": out / "base" / "eval.json",
        "trained": out / "trained" / "eval.json"
        if (out / "trained" / "eval.json").is_file()
        else out / "train" / "eval.json",
        "planner": out / "planner" / "eval.json",
        "random": out / "random" / "eval.json",
        "warmup": out / "warmup" / "eval.json",
        "bc_ucb": out / "bc_ucb" / "eval.json",
    }


def training_info(run: Path) -> dict[str, Any]:
    metrics = run / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.is_file() else []
    info: dict[str, Any] = {"iterations": rows[-1].get("iteration") if rows else 0}
    info["train_minutes"] = round(rows[-1]["time_s"] / 60, 2) if rows and "time_s" in rows[-1] else None
    curve = [
        {
            "iteration": r.get("iteration"),
            "minutes": round(r.get("time_s", 0) / 60, 2),
            "train_return": r.get("train/mean_return"),
            "train_invalid_rate": r.get("train/invalid_rate"),
        }
        for r in rows
    ]
    info["curve"] = curve
    status = run / "status.json"
    if status.is_file():
        st = json.loads(status.read_text())
        info["status"] = st.get("status")
        if st.get("reason"):
            info["reason"] = st["reason"]
    return info


def count_cells(counts: dict[str, int] | None, *pairs: tuple[str, str]) -> str:
    """Markdown cells "part/whole", one per (part, whole) key pair of `counts` ("-" where the whole is 0 or
    there are no counts)."""
    return " | ".join(
        f"{counts[part]}/{counts[whole]}" if counts and counts[whole] else "-" for part, whole in pairs
    )


def untried_cells(counts: dict[str, int] | None) -> str:
    """The two markdown cells of `untried_choices`."""
    return count_cells(counts, ("untried", "chances"), ("listed_exact", "listed"))


def provenance(run: Path) -> dict[str, str]:
    """How a row's run was made, from its saved Hydra files: the command (`agentrl <task> <overrides>`,
    without the run directory) and the answer parsing its LLM agent used (strict, or lenient where
    `agent.lenient=true`; `-` for a classic agent). Empty for a run without them."""
    import yaml

    overrides_file, config_file = run / ".hydra" / "overrides.yaml", run / ".hydra" / "config.yaml"
    if not overrides_file.is_file() or not config_file.is_file():
        return {}
    overrides = [str(o) for o in yaml.safe_load(overrides_file.read_text()) or []]
    task = next((o.split("=", 1)[1] for o in overrides if o.startswith("task=")), "?")
    rest = [o for o in overrides if not o.startswith(("task=", "hydra."))]
    agent = (yaml.safe_load(config_file.read_text()) or {}).get("agent") or {}
    llm = agent.get("name", "llm") == "llm"
    parsing = ("lenient" if agent.get("lenient") else "strict") if llm else "-"
    return {"command": " ".join(["agentrl", task, *rest]), "parsing": parsing}


def provenance_lines(runs: dict[str, dict[str, Any]], labels: dict[str, str]) -> list[str]:
    """The markdown lines that say how each row was made (rows without saved Hydra files are left out)."""
    made = [(labels.get(name, name), r["made_by"]) for name, r in runs.items() if r.get("made_by")]
    if not made:
        return []
    lines = ["", "How each row was made (answer parsing; the command, run directory left out):", ""]
    how = {"strict": "strict parsing", "lenient": "lenient parsing", "-": "a classic agent: no parsing"}
    return lines + [
        f"- {label} ({how.get(m['parsing'], m['parsing'])}): `{m['command']}`" for label, m in made
    ]


def untried_choices(run: Path) -> dict[str, int] | None:
    """From a run's transcripts.jsonl: the valid answers after each episode's first press that had a button
    not pressed before left (`chances`), how many pressed one (`untried`), and for answers whose rationale
    lists "Not pressed yet: ..." (algo.state_facts demonstrations teach it), how many such lists there were
    (`listed`) and how many named exactly the buttons not pressed before (`listed_exact`). Every press
    counts as pressed, an invalid answer's random one included. None without transcripts."""
    path = run / "transcripts.jsonl"
    if not path.is_file():
        return None
    out = {"chances": 0, "untried": 0, "listed": 0, "listed_exact": 0}
    pressed: dict[Any, set[str]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        buttons = re.search(r"Buttons: ([^.\n]*)\.", r.get("prompt", ""))
        before = pressed.setdefault(r["episode"], set())
        untried = {b.strip() for b in buttons.group(1).split(",")} - before if buttons else set()
        listed = re.search(r"Not pressed yet: ([^.<]*)\.", r.get("completion") or "")
        if listed:
            out["listed"] += 1
            out["listed_exact"] += {x.strip() for x in listed.group(1).split(",")} == untried
        if r["step"] > 0 and untried and r.get("valid"):
            out["chances"] += 1
            out["untried"] += r["action"] in untried
        before.add(r["action"])
    return out


def row_of(data: dict[str, Any]) -> dict[str, Any]:
    d = data["diagnostics"]
    kd = d.get("knowing_doing") or {}
    return {
        "episodes": data["episodes"],
        "coverage": d["final_coverage"],
        "regret": d["final_regret"],
        "return": {"mean": data["mean_return"], "stderr": data["return_stderr"]},
        "invalid_rate": data.get("invalid_rate"),
        "untagged_rate": data.get("untagged_rate"),
        "greediness": d["greediness"]["share"],
        "frequency_bias": d["frequency_bias"]["share"],
        "frequency_chance": d["frequency_bias"]["chance_share"],
        "knowing_rate": kd.get("knowing_rate"),
        "doing_given_knowing": kd.get("doing_given_knowing"),
        "seed": data.get("seed"),
    }


def change(
    before: dict[str, float], after: dict[str, float], sign: int, minimum: float = 0.0
) -> dict[str, Any]:
    """after - before, the stderr of the difference (independent evals) and whether the change goes the
    wanted way (`sign` +1: a rise, -1: a fall) by more than that stderr, than each run's own stderr and
    by at least `minimum` (the issue's coverage target: +0.1)."""
    diff = after["mean"] - before["mean"]
    se = math.sqrt(before["stderr"] ** 2 + after["stderr"] ** 2)
    wanted = sign * diff
    return {
        "before": before,
        "after": after,
        "change": diff,
        "stderr_of_change": se,
        "minimum": minimum,
        "met": bool(wanted > se and wanted > max(before["stderr"], after["stderr"]) and wanted >= minimum),
    }


def fmt(x: dict[str, float] | None, digits: int = 3) -> str:
    if not x or x.get("mean") is None or math.isnan(x["mean"]):
        return "-"
    return f"{x['mean']:.{digits}f} ± {x['stderr']:.{digits}f}"


def share(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def summarize(out: Path, results: Path | None = None) -> dict[str, Any]:
    paths = eval_paths(out)
    evals = {name: load_eval(p) for name, p in paths.items() if p.is_file()}
    missing = [name for name in paths if name not in evals]
    if not evals:
        raise BenchmarkError(
            f"no eval.json under {out} (expected {', '.join(str(p) for p in paths.values())})"
        )
    seeds = {name: e.get("seed") for name, e in evals.items()}
    episodes = {name: e.get("episodes") for name, e in evals.items()}
    if len(set(seeds.values())) > 1 or len(set(episodes.values())) > 1:
        raise BenchmarkError(
            f"the evals differ in seed or episode count (not the same held-out episodes): "
            f"seeds {seeds}, episodes {episodes}"
        )
    rows = {
        name: {
            **row_of(e),
            "untried_choices": untried_choices(paths[name].parent),
            "made_by": provenance(paths[name].parent),
        }
        for name, e in evals.items()
    }
    summary: dict[str, Any] = {"preset": PRESET, "out": display_path(out), "agents": rows, "missing": missing}
    if (out / "train").is_dir():
        summary["training"] = training_info(out / "train")
        trained = evals.get("trained", {})
        summary["training"]["train_time_s"] = trained.get("train_time_s")
    targets = {}
    for before in ("base", "warmup"):
        if before in rows and "trained" in rows:
            targets[f"coverage_rises ({before})"] = change(
                rows[before]["coverage"], rows["trained"]["coverage"], +1, minimum=COVERAGE_GAIN
            )
            targets[f"regret_falls ({before})"] = change(
                rows[before]["regret"], rows["trained"]["regret"], -1
            )
    invalid = rows["trained"]["invalid_rate"] if "trained" in rows else None
    for t in targets.values():
        if invalid is not None and invalid > MAX_INVALID:
            t["met"] = False
            t["why"] = (
                f"the trained row's invalid rate {invalid:.3f} > {MAX_INVALID}: its presses are mostly the "
                "random fallback's"
            )
    if targets:
        summary["targets"] = targets
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    md = markdown(summary, evals)
    (out / "summary.md").write_text(md)
    plot(evals, out / "rlft_bandit.png", n=next(iter(episodes.values())))
    if results is not None:
        results.mkdir(parents=True, exist_ok=True)
        (results / "rlft_bandit.md").write_text(md)
        (results / "rlft_bandit.json").write_text(json.dumps(compact(summary), indent=2))
        plot(evals, results / "rlft_bandit.png", n=next(iter(episodes.values())))
    print(md, flush=True)
    return summary


def compact(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without the per-iteration training curve (the small file for benchmarks/results)."""
    out = json.loads(json.dumps(summary))
    out.get("training", {}).pop("curve", None)
    return out


def markdown(summary: dict[str, Any], evals: dict[str, dict[str, Any]]) -> str:
    rows = summary["agents"]
    first = next(iter(evals.values()))
    lines = [
        "# RLFT on the 5-arm button bandit (SmolLM2-135M, CPU)",
        "",
        f"Same {first['episodes']} held-out episodes (eval seeds of seed={first.get('seed')}) for every agent; "
        "greedy LLM decoding with rationales (`experiment=rlft_bandit`). Coverage: share of the arms pulled "
        "at least once by the end of the episode; regret: cumulative expected regret at the last press "
        "(agentrl/diagnostics.py). Mean ± stderr over episodes. `untried chosen`: of the valid answers after "
        "an episode's first press with a button not pressed before left, those that pressed one; `untried "
        "listed exactly`: of the rationales that list `Not pressed yet: ...` (algo.state_facts demonstrations), "
        "those that name exactly the buttons not pressed before (both from transcripts.jsonl).",
        "",
        "| agent | n | coverage | regret | return | invalid rate | untagged rate | greediness |"
        " frequency bias (chance) | knowing rate | doing given knowing | untried chosen | untried listed exactly |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, label in AGENTS.items():
        if name not in rows:
            continue
        r = rows[name]
        freq = f"{share(r['frequency_bias'])} ({share(r['frequency_chance'])})"
        lines.append(
            f"| {label} | {r['episodes']} | {fmt(r['coverage'])} | {fmt(r['regret'], 2)} | {fmt(r['return'], 2)} |"
            f" {share(r['invalid_rate'])} | {share(r.get('untagged_rate'))} | {share(r['greediness'])} | {freq} |"
            f" {share(r['knowing_rate'])} |"
            f" {share(r['doing_given_knowing'])} | {untried_cells(r.get('untried_choices'))} |"
        )
    training = summary.get("training")
    if training:
        lines += [
            "",
            f"Training: {training.get('iterations')} iterations in {training.get('train_minutes')} min "
            f"(train_time_s {training.get('train_time_s')}; run status {training.get('status')}"
            + (f": {training['reason']}" if training.get("reason") else "")
            + ").",
        ]
    targets = summary.get("targets")
    if targets:
        lines += [
            "",
            "| target (before → RLFT) | before | after | change ± stderr of change | met |",
            "|---|---|---|---|---|",
        ]
        for key, t in targets.items():
            met = "yes" if t["met"] else "no" + (f" ({t['why']})" if t.get("why") else "")
            lines.append(
                f"| {key.replace('_', ' ')} | {fmt(t['before'])} | {fmt(t['after'])} |"
                f" {t['change']:+.3f} ± {t['stderr_of_change']:.3f} | {met} |"
            )
    lines += provenance_lines(rows, AGENTS)
    if summary.get("missing"):
        lines += ["", f"Missing runs: {', '.join(summary['missing'])}."]
    return "\n".join(lines) + "\n"


def plot(evals: dict[str, dict[str, Any]], path: Path, n: int | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, label in AGENTS.items():
        if name not in evals:
            continue
        c = evals[name]["diagnostics"]["curves"]
        steps = c["step"]
        for ax, key in zip(axes, ("coverage", "regret"), strict=True):
            mean, err = c[f"{key}_mean"], c[f"{key}_stderr"]
            ax.plot(steps, mean, color=COLORS[name], lw=2, label=label)
            ax.fill_between(
                steps,
                [m - e for m, e in zip(mean, err, strict=True)],
                [m + e for m, e in zip(mean, err, strict=True)],
                color=COLORS[name],
                alpha=0.18,
                lw=0,
            )
    axes[0].set_ylabel("action coverage (share of the 5 arms tried)")
    axes[0].set_ylim(0, 1.03)
    axes[1].set_ylabel("cumulative expected regret")
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("press (step of the episode)")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=9)
    fig.suptitle(f"5-arm button bandit, {n} held-out episodes: mean ± stderr band")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
def runner_parser(
    doc: str | None, name: str, steps: tuple[str, ...], extra_steps: tuple[str, ...], rows: str
) -> argparse.ArgumentParser:
    """The options the RLFT benchmark runners share (`name`: the output's file and directory name; `rows`:
    what --episodes counts)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--minutes", type=float, default=35.0, help="training budget (algo.time_limit_minutes)"
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=10_000,
        help="iteration cap (default: effectively none, the budget stops training)",
    )
    parser.add_argument("--seed", type=int, default=0, help="global seed: training and the eval seeds")
    parser.add_argument("--episodes", type=int, default=50, help=f"held-out {rows}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench" / name)
    parser.add_argument(
        "--results",
        type=results_dir,
        default=None,
        help=f"also write {name}.{{md,json,png}} here (e.g. benchmarks/results; 'none': no copy, the default)",
    )
    parser.add_argument(
        "--summarize",
        type=Path,
        default=None,
        metavar="DIR",
        help="only rebuild the summary and plot from an existing output dir",
    )
    parser.add_argument(
        "--state-facts",
        action="store_true",
        help="the demonstrations' rationales state the env's facts before the choice (algo.state_facts=true: "
        "the bandit's untried buttons and best average, tic-tac-toe's winning and blocking cells)",
    )
    parser.add_argument(
        "--warmup-episodes",
        type=int,
        default=None,
        metavar="N",
        help="demonstration episodes of the warm-up/behaviour-cloning steps (algo.episodes; default: the preset's)",
    )
    parser.add_argument(
        "--warmup-updates",
        type=int,
        default=None,
        metavar="N",
        help="optimizer steps at most of the warm-up/behaviour-cloning steps (algo.max_updates; default: the "
        "preset's)",
    )
    parser.add_argument(
        "--steps",
        nargs="+",
        default=list(steps),
        choices=steps + extra_steps,
        help="run only these steps (two invocations on one --out may run different steps)",
    )
    return parser


def warmup_overrides(args: argparse.Namespace) -> list[str]:
    """The overrides that the runner's options give the warm-up (SFT) steps."""
    return [
        *(["algo.state_facts=true"] if args.state_facts else []),
        *([f"algo.episodes={args.warmup_episodes}"] if args.warmup_episodes is not None else []),
        *([f"algo.max_updates={args.warmup_updates}"] if args.warmup_updates is not None else []),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = runner_parser(__doc__, "rlft_bandit", STEPS, EXTRA_STEPS, "eval episodes per agent")
    args, extra = parser.parse_known_args(argv)
    try:
        if args.summarize:
            summarize(args.summarize, args.results)
            return 0
        if args.episodes < 1 or args.minutes <= 0:
            raise BenchmarkError("--episodes must be >= 1 and --minutes > 0")
        routed = split_overrides(extra)
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
        common = [f"seed={args.seed}", f"eval.episodes={args.episodes}"]
        env = preset_env_overrides()
        start = time.perf_counter()
        for agent in [a for a in ("random", "planner") if a in args.steps]:
            run_step(agent, ["eval", *env, f"agent={agent}", *common, *routed["all"]], out, args.threads)
        if "base" in args.steps:
            run_step("base", ["eval", f"experiment={PRESET}", *common, *routed["llm"]], out, args.threads)
        for name, demos in (("warmup", "random"), ("bc_ucb", "planner")):
            if name in args.steps:
                run_step(
                    name,
                    [
                        "train",
                        f"experiment={WARMUP}",
                        f"algo.demonstrations={demos}",
                        *warmup_overrides(args),
                        *common,
                        f"algo.torch_threads={args.threads}",
                        "algo.eval_before=false",  # the base model's row is base/
                        *routed["llm"],
                    ],
                    out,
                    args.threads,
                )
        if "train" in args.steps:
            init = [f"init_from={out / 'warmup'}"] if complete(out / "warmup") else []
            run_step(
                "train",
                [
                    "train",
                    f"experiment={PRESET}",
                    *common,
                    f"algo.time_limit_minutes={args.minutes}",
                    f"algo.iterations={args.iterations}",
                    f"algo.torch_threads={args.threads}",
                    "algo.eval_before=false",  # the base model's row is base/, the warm-up's warmup/
                    *init,
                    *routed["train"],
                ],
                out,
                args.threads,
            )
        if "trained" in args.steps:
            run_step(
                "trained", ["eval", f"from_run={out / 'train'}", *common, *routed["all"]], out, args.threads
            )
        print(f"all steps done in {(time.perf_counter() - start) / 60:.1f} min", flush=True)
        summarize(out, args.results)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
