"""What a model's policy is on the kitchen: the probability it gives each valid action in each state of the
optimal play (the planner's), through the prompt and answer format the LLM agent uses.

A greedy eval shows one action per state; RL needs the others to be sampled too. This reads the whole
distribution over the state's valid actions: the probability of each complete answer (the action phrase,
its closing tag), so a run can be checked for a policy that ignores the state (the same action most likely
everywhere) or has nearly no mass on an action the task needs.

    .venv/bin/python benchmarks/kitchen_policy.py <run dir or model> experiment=kitchen_learn env.actions=feasible

The first argument is a run directory (its `final/` is read), a model directory, or `builtin:smollm2-135m`;
the rest are Hydra overrides that set the env and the agent's interface (the run's own preset and env
options). Prints a table and, with `--out`, writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def model_path(value: str) -> str:
    """A run directory means its final model; anything else is passed on as `model.name_or_path`."""
    path = Path(value)
    if (path / "final").is_dir():
        return str(path / "final")
    return value


def probe(model_or_run: str, overrides: list[str], seed: int = 0) -> list[dict[str, Any]]:
    """One row per state of the optimal play from reset(seed): the planner's action and the probability
    of each valid action's full answer."""
    import torch

    from agentrl.agents.llm import TextInterface, demonstration_answer, resolve_interface
    from agentrl.agents.planning_kitchen import kitchen_action
    from agentrl.agents.scoring import candidate_logps
    from agentrl.config import compose_config
    from agentrl.envs import env_factory
    from agentrl.envs.base import TextEnv
    from agentrl.errors import ConfigError
    from agentrl.models import load_model
    from agentrl.types import StepContext

    cfg = compose_config(["task=eval", *overrides, f"model.name_or_path={model_path(model_or_run)}"])
    if cfg.env.name != "kitchen":
        raise ConfigError(f"kitchen_policy.py reads the kitchen env, not env={cfg.env.name}")
    model, tokenizer = load_model(cfg.model, device="cpu")
    env: TextEnv = env_factory(cfg.env)()
    resolved = resolve_interface(cfg.agent, list(env.action_names), tokenizer, free_text=False)
    interface = TextInterface.from_cfg(cfg.agent, prefill=resolved.prefill)
    observation, info = env.reset(seed=seed)
    rows = []
    for _ in range(env.max_steps):
        ctx = StepContext(env, observation, info, [], np.random.default_rng(seed), 0)
        valid = list(info["valid_actions"])
        prompt = tokenizer(interface.render(interface.messages(ctx), tokenizer), add_special_tokens=False)
        answers = [demonstration_answer(interface, action, valid) for action in valid]
        candidates = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
        with torch.no_grad():
            logps, mask = candidate_logps(model, [prompt["input_ids"]], [candidates])
        probs = (logps * mask).sum(1).exp().tolist()
        planned = env.action_names[kitchen_action(ctx)]
        rows.append(
            {
                "state": env.render_text().splitlines()[2:4],
                "planner": planned,
                "p": dict(zip(valid, probs, strict=True)),
            }
        )
        observation, _, terminated, truncated, info = env.step(planned)
        if terminated or truncated:
            break
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| state (hand; plate) | planner's action | p(planner's) | most likely | p(valid answers) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["p"]
        top = max(p, key=p.get)
        lines.append(
            f"| {' '.join(r['state'])} | {r['planner']} | {p[r['planner']]:.3f} | {top} ({p[top]:.3f}) |"
            f" {sum(p.values()):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", help="a run directory (its final/), a model directory or builtin:<name>")
    parser.add_argument("--seed", type=int, default=0, help="the env's reset seed (the counter's order)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args, overrides = parser.parse_known_args(argv)
    rows = probe(args.model, overrides, args.seed)
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "overrides": overrides, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
