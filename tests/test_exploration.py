"""Exploration wrappers (agents/exploration.py): try-all, epsilon-greedy, self-consistency, config keys."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from agentrl.agents import build_agent
from agentrl.agents.backends import Backend
from agentrl.agents.base import Agent, PolicyAgent
from agentrl.agents.baselines import PlannerAgent, RandomAgent
from agentrl.agents.exploration import (
    EpsilonGreedy,
    ExploredDecision,
    ExploredGeneration,
    SelfConsistency,
    TryAll,
    apply_exploration,
    exploration_of,
    majority,
    unwrap,
)
from agentrl.agents.llm import LLMAgent, TextInterface
from agentrl.cli import app
from agentrl.config import compose_config
from agentrl.envs import make_env
from agentrl.envs.bandit import BanditEnv
from agentrl.errors import ConfigError
from agentrl.rollout import rollout
from agentrl.types import Decision, Generation, Step, StepContext


class Constant(PolicyAgent):
    """Always the same action; counts the contexts it was asked about."""

    name = "constant"

    def __init__(self, action: int = 0):
        self.action, self.asked = action, 0

    def choose(self, ctx: StepContext) -> int:
        self.asked += 1
        return self.action


class Scripted(Agent):
    """Answers row k of every call with script[k] (an action index, or None for an invalid answer), each
    with a generation naming the row."""

    name = "scripted"

    def __init__(self, script: list[int | None]):
        self.script, self.calls = script, []

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        self.calls.append(len(contexts))
        out = []
        for k, _ in enumerate(contexts):
            action = self.script[k % len(self.script)]
            generation = Generation(f"prompt {k}", f"answer {k}", [1], [2, 3], [-0.5, -0.1])
            out.append(
                Decision(
                    action=action if action is not None else 0,
                    valid=action is not None,
                    generation=generation,
                )
            )
        return out


def _ctx(env: Any, seed: int = 0) -> StepContext:
    obs, info = env.reset(seed=seed)
    return StepContext(env, obs, info, [], np.random.default_rng(seed), 0)


# ---- try-all -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("arms", [5, 10])
def test_try_all_covers_every_arm_in_the_first_k_steps(arms):
    inner = Constant(0)
    episodes = rollout(lambda: make_env("bandit", arms=arms, horizon=20), TryAll(inner), seeds=range(4))
    for episode in episodes:
        first = [s.action for s in episode.steps[:arms]]
        assert first == list(range(arms))  # every arm once, in the env's order
        assert all(s.generation is None for s in episode.steps[:arms])
        assert [s.action for s in episode.steps[arms:]] == [0] * (20 - arms)
    assert inner.asked == 4 * (20 - arms)  # the agent is never asked during the try-all steps


def test_try_all_hands_the_agent_the_rest_of_a_mixed_batch():
    env_a, env_b = BanditEnv(arms=3), BanditEnv(arms=3)
    fresh = _ctx(env_a)
    done = _ctx(env_b, seed=1)
    for a in range(3):
        env_b.step(a)
    done.history = [Step("", a, env_b.action_names[a], True, 0.0, 0.0) for a in range(3)]
    inner = Scripted([2])
    decisions = TryAll(inner).act([fresh, done])
    assert inner.calls == [1]
    assert decisions[0].action == 0 and exploration_of(decisions[0]) == "try_all"
    assert decisions[1].action == 2 and exploration_of(decisions[1]) is None


# ---- epsilon-greedy ----------------------------------------------------------------------------------
def test_epsilon_one_plays_uniformly_random_valid_actions():
    episodes = rollout(lambda: make_env("bandit", arms=5), EpsilonGreedy(Constant(0), 1.0), seeds=range(40))
    actions = Counter(s.action for e in episodes for s in e.steps)
    total = sum(actions.values())  # 2000 steps: each share has standard error 0.009
    assert set(actions) == set(range(5))
    assert all(abs(n / total - 0.2) < 0.04 for n in actions.values())


def test_epsilon_marks_the_executed_action_and_keeps_the_generation():
    env = BanditEnv(arms=4)
    agent = EpsilonGreedy(Scripted([3]), 1.0)
    decision = agent.act([_ctx(env)])[0]
    assert isinstance(decision, ExploredDecision) and exploration_of(decision) == "epsilon"
    assert decision.proposed_action == 3 and decision.valid
    assert isinstance(decision.generation, ExploredGeneration)
    assert (
        decision.generation.completion_text == "answer 0"
        and decision.generation.executed_action == decision.action
    )
    # the mark survives into the recorded steps (through the generation)
    episodes = rollout(
        lambda: make_env("bandit", arms=4, horizon=30), EpsilonGreedy(Scripted([3]), 0.3), [0, 1]
    )
    steps = [s for e in episodes for s in e.steps]
    marked = [s for s in steps if exploration_of(s) == "epsilon"]
    assert 0 < len(marked) < len(steps)
    assert all(s.action == 3 for s in steps if exploration_of(s) is None)
    assert all(s.generation.completion_text.startswith("answer ") for s in marked)


def test_epsilon_zero_is_a_no_op():
    agent = Constant(1)
    assert apply_exploration(agent, {"try_all": False, "epsilon": 0.0, "self_consistency": 1}) is agent
    assert apply_exploration(agent, None) is agent
    ctx = _ctx(BanditEnv(arms=4))
    before = ctx.rng.bit_generator.state
    decisions = EpsilonGreedy(Constant(1), 0.0).act([ctx])
    assert decisions[0].action == 1 and type(decisions[0]) is Decision
    assert ctx.rng.bit_generator.state == before  # no draws: the agent's own randomness is unchanged
    plain = rollout(lambda: make_env("bandit"), RandomAgent(), [0, 1, 2])
    wrapped = rollout(lambda: make_env("bandit"), EpsilonGreedy(RandomAgent(), 0.0), [0, 1, 2])
    assert [e.summary() for e in plain] == [e.summary() for e in wrapped]


# ---- self-consistency --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("script", "winner", "voter"),
    [
        ([2, 1, 1, 2, 3], 2, 0),  # tie 2:2, the action voted for first wins; its first voter is kept
        ([3, 1, 1], 1, 1),
        ([None, None, 0, 0, 3], 0, 2),  # invalid answers do not vote
        ([1, None, 3, 3], 3, 2),
    ],
)
def test_self_consistency_plays_the_majority_of_the_answers(script, winner, voter):
    env = BanditEnv(arms=4)
    inner = Scripted(script)
    contexts = [_ctx(env)]
    decision = SelfConsistency(inner, len(script)).act(contexts)[0]
    assert inner.calls == [len(script)]  # one batched call for all samples
    assert decision.action == winner and decision.valid
    assert decision.generation.completion_text == f"answer {voter}"  # a completion that voted for it
    assert exploration_of(decision) is None  # the model's own answer: not exploratory
    assert sum(decision.votes.values()) == sum(a is not None for a in script)


def test_self_consistency_without_a_valid_answer_plays_the_first():
    answers = [Decision(action=0, valid=False, penalty=-1.0), Decision(action=2, valid=False, penalty=-1.0)]
    decision = majority(answers, ["a", "b", "c"])
    assert decision.action == 0 and not decision.valid and decision.penalty == -1.0 and decision.votes == {}


def test_self_consistency_keeps_each_episode_apart():
    env = BanditEnv(arms=4)
    contexts = [_ctx(env, 0), _ctx(env, 1)]
    # rows: sample 0 -> [ep0, ep1], sample 1 -> [ep0, ep1], sample 2 -> [ep0, ep1]
    inner = Scripted([1, 2, 3, 2, 1, 0])
    decisions = SelfConsistency(inner, 3).act(contexts)
    names = env.action_names
    assert [d.action for d in decisions] == [1, 2]
    assert decisions[0].votes == {names[1]: 2, names[3]: 1}
    assert decisions[1].votes == {names[2]: 2, names[0]: 1}
    assert [d.generation.completion_text for d in decisions] == ["answer 0", "answer 1"]


class ChatScript(Backend):
    """A chat backend that answers row k of each call with texts[k % len(texts)]."""

    name = "chat-script"
    chat_input = True

    def __init__(self, texts: list[str]):
        self.texts, self.rows = texts, []

    def generate(self, prompts, sampling, *, seed=None):
        raise AssertionError("a chat backend gets chat messages")

    def generate_chat(self, conversations, sampling, *, prefill="", seed=None):
        self.rows.append(len(conversations))
        return [(self.texts[k % len(self.texts)], [k], None) for k in range(len(conversations))]


def test_self_consistency_over_an_llm_agent():
    env = BanditEnv(arms=3)
    _, info = env.reset(seed=0)
    a, b, c = env.action_names
    backend = ChatScript(
        [f"<action>{b}</action>", f"I pick <action>{c}</action>", "no idea", f"<action>{c}</action>"]
    )
    agent = SelfConsistency(LLMAgent(TextInterface(), backend), 4)
    decision = agent.act([StepContext(env, env.render_text(), info, [], np.random.default_rng(0), 0)])[0]
    assert backend.rows == [4]
    assert decision.action == env.action_index(c) and decision.valid
    assert decision.generation.completion_text == f"I pick <action>{c}</action>"
    assert decision.votes == {b: 1, c: 2}
    # the wrapper forwards the LLM agent's attributes and re-wraps its configured views
    assert agent.backend is backend and agent.interface.answer_tag == "action"
    view = agent.configured(invalid_penalty=-5.0)
    assert isinstance(view, SelfConsistency) and view.samples == 4
    assert unwrap(view).interface.invalid_penalty == -5.0


# ---- config and CLI ----------------------------------------------------------------------------------
def test_config_keys_build_the_wrappers_in_order():
    cfg = compose_config(
        [
            "env=bandit",
            "agent=planner",
            "agent.explore.try_all=true",
            "agent.explore.epsilon=0.1",
            "agent.explore.self_consistency=3",
        ]
    )
    agent = build_agent(cfg)
    assert isinstance(agent, TryAll) and agent.name == "planner"
    assert isinstance(agent.inner, EpsilonGreedy) and agent.inner.epsilon == 0.1
    assert isinstance(agent.inner.inner, SelfConsistency) and agent.inner.inner.samples == 3
    assert isinstance(unwrap(agent), PlannerAgent) and "explore" not in unwrap(agent).options
    assert type(build_agent(compose_config(["env=bandit", "agent=random"]))) is RandomAgent


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.explore.epsilon=1.5", r"agent\.explore\.epsilon=1\.5: must be in \[0, 1\]"),
        ("agent.explore.epsilon=-0.1", r"agent\.explore\.epsilon=-0\.1: must be in \[0, 1\]"),
        ("agent.explore.self_consistency=0", r"agent\.explore\.self_consistency=0: must be >= 1"),
    ],
)
@pytest.mark.parametrize("agent", ["random", "llm"])
def test_bad_explore_values_fail_with_one_clear_line(agent, override, message):
    with pytest.raises(ConfigError, match=message):
        compose_config([f"agent={agent}", override])


def test_bad_values_fail_when_built_directly():
    with pytest.raises(ConfigError, match=r"agent\.explore\.epsilon=1\.5: must be in \[0, 1\]"):
        apply_exploration(Constant(), {"epsilon": 1.5})
    with pytest.raises(ConfigError, match="unknown config key 'agent.explore.eps'"):
        apply_exploration(Constant(), {"eps": 0.5})
    with pytest.raises(ConfigError, match="epsilon"):
        EpsilonGreedy(Constant(), 2.0)


def test_cli_eval_random_agent_with_try_all_and_epsilon(tmp_path):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "env=bandit",
            "env.arms=6",
            "agent=random",
            "agent.explore.try_all=true",
            "agent.explore.epsilon=0.2",
            "eval.episodes=3",
            f"hydra.run.dir={run_dir}",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 3
    for episode in episodes:
        assert len(set(episode["actions"][:6])) == 6  # the first six presses try all six buttons
    assert json.loads((run_dir / "eval.json").read_text())["mean_action_coverage"] == 1.0
