"""Metric aggregation on hand-made episodes, held-out seeds, and lockstep == sequential rollouts."""

from __future__ import annotations

import json
import re

import pytest

from agentrl.agents.baselines import RandomAgent
from agentrl.envs import env_factory
from agentrl.evaluation import episode_metrics, eval_seeds, evaluate, write_eval
from agentrl.rollout import rollout
from agentrl.types import Episode, Generation, Step


def _step(reward: float, valid: bool = True, gen: Generation | None = None) -> Step:
    return Step("obs", 0, "left", valid, reward, reward, gen)


def test_episode_metrics_known_values():
    episodes = [
        Episode(
            seed=1,
            steps=[_step(0.0), _step(1.0)],
            success=True,
            final_info={"episode_metrics": {"regret": 2.0}},
        ),
        Episode(
            seed=2,
            steps=[_step(0.0, valid=False), _step(0.0), _step(-1.0)],
            final_info={"episode_metrics": {"regret": 4.0}},
        ),
    ]
    m = episode_metrics(episodes)
    assert m["episodes"] == 2 and m["success_rate"] == 0.5
    assert m["mean_return"] == 0.0
    assert m["return_stderr"] == pytest.approx(1.0)  # sample sd sqrt(2) / sqrt(2)
    assert m["mean_length"] == 2.5 and m["invalid_rate"] == pytest.approx(1 / 5)
    assert m["mean_regret"] == 3.0


def test_eval_seeds_are_held_out_and_per_seed():
    from agentrl.config import compose_config

    cfg = compose_config(["eval.episodes=3", "eval.seed_offset=1000000"])
    assert eval_seeds(cfg) == [1_000_000, 1_000_001, 1_000_002]
    assert eval_seeds(compose_config(["seed=2"]))[0] == 1_002_000


def test_lockstep_and_sequential_rollouts_agree():
    make_env = env_factory({"name": "snake"})
    seeds = [5, 6, 7, 8]
    a = rollout(make_env, RandomAgent(), seeds, lockstep=True)
    b = rollout(make_env, RandomAgent(), seeds, lockstep=False)
    assert [e.summary() for e in a] == [e.summary() for e in b]
    assert all(e.terminated or e.truncated for e in a)


def test_evaluate_and_write_eval(tmp_path):
    make_env = env_factory({"name": "frozenlake"})
    metrics, episodes = evaluate(make_env, RandomAgent(), [1, 2, 3])
    gen = Generation("PROMPT", "<action>left</action>", [1, 2], [3], [-0.1])
    episodes[0].steps[0].generation = gen
    write_eval(tmp_path, metrics, episodes, env="frozenlake", agent="random")
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["env"] == "frozenlake" and data["episodes"] == 3
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 3
    rows = [json.loads(x) for x in (tmp_path / "transcripts.jsonl").read_text().splitlines()]
    assert rows[0]["prompt"] == "PROMPT" and rows[0]["completion"] == "<action>left</action>"
    assert len(rows) == sum(e.length for e in episodes)
    assert data["per_episode"] == {
        "seed": [1, 2, 3],
        "return": [e.episode_return for e in episodes],
        "success": [int(e.success) for e in episodes],
    }


def test_per_episode_coverage_and_regret_average_to_the_diagnostics():
    from agentrl.evaluation import eval_record

    record = eval_record(*evaluate(env_factory({"name": "bandit", "horizon": 6}), RandomAgent(), range(8)))
    per, diagnostics = record["per_episode"], record["diagnostics"]
    assert len(per["coverage"]) == len(per["regret"]) == 8 and len(set(per["coverage"])) > 1
    assert sum(per["coverage"]) / 8 == pytest.approx(diagnostics["final_coverage"]["mean"])
    assert sum(per["regret"]) / 8 == pytest.approx(diagnostics["final_regret"]["mean"])
    assert (
        "coverage"
        not in eval_record(*evaluate(env_factory({"name": "snake"}), RandomAgent(), [1]))["per_episode"]
    )


class _RecordingBar:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float | None]] = []

    def advance(self, line: str = "", n: int = 1, eta_s: float | None = None) -> None:
        self.calls.append(("advance", line, eta_s))

    def update(self, line: str, eta_s: float | None = None) -> None:
        self.calls.append(("update", line, eta_s))


def test_rollout_reports_every_lockstep_step_with_a_time_bound():
    """A lockstep eval refreshes its line (steps, steps/s) after every step, not only as episodes end,
    with an upper bound on the time left from the env's step cap."""
    make_env = env_factory({"name": "frozenlake", "max_steps": 8})
    bar = _RecordingBar()
    episodes = rollout(make_env, RandomAgent(), [1, 2, 3], progress=bar)
    updates = [c for c in bar.calls if c[0] == "update"]
    advances = [c for c in bar.calls if c[0] == "advance"]
    assert len(advances) == 3 and len(updates) == max(e.length for e in episodes)
    assert re.match(r"episodes \d steps 3 steps/s ", updates[0][1])  # 3 episodes, one step each
    assert advances[-1][1].startswith(f"episodes 3 steps {sum(e.length for e in episodes)} steps/s ")
    assert all(eta is not None and eta >= 0 for _, _, eta in bar.calls)
    assert updates[-1][2] == 0.0  # nothing left to play after the last step


def test_rollout_time_bound_counts_the_episodes_not_started():
    from agentrl.rollout import RolloutStats

    stats = RolloutStats(total=4)
    stats.cap, stats.steps, stats.episodes, stats.running, stats.running_steps_left = 8, 10, 1, 1, 5
    # 10 steps in 5 s: 2 steps/s; left at most 5 (running) + 2 * 8 (not started) = 21 steps
    assert stats.seconds_left_bound(5.0) == pytest.approx(10.5)
    stats.cap = None
    assert stats.seconds_left_bound(5.0) is None
