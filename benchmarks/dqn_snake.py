"""DQN on Snake 10x10 against the random and planner baselines, side by side in one run.

Trains SB3 DQN (conf/algo/dqn.yaml) on the default Snake env (10x10, one apple, random opponent snake,
100 moves) on this machine's CPU with one torch thread, then evaluates DQN, `random` and `planner` on
the same held-out seeds through agentrl.evaluation and prints one table: mean return ± stderr, apples
per episode, success, episode length, training steps and minutes.

    .venv/bin/python benchmarks/dqn_snake.py                       # 100k steps (algo/dqn.yaml)
    .venv/bin/python benchmarks/dqn_snake.py --env snake_poison --episodes 50
    .venv/bin/python benchmarks/dqn_snake.py --steps 20000 algo.learning_rate=0.001 env.opponent=false

The Q-network reads the env's numeric observation (26 compact features, envs/snake.py). The trained
run directory can be evaluated again with `agentrl eval env=snake agent=dqn agent.path=<run dir>`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from agentrl.agents.baselines import PlannerAgent, RandomAgent
from agentrl.agents.dqn import load_dqn_agent
from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.evaluation import eval_seeds, evaluate
from agentrl.trainers.dqn import snake_apples, train_dqn


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=None, help="total env steps (default: algo/dqn.yaml)")
    parser.add_argument("--episodes", type=int, default=100, help="held-out eval episodes per agent")
    parser.add_argument("--env", default="snake", choices=["snake", "snake_poison"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=None, help="the DQN run directory (default: a new temporary one)"
    )
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

    run_dir = args.out or Path(tempfile.mkdtemp(prefix="dqn_snake_"))
    steps = int(cfg.algo.total_timesteps)
    console.print(f"training DQN for {steps:,} steps into {run_dir} ...")
    result = train_dqn(cfg, run_dir, env_factory)
    minutes = result.extra["train_time_s"] / 60  # training only, not the evaluation
    # The saved model, loaded as `agentrl eval agent=dqn` does, so the row is what a user gets back.
    rows.append(("dqn", _eval(make_env, load_dqn_agent(run_dir), seeds), steps, minutes))
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
        "untagged",  # answers outside the asked format: 0 for classic agents (no text)
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
            f"{m.get('untagged_rate', 0.0):.2f}",
            "" if steps is None else f"{steps:,}",
            "" if minutes is None else f"{minutes:.1f}",
        )
    console.print(table)
    console.print(
        f"torch threads: {torch.get_num_threads()}, CPU count: {os.cpu_count()}, python {sys.version.split()[0]}"
    )
    console.print(f"DQN run directory: {run_dir}")


def _eval(make_env, agent, seeds) -> dict:
    metrics, episodes = evaluate(make_env, agent, seeds, description=getattr(agent, "name", "agent"))
    metrics["apples"] = snake_apples(episodes)
    metrics["apples_max"] = float(np.max([ep.final_info.get("state", {}).get("score", 0) for ep in episodes]))
    return metrics


if __name__ == "__main__":
    main()
