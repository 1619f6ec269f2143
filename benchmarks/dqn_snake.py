"""DQN on Snake 10x10 against the random and planner baselines, side by side in one run.

Trains SB3 DQN (conf/algo/dqn.yaml) on the default Snake env (10x10, one apple, random opponent snake,
100 moves) on this machine's CPU with one torch thread, then evaluates DQN, `random` and `planner` on
the same held-out seeds through agentrl.evaluation and prints one table: mean return ± stderr, apples
per episode, success, episode length, training steps and minutes.

    .venv/bin/python benchmarks/dqn_snake.py                       # features observation, 100k steps
    .venv/bin/python benchmarks/dqn_snake.py --observation both    # also train on the raw planes
    .venv/bin/python benchmarks/dqn_snake.py --steps 20000 algo.learning_rate=0.001 env.opponent=false
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from agentrl.agents.baselines import PlannerAgent, RandomAgent
from agentrl.config import compose_config
from agentrl.evaluation import env_factory, eval_seeds, evaluate
from agentrl.trainers.dqn import load_dqn_agent, snake_apples, train_dqn


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=None, help="total env steps (default: algo/dqn.yaml)")
    parser.add_argument("--episodes", type=int, default=100, help="held-out eval episodes per agent")
    parser.add_argument("--observation", choices=["features", "planes", "both"], default="features")
    parser.add_argument("--env", default="snake", help="snake or snake_poison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="keep the DQN run directories here")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. algo.gamma=0.95")
    args = parser.parse_args()

    torch.set_num_threads(1)  # a fair single-core figure; the MLP is too small to gain from more
    os.environ.setdefault("AGENTRL_NO_PROGRESS", "1")
    logging.basicConfig(level=logging.WARNING)
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 130)
    base = [
        "task=train",
        "algo=dqn",
        f"env={args.env}",
        "agent=random",  # unused by DQN; keeps composition independent of the LLM agent config
        f"seed={args.seed}",
        f"eval.episodes={args.episodes}",
        *([f"algo.total_timesteps={args.steps}"] if args.steps else []),
        *args.overrides,
    ]
    cfg = compose_config(base)
    seeds = eval_seeds(cfg)
    make_env = env_factory(cfg.env)
    rows: list[tuple[str, dict, int | None, float | None]] = []

    modes = ["features", "planes"] if args.observation == "both" else [args.observation]
    out_root = args.out or Path(tempfile.mkdtemp(prefix="dqn_snake_"))
    for mode in modes:
        run_cfg = compose_config([*base, f"algo.observation={mode}"])
        run_dir = out_root / f"dqn_{mode}"
        console.print(f"training DQN ({mode}) for {run_cfg.algo.total_timesteps} steps into {run_dir} ...")
        train_dqn(run_cfg, run_dir)
        minutes = json.loads((run_dir / "eval.json").read_text())["train_time_s"] / 60  # training only
        agent = load_dqn_agent(run_dir / "final" / "model.zip", args.env)
        rows.append(
            (f"dqn ({mode})", _eval(make_env, agent, seeds), int(run_cfg.algo.total_timesteps), minutes)
        )
    rows.append(("random", _eval(make_env, RandomAgent(), seeds), None, None))
    rows.append(("planner", _eval(make_env, PlannerAgent(args.env), seeds), None, None))

    table = Table(
        title=f"{args.env} {cfg.env.size}x{cfg.env.size}, opponent={cfg.env.opponent}, "
        f"max_steps={cfg.env.max_steps}: {len(seeds)} held-out episodes per agent"
    )
    for col in (
        "agent",
        "mean return ± stderr",
        "apples / episode",
        "success",
        "length",
        "train steps",
        "train min",
    ):
        table.add_column(col, justify="left" if col == "agent" else "right")
    for name, m, steps, minutes in rows:
        table.add_row(
            name,
            f"{m['mean_return']:.2f} ± {m['return_stderr']:.2f}",
            f"{m['apples']:.2f}",
            f"{m['success_rate']:.2f}",
            f"{m['mean_length']:.1f}",
            "" if steps is None else f"{steps:,}",
            "" if minutes is None else f"{minutes:.1f}",
        )
    console.print(table)
    console.print(
        f"torch threads: {torch.get_num_threads()}, CPU count: {os.cpu_count()}, python {sys.version.split()[0]}"
    )
    if args.out is None:
        console.print(f"run directories kept in {out_root}")


def _eval(make_env, agent, seeds) -> dict:
    metrics, episodes = evaluate(make_env, agent, seeds, description=getattr(agent, "name", "agent"))
    metrics["apples"] = snake_apples(episodes)
    metrics["apples_max"] = float(np.max([ep.final_info.get("state", {}).get("score", 0) for ep in episodes]))
    return metrics


if __name__ == "__main__":
    main()
