"""Evaluation: play held-out episodes with any agent and write eval.json / episodes.jsonl / transcripts."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from agentrl.diagnostics import diagnostics_section, final_coverage_regret
from agentrl.envs import TextEnv
from agentrl.rollout import rollout
from agentrl.runs.runlog import progress, write_json
from agentrl.types import Agent, Episode


def eval_seeds(cfg: DictConfig) -> list[int]:
    """Held-out env seeds: disjoint from training seeds (< seed_offset) and distinct per global seed."""
    start = int(cfg.eval.seed_offset) + 1000 * int(cfg.seed)
    return [start + k for k in range(int(cfg.eval.episodes))]


def _stderr(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, Any]:
    """Aggregate metrics over episodes. Env-specific per-episode numbers (e.g. bandit regret, snake
    apples) arrive in the final info's `episode_metrics` dict and are averaged as `mean_<key>`. Without
    episodes (an eval stopped before its first ended) every rate and mean is None: nothing was measured."""
    n = len(episodes)
    if not n:
        keys = (
            "success_rate",
            "mean_return",
            "return_stderr",
            "mean_length",
            "invalid_rate",
            "untagged_rate",
        )
        return {"episodes": 0, **dict.fromkeys(keys)}
    returns = [e.episode_return for e in episodes]
    steps = sum(e.length for e in episodes)
    metrics: dict[str, Any] = {
        "episodes": n,
        "success_rate": sum(e.success for e in episodes) / n,
        "mean_return": sum(returns) / n,
        "return_stderr": _stderr(returns),
        "mean_length": steps / n,
        "invalid_rate": sum(e.invalid_count for e in episodes) / steps if steps else 0.0,
        # valid actions the lenient parser read from answers without a usable answer tag: a model that
        # learns to end any text with an action name, rather than the requested format, shows here
        "untagged_rate": sum(e.untagged_count for e in episodes) / steps if steps else 0.0,
    }
    judged = [s.rationale for e in episodes for s in e.steps if s.rationale is not None]
    if judged:  # agent.cot: answers that kept the asked <think> rationale
        metrics["rationale_rate"] = sum(judged) / len(judged)
    extra_keys = sorted({k for e in episodes for k in e.final_info.get("episode_metrics", {})})
    for key in extra_keys:
        values = [
            e.final_info["episode_metrics"][key]
            for e in episodes
            if key in e.final_info.get("episode_metrics", {})
        ]
        metrics[f"mean_{key}"] = sum(values) / len(values)
    return metrics


def per_episode(episodes: Sequence[Episode]) -> dict[str, list[Any]]:
    """Each episode's seed, return and success (0/1), and a bandit-like env's final action coverage and
    cumulative regret, in play order: eval.json's and eval_before.json's `per_episode`, which `agentrl
    report --table learning` pairs by seed for RL's gain over the model it started from."""
    out: dict[str, list[Any]] = {
        "seed": [e.seed for e in episodes],
        "return": [float(e.episode_return) for e in episodes],
        "success": [int(bool(e.success)) for e in episodes],
    }
    finals = [final_coverage_regret(e) for e in episodes]
    if finals and all(f is not None for f in finals):
        out["coverage"] = [f[0] for f in finals]  # type: ignore[index]
        out["regret"] = [f[1] for f in finals]  # type: ignore[index]
    return out


def eval_record(
    metrics: dict[str, Any], episodes: Sequence[Episode], ucb_c: float | None = None
) -> dict[str, Any]:
    """An evaluation as eval.json and eval_before.json keep it: the metrics, `diagnostics` for a
    bandit-like env or tic-tac-toe (agentrl/diagnostics.py, knowing-doing judged against UCB1 with
    `ucb_c`) and `per_episode`."""
    data = dict(metrics)
    diagnostics = diagnostics_section(episodes, ucb_c=ucb_c)
    if diagnostics is not None:
        data["diagnostics"] = diagnostics
    data["per_episode"] = per_episode(episodes)
    return data


def evaluate(
    make_env: Callable[[], TextEnv],
    agent: Agent,
    seeds: Sequence[int],
    *,
    lockstep: bool = True,
    description: str = "eval",
    agent_seed: int = 0,
) -> tuple[dict[str, Any], list[Episode]]:
    """Play one episode per seed with `agent`; return (metrics, episodes). Progress (episodes done,
    steps/s, ETA) is a live bar in a terminal, else a plain line every 10% of the episodes and at least
    every 30 s (`runlog.progress`)."""
    with progress(description, total=len(seeds), every_advance=False) as bar:
        try:
            episodes = rollout(make_env, agent, seeds, progress=bar, lockstep=lockstep, agent_seed=agent_seed)
        except KeyboardInterrupt as exc:
            raise EvalInterrupted(list(getattr(exc, "episodes", [])), len(seeds)) from exc
    return episode_metrics(episodes), episodes


class EvalInterrupted(KeyboardInterrupt):
    """Ctrl-C during `evaluate`: still a KeyboardInterrupt (the run ends as interrupted), carrying the
    episodes that finished (`episodes`) out of `planned`, so the caller can write them."""

    def __init__(self, episodes: list[Episode], planned: int):
        super().__init__(f"interrupted after {len(episodes)} of {planned} episodes")
        self.episodes, self.planned = episodes, planned


def write_eval(
    run_dir: Path,
    metrics: dict[str, Any],
    episodes: Sequence[Episode],
    *,
    transcripts: bool = True,
    ucb_c: float | None = None,
    **extra: Any,
) -> Path:
    """Write run_dir/eval.json (`extra` and `eval_record`: the metrics, `diagnostics` for a bandit-like
    env or tic-tac-toe, `per_episode`), episodes.jsonl and, when any step carries an LLM generation, transcripts.jsonl (prompt,
    completion, parsed action, valid flag, reward; a scoring agent's action probabilities, an exploration
    mark, and the env's `reason` for a step when it gives one)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "episodes.jsonl").open("w", encoding="utf-8") as f:
        for ep in episodes:
            f.write(json.dumps(ep.summary()) + "\n")
    if transcripts and any(s.generation for ep in episodes for s in ep.steps):
        with (run_dir / "transcripts.jsonl").open("w", encoding="utf-8") as f:
            for k, ep in enumerate(episodes):
                for t, s in enumerate(ep.steps):
                    row = {
                        "episode": k,
                        "seed": ep.seed,
                        "step": t,
                        "action": s.action_name,
                        "valid": s.valid,
                    }
                    row["reward"] = s.reward
                    if s.generation is not None:
                        row["prompt"] = s.generation.prompt_text
                        row["completion"] = s.generation.completion_text
                        if s.generation.action_probs:  # a scoring agent's policy over the valid actions
                            row["action_probs"] = s.generation.action_probs
                        explored = getattr(s.generation, "exploration", None)
                        if explored:  # an exploration mechanism chose the executed action
                            row["explored"] = explored
                    if s.reason:
                        row["reason"] = s.reason  # why the env scored the step so
                    f.write(json.dumps(row) + "\n")
    path = run_dir / "eval.json"
    write_json(path, {**extra, **eval_record(metrics, episodes, ucb_c=ucb_c)})
    return path
