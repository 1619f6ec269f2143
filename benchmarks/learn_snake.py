"""MS-GRPO learning on Snake with the embedded SmolLM2-135M (CPU), against random, planner and DQN.

Plays the same held-out Snake episodes (the env's full game: 10x10, random opponent, 100 moves; the
eval seeds of `seed`) with

- `random` and `planner` (agentrl/agents/baselines.py),
- DQN (`agentrl train env=snake algo=dqn`'s trainer, `--dqn-steps` env steps, one torch thread),
- the embedded LLM before training (greedy, the preset's interface),
- the same LLM after MS-GRPO training with `experiment=<--preset>` for `--minutes` of wall-clock
  (`snake_learn`: the paper's board; `snake_summary`: the same game, each observation a short summary
  in words of the apple's direction and what each move runs into),

then writes into the output directory `results.json` (every agent's metrics, per-episode returns, timings,
peak memory), `learn_snake.md` and `learn_snake.png` (final returns with stderr bars; the training
curve), and copies the last two to `benchmarks/results/learn_snake{,_summary}.{md,png}` (`--results`).

    .venv/bin/python benchmarks/learn_snake.py                       # 60-minute training budget
    .venv/bin/python benchmarks/learn_snake.py --minutes 40 --out outputs/bench/learn_snake
    .venv/bin/python benchmarks/learn_snake.py --preset snake_summary --warmup --minutes 40 --threads 2
    .venv/bin/python benchmarks/learn_snake.py ... --reuse outputs/bench/learn_snake   # baselines, DQN, base LLM
    .venv/bin/python benchmarks/learn_snake.py --minutes 5 --episodes 10 --dqn-steps 5000 algo.learning_rate=1e-5
    .venv/bin/python benchmarks/learn_snake.py --summarize outputs/bench/learn_snake   # rebuild md + png

The return is the agent's episode return as `agentrl eval` reports it (an LLM's invalid answers cost
`agent.invalid_penalty` each); `env return` leaves those penalties out. Target: the trained LLM's mean
return beats random's and always-up's each by more than 2 standard errors of the difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import math
import os
import resource
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rlft_bandit import BenchmarkError, results_dir, run_step  # noqa: E402 - the shared runner (`agentrl` in a subprocess)

RESULTS = Path(__file__).resolve().parent / "results"
#: preset -> the name of its md/png copies in RESULTS
RESULT_NAMES = {"snake_learn": "learn_snake", "snake_summary": "learn_snake_summary"}
#: rows `--reuse` may take from an earlier run of this script (they do not depend on the training)
REUSABLE = ("random", "always_up", "planner", "dqn", "llm_before")
ORDER = ("random", "always_up", "llm_before", "llm_after", "dqn", "planner")
LABELS = {
    "random": "random",
    "always_up": "always up (default action)",
    "llm_before": "LLM before training",
    "llm_after": "LLM after MS-GRPO",
    "dqn": "DQN",
    "planner": "planner (BFS)",
}


def save_run_config(run_dir: Path, cfg: Any, overrides: list[str]) -> None:
    """`.hydra/config.yaml` and `overrides.yaml` as the runner writes them, so the trained model's
    directory is a training run for `agentrl eval from_run=<out>/llm` (the transfer and Poison Apple
    presets evaluate it with its own agent settings)."""
    from omegaconf import OmegaConf

    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), run_dir / ".hydra" / "overrides.yaml")


def peak_rss_gb() -> float:
    """This process's peak resident set so far (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def summarize_episodes(metrics: dict[str, Any], episodes: list[Any]) -> dict[str, Any]:
    """eval metrics plus what the comparison needs: apples, env return, the per-episode returns."""
    returns = [float(e.episode_return) for e in episodes]
    env_returns = [float(sum(s.env_reward for s in e.steps)) for e in episodes]
    apples = [float(e.final_info.get("state", {}).get("score", 0)) for e in episodes]
    n = len(returns)
    return {
        "episodes": n,
        "mean_return": float(np.mean(returns)),
        "return_stderr": float(np.std(returns, ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
        "mean_env_return": float(np.mean(env_returns)),
        "apples": float(np.mean(apples)),
        "success_rate": float(metrics.get("success_rate", 0.0)),
        "mean_length": float(metrics.get("mean_length", 0.0)),
        "invalid_rate": float(metrics.get("invalid_rate", 0.0)),
        "untagged_rate": float(metrics.get("untagged_rate", 0.0)),
        "seeds": [int(e.seed) for e in episodes],
        "returns": returns,
    }


def override_value(value: Any) -> str:
    """A Hydra override's value text (strings quoted, booleans lower case)."""
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value) if isinstance(value, str) else str(value)


def save(out: Path, results: dict[str, Any]) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(out / "results.json")


def llm_eval_agent(cfg: Any, model: Any, tokenizer: Any) -> Any:
    """The evaluation agent exactly as train_llm builds it (eval temperature, the preset's interface)."""
    from agentrl.agents.llm import build_llm_agent

    policy = build_llm_agent(cfg, model=model, tokenizer=tokenizer, share_prompts=cfg.algo.shared_prefix)
    max_new = cfg.algo.max_new_tokens or policy.sampling.max_new_tokens
    return policy.configured(
        sampling=dataclasses.replace(
            policy.sampling, temperature=cfg.algo.eval_temperature, max_new_tokens=max_new
        )
    )


def default_action_agent() -> Any:
    """An agent that plays the env's default action every step (Snake: "up")."""
    from agentrl.agents.base import PolicyAgent

    class DefaultActionAgent(PolicyAgent):
        name = "always_up"

        def choose(self, ctx: Any) -> int:
            return ctx.env.default_action()

    return DefaultActionAgent()


def run(args: argparse.Namespace) -> Path:
    os.environ.setdefault("AGENTRL_NO_PROGRESS", "1")
    import torch

    torch.set_num_threads(args.threads)
    from agentrl.agents.baselines import PlannerAgent, RandomAgent
    from agentrl.agents.dqn import load_dqn_agent
    from agentrl.config import compose_config
    from agentrl.envs import env_factory
    from agentrl.evaluation import eval_seeds, evaluate
    from agentrl.models import load_model, model_config
    from agentrl.runs.trained import with_init_weights
    from agentrl.trainers.dqn import train_dqn
    from agentrl.trainers.multistep import train_llm

    overrides = [
        "task=train",
        "algo=msgrpo",
        f"experiment={args.preset}",
        f"seed={args.seed}",
        f"eval.episodes={args.episodes}",
        f"algo.time_limit_minutes={args.minutes}",
        f"algo.torch_threads={args.threads}",
        "algo.eval_before=false",  # the before-training eval runs here (with its episodes)
        "algo.checkpoint_every=0",
        *args.overrides,
    ]
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out = args.out or Path("outputs") / "bench" / f"{stamp}_learn_snake_seed{args.seed}"
    out.mkdir(parents=True, exist_ok=True)
    print(f"output directory: {out}", flush=True)
    warmup_minutes = None
    if args.warmup:
        # skipped when an earlier call with this --out completed it
        warmup = run_step(
            "warmup", ["train", f"experiment={args.preset}_warmup", f"seed={args.seed}"], out, args.threads
        )
        warmup_minutes = json.loads((warmup / "eval.json").read_text())["train_time_s"] / 60
        overrides.append(f"init_from={warmup}")
    cfg = compose_config(overrides)
    seeds = eval_seeds(cfg)
    make_env = env_factory(cfg.env)
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "overrides": overrides,
        "env": dict(cfg.env),
        "preset": args.preset,
        "train_max_steps": cfg.algo.max_steps,
        "seed": args.seed,
        "eval_seeds": [seeds[0], seeds[-1]],
        "threads": args.threads,
        "started": datetime.now().isoformat(timespec="seconds"),
        "agents": {},
        "timing": {},
        "peak_rss_gb": {},
    }
    if warmup_minutes is not None:
        results["timing"]["warmup_minutes"] = round(warmup_minutes, 2)
    earlier = json.loads((args.reuse / "results.json").read_text()) if args.reuse else {"agents": {}}
    reused = {k: v for k, v in earlier["agents"].items() if k in REUSABLE}
    if earlier.get("preset", "snake_learn") != args.preset:
        reused.pop("llm_before", None)  # another interface: the base model plays again
    for name, row in reused.items():
        assert row["seeds"] == list(seeds), f"{name} in {args.reuse}: not the same eval seeds"
        results["agents"][name] = {**row, "reused_from": str(args.reuse)}
        print(f"{name:12s} reused from {args.reuse}", flush=True)

    def done(name: str, metrics: dict[str, Any], episodes: list[Any], **extra: Any) -> None:
        row = summarize_episodes(metrics, episodes)
        assert row["seeds"] == list(seeds), f"{name}: not the same eval seeds"
        results["agents"][name] = {**row, **extra}
        results["peak_rss_gb"][name] = round(peak_rss_gb(), 3)
        save(out, results)
        print(
            f"{name:12s} return {row['mean_return']:+.3f} ± {row['return_stderr']:.3f} (n={row['episodes']})"
            f"  apples {row['apples']:.2f}  invalid {row['invalid_rate']:.3f}  untagged {row['untagged_rate']:.3f}",
            flush=True,
        )

    # -- classic baselines; "always up" is what an LLM that answers only invalidly plays (the env's
    # default action), so an LLM that merely learned valid answers and one favourite move ends near it --
    for name, agent in (
        ("random", RandomAgent()),
        ("always_up", default_action_agent()),
        ("planner", PlannerAgent(cfg.env.name)),
    ):
        if name in reused:
            continue
        metrics, episodes = evaluate(make_env, agent, seeds, description=name, agent_seed=args.seed)
        done(name, metrics, episodes)

    # -- DQN on the same env and seeds --
    if args.dqn_steps > 0 and "dqn" not in reused:
        env_overrides = [f"env.{k}={override_value(v)}" for k, v in cfg.env.items()]
        dqn_cfg = compose_config(
            [
                "task=train",
                "algo=dqn",
                f"env={cfg.env.name}",
                "agent=random",
                f"seed={args.seed}",
                f"eval.episodes={args.episodes}",
                f"algo.total_timesteps={args.dqn_steps}",
                "algo.torch_threads=1",
                *[o for o in env_overrides if not o.startswith("env.name=")],
            ]
        )
        assert eval_seeds(dqn_cfg) == seeds
        start = time.perf_counter()
        trained = train_dqn(dqn_cfg, out / "dqn", env_factory)
        torch.set_num_threads(args.threads)
        metrics, episodes = evaluate(make_env, load_dqn_agent(out / "dqn"), seeds, description="dqn")
        done(
            "dqn",
            metrics,
            episodes,
            train_steps=args.dqn_steps,
            train_minutes=round(trained.extra.get("train_time_s", time.perf_counter() - start) / 60, 2),
        )

    # -- the LLM before training (the base model, the preset's interface, greedy) --
    if "llm_before" not in reused:
        model, tokenizer = load_model(model_config(cfg.model))
        agent = llm_eval_agent(cfg, model, tokenizer)
        metrics, episodes = evaluate(
            make_env, agent, seeds, lockstep=cfg.eval.lockstep, description="llm before", agent_seed=args.seed
        )
        done("llm_before", metrics, episodes)
        del model, agent
        gc.collect()

    # -- MS-GRPO training, then the same eval (train_llm runs it) --
    save_run_config(out / "llm", cfg, overrides)
    start = time.perf_counter()
    trained = train_llm(with_init_weights(cfg), out / "llm", env_factory)
    wall = time.perf_counter() - start
    rows = read_metrics(out / "llm")
    results["timing"] = {
        **results["timing"],
        "iterations": len(rows),
        "train_time_s": trained.extra.get("train_time_s"),
        "train_plus_eval_s": round(wall, 1),
        "mean_rollout_s": float(np.mean([r.get("rollout_s", 0) for r in rows])) if rows else None,
        "mean_update_s": float(np.mean([r.get("update_s", 0) for r in rows])) if rows else None,
        "mean_iteration_s": float(np.mean([r.get("iteration_s", 0) for r in rows])) if rows else None,
        "mean_samples": float(np.mean([r.get("samples", 0) for r in rows])) if rows else None,
    }
    done(
        "llm_after",
        trained.metrics,
        trained.episodes,
        train_minutes=round(trained.extra["train_time_s"] / 60, 2),
    )
    results["finished"] = datetime.now().isoformat(timespec="seconds")
    save(out, results)
    return out


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gap(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """a - b and its stderr (independent samples)."""
    return a["mean_return"] - b["mean_return"], math.hypot(a["return_stderr"], b["return_stderr"])


def verdict(agents: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether the trained LLM beats random and the "always up" control each by more than 2 standard
    errors of the difference of mean returns (the target; beating random alone can be the control's win:
    dying at the top wall in ~5 moves beats random's longer walks by their step costs)."""
    if "llm_after" not in agents or "random" not in agents:
        return None, "no trained-LLM result yet"
    after = agents["llm_after"]
    texts, ok = [], True
    for name in ("random", "always_up"):
        if name not in agents:
            continue
        diff, err = gap(after, agents[name])
        beats = diff > 2 * err
        ok = ok and beats
        texts.append(
            f"trained LLM - {LABELS[name]} {diff:+.3f} ± {err:.3f} "
            f"({'>' if beats else '<='} 2 SE = {2 * err:.3f})"
        )
    return ok, f"{'MET' if ok else 'NOT MET'}: " + "; ".join(texts)


def markdown(results: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    agents = results["agents"]
    n = next(iter(agents.values()))["episodes"] if agents else 0
    env = results.get("env", {})
    lines = [
        "# MS-GRPO on Snake: the embedded SmolLM2-135M against random, planner and DQN",
        "",
        f"Command: `.venv/bin/python benchmarks/{results.get('command', 'learn_snake.py')}` "
        f"(started {results.get('started')}, finished {results.get('finished', '-')}).",
        f"Held-out episodes: {n} per agent, the same seeds for all ({results['eval_seeds'][0]}..{results['eval_seeds'][1]}); "
        f"Snake {env.get('size')}x{env.get('size')}, opponent={env.get('opponent')}, "
        f"max_steps={env.get('max_steps')}, step penalty {env.get('step_penalty')}. "
        f"LLM: greedy, the `experiment={results.get('preset', 'snake_learn')}` interface; return includes "
        "invalid-answer penalties, "
        "env return does not.",
        "",
        "| agent | mean return ± stderr (n) | env return | apples / episode | success | length | invalid | untagged |"
        " training |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ORDER:
        if name not in agents:
            continue
        a = agents[name]
        train = ""
        if name == "dqn":
            train = f"{a.get('train_steps', 0):,} steps, {a.get('train_minutes', 0):.1f} min"
        elif name == "llm_after":
            train = f"{results['timing'].get('iterations')} iterations, {a.get('train_minutes', 0):.1f} min"
        # a run from before the column has none: shown as "-", not as 0
        untagged = f"{a['untagged_rate']:.3f}" if "untagged_rate" in a else "-"
        lines.append(
            f"| {LABELS[name]} | {a['mean_return']:+.3f} ± {a['return_stderr']:.3f} ({a['episodes']}) | "
            f"{a['mean_env_return']:+.3f} | {a['apples']:.2f} | {a['success_rate']:.2f} | {a['mean_length']:.1f} | "
            f"{a['invalid_rate']:.3f} | {untagged} | {train} |"
        )
    lines.append("")
    ok, text = verdict(agents)
    lines.append(
        f"**Target (trained LLM beats random and always-up by more than 2 standard errors): {text}.**"
    )
    if "always_up" in agents and "llm_after" in agents:
        diff, err = gap(agents["llm_after"], agents["always_up"])
        up_diff, _ = gap(agents["always_up"], agents["random"]) if "random" in agents else (float("nan"), 0)
        same = agents["llm_after"]["returns"] == agents["always_up"]["returns"]
        lines.append(
            f'Control: playing "up" every move (the env\'s default action) scores '
            f"{agents['always_up']['mean_return']:+.3f} ± {agents['always_up']['return_stderr']:.3f}, "
            f"{up_diff:+.3f} over random by itself; trained LLM - always up: {diff:+.3f} ± {err:.3f}"
            + (
                " (the same return in every episode: the trained greedy policy plays up throughout)."
                if same
                else "."
            )
        )
    if "dqn" in agents and "llm_after" in agents:
        diff, err = gap(agents["dqn"], agents["llm_after"])
        lines.append(
            f"DQN - trained LLM (the paper's comparison: DQN beats the LLM agents on Snake): {diff:+.3f} ± {err:.3f}."
        )
    if "llm_after" in agents and "llm_before" in agents:
        diff, err = gap(agents["llm_after"], agents["llm_before"])
        lines.append(f"Trained - untrained LLM: {diff:+.3f} ± {err:.3f}.")
    timing = results.get("timing") or {}
    updated = [r for r in rows if r.get("samples", 0) > 0]
    if rows:
        lines += [
            "",
            f"{len(updated)} of {len(rows)} iterations took an optimizer step (the others had no group with "
            "return variance)"
            + (
                f"; those averaged {np.mean([r.get('rollout_s', 0) for r in updated]):.1f} s rollout + "
                f"{np.mean([r.get('update_s', 0) for r in updated]):.1f} s update on "
                f"{np.mean([r['samples'] for r in updated]):.0f} rows (update_s includes the periodic evals)."
                if updated
                else "."
            ),
        ]
    if timing.get("warmup_minutes") is not None:
        lines += [
            "",
            f"Format warm-up first (`experiment={results.get('preset')}_warmup`, SFT on random valid moves): "
            f"{timing['warmup_minutes']:.1f} min; MS-GRPO started from it.",
        ]
    if timing:
        lines += [
            "",
            f"Training: {timing.get('iterations')} iterations in {(timing.get('train_time_s') or 0) / 60:.1f} min; per "
            f"iteration {timing.get('mean_rollout_s', 0):.1f} s rollout + {timing.get('mean_update_s', 0):.1f} s update "
            f"({timing.get('mean_samples', 0):.0f} rows on average); {results.get('threads')} torch thread(s). "
            f"Peak RSS of the whole benchmark process: {max(results.get('peak_rss_gb', {}).values() or [0]):.2f} GiB.",
        ]
    if rows:
        evals = [
            (r["iteration"], r["eval/mean_return"]) for r in rows if r.get("eval/mean_return") is not None
        ]
        first = rows[: min(3, len(rows))]
        last = rows[-min(3, len(rows)) :]

        def avg(rs: list[dict[str, Any]], key: str) -> float:
            return float(np.mean([r.get(key, 0.0) for r in rs]))

        lines += [
            f"Training rollouts ({results.get('train_max_steps', 8)}-move episodes, sampled): invalid rate {avg(first, 'train/invalid_rate'):.3f} -> "
            f"{avg(last, 'train/invalid_rate'):.3f}, return {avg(first, 'train/mean_return'):+.2f} -> "
            f"{avg(last, 'train/mean_return'):+.2f} (mean of the first and last 3 iterations).",
        ]
        if evals:
            lines.append(
                "Periodic greedy evals (return, first held-out episodes): "
                + ", ".join(f"it {i}: {v:+.2f}" for i, v in evals)
                + "."
            )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = results["agents"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [1, 1.2]})
    names = [n for n in ORDER if n in agents]
    means = [agents[n]["mean_return"] for n in names]
    errs = [agents[n]["return_stderr"] for n in names]
    colors = {
        "random": "0.6",
        "always_up": "0.8",
        "llm_before": "C1",
        "llm_after": "C0",
        "dqn": "C2",
        "planner": "C3",
    }
    y = np.arange(len(names))
    left.barh(y, means, xerr=errs, color=[colors[n] for n in names], capsize=4)
    left.set_yticks(y, [LABELS[n] for n in names])
    left.invert_yaxis()
    left.axvline(0, color="k", lw=0.6)
    for k, n in enumerate(names):
        a = agents[n]
        text = f"{a['mean_return']:+.2f} ± {a['return_stderr']:.2f}, {a['apples']:.2f} apples"
        x = max(a["mean_return"], 0) + a["return_stderr"] + 0.3
        left.text(x, k, text, va="center", fontsize=8)
    lo = min(min(means) - max(errs) - 0.5, -1.5)
    hi = max(max(means) + max(errs) + 0.45 * (max(means) - lo), 2.0)
    left.set_xlim(lo, hi)
    n = agents[names[0]]["episodes"] if names else 0
    left.set_xlabel(f"mean episode return ± stderr ({n} held-out episodes, same seeds)")
    left.set_title("Snake 10x10, 100 moves: held-out return")

    if rows:
        minutes = [r["time_s"] / 60 for r in rows]
        right.plot(
            minutes,
            [r.get("train/mean_return", np.nan) for r in rows],
            color="0.55",
            lw=1,
            label=f"training return (sampled, {results.get('train_max_steps', 8)}-move episodes)",
        )
        right.plot(
            minutes,
            [r.get("train/invalid_rate", np.nan) for r in rows],
            color="C4",
            lw=1,
            ls=":",
            label="training invalid-answer rate",
        )
        evals = [
            (r["time_s"] / 60, r["eval/mean_return"]) for r in rows if r.get("eval/mean_return") is not None
        ]
        if "llm_before" in agents:
            evals = [(0.0, agents["llm_before"]["mean_return"]), *evals]
        if evals:
            right.plot(
                *zip(*evals, strict=True),
                "o-",
                color="C0",
                lw=2,
                label="periodic greedy eval return (first held-out episodes)",
            )
        if "llm_after" in agents:
            right.plot(
                [minutes[-1]],
                [agents["llm_after"]["mean_return"]],
                "*",
                color="C0",
                ms=14,
                label=f"final eval ({agents['llm_after']['episodes']} episodes)",
            )
        if "random" in agents:
            right.axhline(agents["random"]["mean_return"], color="0.6", ls="--", lw=1, label="random (eval)")
        right.set_xlabel("training wall-clock (minutes)")
        right.set_ylabel("return / invalid rate")
        right.set_title(f"MS-GRPO, SmolLM2-135M (experiment={results.get('preset', 'snake_learn')})")
        right.legend(fontsize=7, loc="best")
    else:
        right.text(0.5, 0.5, "no training metrics", ha="center", transform=right.transAxes)
        right.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_summary(out: Path, results_dir: Path | None) -> str:
    """Rebuild learn_snake.md/png in `out`; copy them into `results_dir` (named by RESULT_NAMES)."""
    results = json.loads((out / "results.json").read_text())
    rows = read_metrics(out / "llm")
    text = markdown(results, rows)
    (out / "learn_snake.md").write_text(text)
    plot(results, rows, out / "learn_snake.png")
    if results_dir is not None:
        results_prefix = results_dir / RESULT_NAMES[results.get("preset", "snake_learn")]
        results_prefix.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "learn_snake.md", results_prefix.with_suffix(".md"))
        shutil.copyfile(out / "learn_snake.png", results_prefix.with_suffix(".png"))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=60.0, help="MS-GRPO training wall-clock budget")
    parser.add_argument("--episodes", type=int, default=50, help="held-out eval episodes per agent (>= 50)")
    parser.add_argument("--dqn-steps", type=int, default=100_000, help="DQN env steps (0: no DQN)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the LLM")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default outputs/bench/...)")
    parser.add_argument(
        "--summarize",
        type=Path,
        default=None,
        metavar="DIR",
        help="only rebuild learn_snake.md/png from DIR/results.json and DIR/llm/metrics.jsonl",
    )
    parser.add_argument(
        "--results",
        type=results_dir,
        default=RESULTS,
        help="directory the md/png copies go to, as learn_<preset>.{md,png} ('none' for no copy)",
    )
    parser.add_argument(
        "--preset",
        default="snake_learn",
        choices=tuple(RESULT_NAMES),
        help="the experiment preset trained (snake_summary: observations in words, not the board)",
    )
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="first run experiment=<preset>_warmup (SFT on random valid moves) into OUT/warmup; train from it",
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        default=None,
        metavar="DIR",
        help="take the baseline, DQN and base-LLM rows from DIR/results.json (same seeds) instead of rerunning",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the LLM run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        out = args.summarize if args.summarize is not None else run(args)
    except BenchmarkError as exc:  # a failed warm-up: which step, and the end of its log
        sys.exit(str(exc))
    text = write_summary(out, args.results)
    print(text)
    ok, _ = verdict(json.loads((out / "results.json").read_text())["agents"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
