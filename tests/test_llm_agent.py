"""The LLM text interface (prompt rendering, parsing, invalid-action rules) and LLMAgent rollouts with the
tiny random model."""

from __future__ import annotations

import os
import string
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.agents.backends import Backend, HFBackend, SamplingConfig
from agentrl.agents.llm import (
    AUTO_PREFILL,
    LLMAgent,
    ResolvedInterface,
    TextInterface,
    build_llm_agent,
    describe_interface,
    env_action_names,
    format_prompt_preview,
    resolve_interface,
    single_token_after,
)
from agentrl.config import compose_config
from agentrl.envs import env_factory, make_env
from agentrl.envs.base import TextEnv
from agentrl.errors import ConfigError, UnknownChoiceError
from agentrl.evaluation import episode_metrics
from agentrl.models import load_model
from agentrl.rollout import rollout
from agentrl.types import Step, StepContext

torch.set_num_threads(1)


class Corridor(TextEnv):
    """A 1-D corridor: walk right from cell 0 to the last cell (+1). Small and fixed, for snapshots."""

    name = "corridor"
    action_names = ["left", "right", "wait"]

    def __init__(self, length: int = 4, max_steps: int = 5):
        self.length, self.max_steps = length, max_steps
        super().__init__()

    @property
    def instructions(self) -> str:
        return "Walk right to the exit E. Reward 1 at the exit.\nActions: left, right, wait."

    def _reset(self, options):
        self.pos = self.seed_used % (self.length - 1)  # no RNG: snapshots stay fixed

    def reset(self, *, seed=None, options=None):
        self.seed_used = int(seed or 0)
        return super().reset(seed=seed, options=options)

    def _step(self, index):
        move = {0: -1, 1: 1, 2: 0}[index]
        self.pos = min(max(self.pos + move, 0), self.length - 1)
        done = self.pos == self.length - 1
        return (1.0 if done else 0.0), done, done, {}

    def render_text(self) -> str:
        return "".join(
            "P" if i == self.pos else ("E" if i == self.length - 1 else "_") for i in range(self.length)
        )

    def state(self):
        return {"pos": self.pos}

    def valid_actions(self):
        return ["left", "right"] if self.pos > 0 else ["right", "wait"]


def _ctx(history: list[Step] | None = None, seed: int = 0) -> StepContext:
    env = Corridor()
    obs, info = env.reset(seed=seed)
    return StepContext(env, obs, info, history or [], np.random.default_rng(seed), 0)


@pytest.fixture(scope="module")
def tiny():
    return load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")


# ---- parsing ---------------------------------------------------------------------------------------
ACTIONS = st.lists(
    st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=8),
    min_size=1,
    max_size=6,
    unique_by=str.lower,
)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300), valid=ACTIONS, lenient=st.booleans(), cot=st.booleans())
def test_parse_never_raises_and_returns_a_valid_action(text, valid, lenient, cot):
    # the inner parser, not `parse`: its catch-all must never be what keeps a rollout alive
    interface = TextInterface(lenient=lenient, cot=cot)
    result, tagged = interface._parse(text, valid)
    assert result is None or result in valid
    assert isinstance(tagged, bool) and not (tagged and result is None)


@settings(max_examples=300, deadline=None)
@given(
    valid=ACTIONS,
    pick=st.integers(min_value=0),
    before=st.text(alphabet=st.characters(blacklist_characters="<"), max_size=80),
    after=st.text(alphabet=st.characters(blacklist_characters="<"), max_size=80),
    upper=st.booleans(),
    lenient=st.booleans(),
)
def test_parse_finds_a_tagged_valid_action(valid, pick, before, after, upper, lenient):
    action = valid[pick % len(valid)]
    shown = action.upper() if upper else action
    text = f"{before}<action> {shown} </action>{after}"
    assert TextInterface(lenient=lenient).parse(text, valid) == action
    # also after a reasoning block that mentions other actions, and with a prefilled open tag
    reasoning = "<think>" + " ".join(valid) + "</think>"
    assert TextInterface(cot=True, lenient=lenient).parse(reasoning + text, valid) == action
    assert TextInterface(lenient=lenient).parse(f"<action>{shown}", valid) == action


@pytest.mark.parametrize(
    ("text", "lenient", "expected"),
    [
        ("<action>right</action>", False, "right"),
        ("<ACTION>Right.</ACTION>", False, "right"),
        ("<action>left</action> no wait <action>right</action>", False, "right"),  # the last answer counts
        ("<action>up</action>", True, None),  # not a valid action now
        ("<action>move right</action>", False, None),
        ("<action>move right</action>", True, "right"),
        ("I will go right.", False, None),
        ("I will go left, no, right.", True, "right"),  # lenient: last valid action named
        ("brightly", True, None),  # whole words only
        ("<think>right is best", True, None),  # reasoning never closed: no answer
        ("<think>left?</think> so right", True, "right"),
        ("<action>", True, None),
        ("", True, None),
    ],
)
def test_parse_cases(text, lenient, expected):
    assert TextInterface(lenient=lenient).parse(text, ["left", "right"]) == expected


@pytest.mark.parametrize(
    ("text", "prefill", "lenient", "expected"),
    [
        ("<think>go</think><action>right</action>", "", True, ("right", False)),
        ("<action>move right</action>", "", True, ("right", False)),  # inside a tag: the format was followed
        ("<action>move right</action>", "", False, (None, False)),  # strict: not an action name
        ("1. Now you have 8 cells. Go right", "", True, ("right", True)),  # only the lenient fallback read it
        ("1. Now you have 8 cells. Go right", "", False, (None, True)),  # strict: invalid, still counted
        ("right", "Move:", False, ("right", False)),  # a prefilled one-token answer is the requested format
        ("Move: right.", "Move:", False, ("right", False)),  # the answer as the agent parses it
        ("I move to the right", "I move", False, (None, True)),  # not an action name after the prefill
        ("I move to the right", "I move", True, ("right", True)),
        ("nothing usable", "", True, (None, False)),
        ("nothing usable", "", False, (None, False)),
    ],
)
def test_parse_answer_marks_untagged_answers(text, prefill, lenient, expected):
    interface = TextInterface(prefill=prefill, lenient=lenient)
    assert interface.parse_answer(text, ["left", "right"]) == expected


def test_parsing_is_strict_by_default():
    assert TextInterface().lenient is False
    assert compose_config([]).agent.lenient is False
    assert TextInterface().parse("I will go right.", ["left", "right"]) is None


@pytest.mark.parametrize("lenient", [True, False])
def test_untagged_answers_are_counted_in_the_eval_metrics(tiny, lenient):
    _, tokenizer = tiny
    answers = ["<action>right</action>", "so right"]  # the second only the lenient parser reads
    agent = LLMAgent(TextInterface(lenient=lenient), ScriptedBackend(tokenizer, answers))
    episodes = rollout(lambda: Corridor(length=9, max_steps=4), agent, seeds=[0])
    steps = episodes[0].steps
    assert [s.untagged for s in steps] == [False, True] * (len(steps) // 2) + [False] * (len(steps) % 2)
    assert [s.valid for s in steps] == [True, lenient] * (len(steps) // 2) + [True] * (len(steps) % 2)
    metrics = episode_metrics(episodes)
    # counted either way: valid under the lenient parser, invalid under the strict one
    assert metrics["untagged_rate"] > 0
    assert metrics["untagged_rate"] == pytest.approx(sum(s.untagged for s in steps) / len(steps))
    assert metrics["invalid_rate"] == (0.0 if lenient else metrics["untagged_rate"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>right is the exit</think>\n<action>right</action>", True),
        ("<action>right</action>", False),  # valid under strict parsing, but no rationale
        ("<think> </think><action>right</action>", False),  # an empty one is none
        ("<think>right is the exit <action>right</action>", False),  # never closed
        ("<THINK>go right</THINK><action>right</action>", True),
    ],
)
def test_has_rationale_wants_a_closed_non_empty_think(text, expected):
    assert TextInterface(cot=True).has_rationale(text) is expected


@pytest.mark.parametrize("cot", [True, False])
def test_the_rationale_rate_counts_answers_that_skip_the_think(tiny, cot):
    from agentrl.trainers.iteration import rollout_metrics

    _, tokenizer = tiny
    answers = ["<think>the exit is right</think><action>right</action>", "<action>right</action>"]
    agent = LLMAgent(TextInterface(cot=cot), ScriptedBackend(tokenizer, answers))
    episodes = rollout(lambda: Corridor(length=9, max_steps=4), agent, seeds=[0])
    steps = episodes[0].steps
    assert all(s.valid for s in steps)  # strict parsing accepts both answers
    metrics = episode_metrics(episodes)
    training = rollout_metrics(episodes, [0.0] * len(steps))
    if not cot:  # no rationale asked: no figure (not a misleading 0)
        assert "rationale_rate" not in metrics and "train/rationale_rate" not in training
        assert {s.rationale for s in steps} == {None}
        return
    assert [s.rationale for s in steps] == [True, False] * (len(steps) // 2) + [True] * (len(steps) % 2)
    assert metrics["rationale_rate"] == pytest.approx(sum(s.rationale for s in steps) / len(steps))
    assert 0 < metrics["rationale_rate"] < 1
    assert training["train/rationale_rate"] == metrics["rationale_rate"]


def test_require_rationale_makes_an_answer_without_its_think_invalid():
    valid = ["left", "right"]
    both = "<think>the exit is right</think>\n<action>right</action>"
    strict = TextInterface(cot=True, require_rationale=True)
    assert strict.parse_answer(both, valid) == ("right", False)
    assert strict.parse_answer("<action>right</action>", valid) == (None, False)
    assert strict.parse_answer("<think> </think><action>right</action>", valid) == (None, False)
    assert TextInterface(cot=True).parse_answer("<action>right</action>", valid) == ("right", False)
    code = TextInterface(cot=True, require_rationale=True)
    assert code.extract_text("<action>print(1)</action>") is None
    assert code.extract_text("<think>print it</think><action>print(1)</action>").strip() == "print(1)"
    with pytest.raises(ConfigError, match="agent.cot=true"):
        TextInterface(require_rationale=True)
    with pytest.raises(ConfigError, match="require_rationale"):
        compose_config(["agent.require_rationale=true"])


def test_parse_answer_tag_option():
    interface = TextInterface(answer_tag="answer", lenient=False)
    assert interface.parse("<answer>left</answer>", ["left", "right"]) == "left"
    assert interface.parse("<action>left</action>", ["left", "right"]) is None
    with pytest.raises(ConfigError):
        TextInterface(answer_tag="a b")


# ---- prompt rendering ------------------------------------------------------------------------------
def test_messages_snapshot():
    messages = TextInterface().messages(_ctx(seed=1))
    assert messages == [
        {
            "role": "system",
            "content": "Walk right to the exit E. Reward 1 at the exit.\nActions: left, right, wait.",
        },
        {
            "role": "user",
            "content": "Observation:\n_P_E\n\nValid actions: left, right\nAnswer with one action as <action>NAME</action>.",
        },
    ]


def test_messages_with_history_cot_and_system_prompt():
    history = [
        Step("P__E", 2, "wait", False, -1.0, 0.0),
        Step("P__E", 1, "right", True, 0.0, 0.0),
    ]
    interface = TextInterface(history=5, cot=True, system_prompt="You are an agent.")
    system, user = interface.messages(_ctx(history, seed=1))
    assert system == {"role": "system", "content": "You are an agent."}
    assert user["content"] == (
        "Walk right to the exit E. Reward 1 at the exit.\nActions: left, right, wait.\n\n"
        "Previous steps (action -> reward):\n"
        "wait -> 0 (your answer was invalid; this action was played instead)\n"
        "right -> 0\n\n"
        "Observation:\n_P_E\n\n"
        "Valid actions: left, right\n"
        "First think step by step inside <think>...</think>, then answer with one action as <action>NAME</action>."
    )
    # a window of 1 shows only the last step; observations on request
    short = TextInterface(history=1, history_observations=True).messages(_ctx(history, seed=1))[1]["content"]
    assert "Observation 2:\nP__E\nright -> 0" in short and "wait" not in short.split("Observation:")[0]


def test_observation_last_ends_the_message_with_it_and_lengthens_the_shared_head():
    """`observation_last`: the same parts, the observation after the valid actions and the answer format,
    so two cells' prompts differ only from the observation on."""
    from agentrl.envs.frozenlake import FrozenLakeEnv

    def prompts(interface: TextInterface) -> list[str]:
        env = FrozenLakeEnv(map="4x4", slippery=False)
        first, info = env.reset(seed=0)
        second = env.step(1)[0]  # down: another cell
        return [
            interface.render(interface.messages(StepContext(env, obs, info, [], np.random.default_rng(0), 0)))
            for obs in (first, second)
        ]

    default, last = (
        prompts(TextInterface(prefill="I move")),
        prompts(TextInterface(prefill="I move", observation_last=True)),
    )
    user = last[0].split("<|user|>\n", 1)[1]
    assert user.startswith(
        "Valid actions: left, down, right, up\nAnswer with one action as <action>NAME</action>."
    )
    assert "\n\nObservation:\n" in user and user.endswith("<|assistant|>\nI move")
    assert sorted(last[0].splitlines()) == sorted(default[0].splitlines())  # the same lines, reordered
    shared = [len(os.path.commonprefix(pair)) for pair in (default, last)]
    assert shared[1] > shared[0] + len("Valid actions: left, down, right, up")
    assert len(last[0]) - shared[1] < len(default[0]) - shared[0]  # less to compute per distinct prompt


def test_render_applies_chat_template_and_prefill(tiny):
    _, tokenizer = tiny
    interface = TextInterface(prefill="<action>")
    text = interface.render(interface.messages(_ctx(seed=1)), tokenizer)
    assert text == (
        "<|im_start|>system\nWalk right to the exit E. Reward 1 at the exit.\nActions: left, right, wait.<|im_end|>\n"
        "<|im_start|>user\nObservation:\n_P_E\n\nValid actions: left, right\n"
        "Answer with one action as <action>NAME</action>.<|im_end|>\n<|im_start|>assistant\n<action>"
    )


# ---- invalid-action rules --------------------------------------------------------------------------
def test_invalid_rules():
    ctx = _ctx()
    ok = TextInterface().decide(ctx, "right")
    assert ok.valid and ok.action == 1 and ok.penalty == 0 and not ok.end_episode
    default = TextInterface().decide(ctx, None)
    assert (default.action, default.valid, default.penalty, default.end_episode) == (
        ctx.env.default_action(),
        False,
        -1.0,
        False,
    )
    end = TextInterface(invalid_rule="penalty_end", invalid_penalty=-2).decide(ctx, None)
    assert end.end_episode and end.penalty == -2 and not end.valid
    rand = TextInterface(invalid_rule="random", invalid_penalty=-5)
    many = [rand.decide(ctx, None) for _ in range(40)]
    assert {d.action for d in many} == {1, 2}  # both legal moves (right, wait), never the illegal "left"
    assert all(d.penalty == -5 and not d.valid for d in many)
    assert (
        rand.decide(_ctx(seed=0), None).action == rand.decide(_ctx(seed=0), None).action
    )  # same rng, same pick
    with pytest.raises(UnknownChoiceError):
        TextInterface(invalid_rule="retry")


# ---- LLMAgent --------------------------------------------------------------------------------------
class ScriptedBackend(Backend):
    """Answers from a script and records every batched call."""

    def __init__(self, tokenizer: Any, answers: list[str]):
        self.tokenizer, self.answers, self.calls = tokenizer, answers, []

    def generate(self, prompts, sampling, *, seed=None):
        self.calls.append(len(prompts))
        answer = self.answers[(len(self.calls) - 1) % len(self.answers)]
        ids = self.tokenizer(answer, add_special_tokens=False).input_ids
        return [(ids, [0.0] * len(ids)) for _ in prompts]


def test_one_batched_call_per_step_and_finished_episodes_drop_out(tiny):
    _, tokenizer = tiny
    backend = ScriptedBackend(tokenizer, ["<action>right</action>"])
    agent = LLMAgent(TextInterface(), backend)
    episodes = rollout(lambda: Corridor(length=5, max_steps=6), agent, seeds=list(range(6)))
    # always "right": an episode starting at cell p needs 4 - p moves; the batch shrinks as they finish
    lengths = [ep.length for ep in episodes]
    assert all(ep.success and ep.invalid_count == 0 for ep in episodes)
    assert len(backend.calls) == max(lengths)
    assert backend.calls == [sum(n > k for n in lengths) for k in range(max(lengths))]
    step = episodes[0].steps[0]
    assert step.generation.completion_text == "<action>right</action>" and step.action_name == "right"


def test_prefill_is_parsed_with_the_completion(tiny):
    _, tokenizer = tiny
    agent = LLMAgent(
        TextInterface(prefill="<action>", lenient=False), ScriptedBackend(tokenizer, ["right</action>"])
    )
    decision = agent.act([_ctx()])[0]
    assert decision.valid and decision.action == 1
    assert decision.generation.prompt_text.endswith("<|im_start|>assistant\n<action>")


def test_rollout_with_tiny_model(tiny):
    model, tokenizer = tiny
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)
    agent = LLMAgent(TextInterface(invalid_rule="penalty_default"), HFBackend(model, tokenizer), sampling)
    run = lambda agent_seed: rollout(  # noqa: E731
        lambda: Corridor(), agent, seeds=[0, 1, 2, 3], group_ids=[0, 0, 1, 1], agent_seed=agent_seed
    )
    episodes = run(0)
    assert [ep.group_id for ep in episodes] == [0, 0, 1, 1]
    for ep in episodes:
        assert 1 <= ep.length <= 5 and (ep.terminated or ep.truncated)
        for step in ep.steps:
            gen = step.generation
            assert gen.prompt_ids == tokenizer(gen.prompt_text, add_special_tokens=False).input_ids
            assert 1 <= len(gen.completion_ids) <= 6 and len(gen.logprobs) == len(gen.completion_ids)
            assert gen.completion_ids[-1] == tokenizer.eos_token_id or len(gen.completion_ids) == 6
            assert all(lp <= 0 for lp in gen.logprobs)
            # random weights rarely answer well: invalid steps get the default action and the penalty
            if not step.valid:
                assert step.reward == pytest.approx(step.env_reward - 1.0)
    again = run(0)
    assert [[s.generation.completion_ids for s in ep.steps] for ep in again] == [
        [s.generation.completion_ids for s in ep.steps] for ep in episodes
    ]
    other = run(1)
    assert [[s.generation.completion_ids for s in ep.steps] for ep in other] != [
        [s.generation.completion_ids for s in ep.steps] for ep in episodes
    ]


def _cfg(*overrides: str) -> Any:
    return compose_config(["model=tiny-random", "agent.sampling.temperature=0.0", *overrides])


def test_build_llm_agent_from_config(tiny):
    model, tokenizer = tiny
    agent = build_llm_agent(
        _cfg("agent.cot=true", "agent.history=3", "agent.invalid_rule=random"),
        model=model,
        tokenizer=tokenizer,
    )
    assert (
        isinstance(agent, LLMAgent) and isinstance(agent.backend, HFBackend) and agent.backend.model is model
    )
    assert agent.interface.cot and agent.interface.history == 3 and agent.interface.invalid_rule == "random"
    assert agent.sampling.max_new_tokens == 256 and not agent.sampling.do_sample  # cot default budget
    assert agent.effective_sampling().stop == ("</action>",)
    plain = build_llm_agent(_cfg("agent.prefill=''"), backend=agent.backend)
    assert plain.backend is agent.backend and plain.sampling.max_new_tokens == 32  # free-text default


# ---- prefill: auto ---------------------------------------------------------------------------------
def test_auto_interface_gives_frozenlake_one_token_answers_after_the_prefill(tiny):
    """tiny-random has SmolLM2's tokenizer, in which left/down/right/up are one token after "Move:"."""
    model, tokenizer = tiny
    cfg = _cfg("env=frozenlake")
    assert cfg.agent.prefill == "auto" and cfg.agent.sampling.max_new_tokens is None  # the shipped default
    resolved = resolve_interface(cfg.agent, ["left", "down", "right", "up"], tokenizer)
    assert resolved == ResolvedInterface(AUTO_PREFILL, 1, resolved.reason) and resolved.one_token
    agent = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    assert agent.interface.prefill == AUTO_PREFILL and agent.sampling.max_new_tokens == 1
    text = format_prompt_preview(cfg)
    assert text.endswith("<|im_start|>assistant\n" + AUTO_PREFILL)
    assert describe_interface(cfg, tokenizer).startswith(
        f"LLM interface: prefill {AUTO_PREFILL!r}, one-token"
    )
    # one real step: one generated token, parsed together with the prefill
    episode = rollout(lambda: Corridor(), agent, [0])[0]
    assert all(len(step.generation.completion_ids) == 1 for step in episode.steps)


@pytest.mark.parametrize(
    ("overrides", "prefill", "max_new_tokens", "reason"),
    [
        (["agent.cot=true"], "", None, "chain-of-thought"),
        (["agent.prefill='I move'"], "I move", None, "set by agent.prefill"),  # explicit prefill wins
        (["agent.prefill=''"], "", None, "set by agent.prefill"),
        (["agent.sampling.max_new_tokens=8"], "", 8, "max_new_tokens is set"),
        (["env=tictactoe"], "", None, "not one token"),  # " 1" is two tokens in SmolLM2's vocabulary
    ],
)
def test_auto_interface_keeps_free_text_when_one_token_answers_do_not_fit(
    tiny, overrides, prefill, max_new_tokens, reason
):
    _, tokenizer = tiny
    cfg = _cfg(*overrides)
    names = (
        [str(i) for i in range(1, 10)] if "env=tictactoe" in overrides else ["left", "down", "right", "up"]
    )
    resolved = resolve_interface(cfg.agent, names, tokenizer)
    assert (resolved.prefill, resolved.max_new_tokens) == (prefill, max_new_tokens)
    assert reason in resolved.reason and not resolved.one_token


def test_auto_interface_checks_the_action_names_of_every_probe_reset(tiny):
    """The bandit draws its button colours per seed; some are several tokens ("magenta"), so one-token
    answers would be invalid in those episodes: auto keeps free text although the names at
    construction are all single tokens."""
    _, tokenizer = tiny
    cfg = _cfg("env=bandit")
    names = env_action_names(cfg)
    assert len(names) > cfg.env.arms  # more names over the resets than one env shows
    first = make_env("bandit").action_names
    assert all(single_token_after(tokenizer, AUTO_PREFILL, name) for name in first)
    resolved = resolve_interface(cfg.agent, names, tokenizer)
    assert resolved.prefill == "" and not resolved.one_token and "not one token" in resolved.reason


def test_auto_interface_without_a_tokenizer_is_free_text():
    resolved = resolve_interface(_cfg().agent, ["left", "right"], None)
    assert resolved.prefill == "" and resolved.max_new_tokens is None


def test_cot_never_gets_one_token_answers(tiny):
    model, tokenizer = tiny
    agent = build_llm_agent(_cfg("agent.cot=true"), model=model, tokenizer=tokenizer)
    assert agent.interface.prefill == "" and agent.sampling.max_new_tokens == 256


def test_frozenlake_learn_preset_keeps_its_interface(tiny):
    model, tokenizer = tiny
    agent = build_llm_agent(_cfg("experiment=frozenlake_learn"), model=model, tokenizer=tokenizer)
    assert agent.interface.prefill == "I move" and agent.sampling.max_new_tokens == 1


def test_single_token_after(tiny):
    _, tokenizer = tiny
    assert single_token_after(tokenizer, "I move", "left")
    assert single_token_after(tokenizer, "<action>", "left")  # no space after a tag
    assert not single_token_after(tokenizer, "I move", "leftwards and onwards")


def test_format_prompt_preview(tiny):
    text = format_prompt_preview(_cfg("agent.prefill='<action>'"))
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n<action>")
    assert "Observation:\n" in text and "Answer with one action as <action>NAME</action>." in text


def test_config_show_prompt_prints_the_exact_prompt():
    from typer.testing import CliRunner

    from agentrl.cli import app

    result = CliRunner().invoke(
        app, ["config", "env=frozenlake", "model=tiny-random", "agent.prefill='I move'", "--show-prompt"]
    )
    assert result.exit_code == 0, result.output
    prompt, mode = result.output.split("prompt", 1)[-1].split("answer mode", 1)
    assert "Frozen" in prompt and "Valid actions: left, down, right, up" in prompt
    assert prompt.rstrip("─ \n").endswith("I move")  # the assistant turn starts with the prefill
    assert "I move" in mode


# ---- strict parsing under `agentrl train` -----------------------------------------------------------------
@pytest.mark.parametrize("lenient", [False, True])
def test_training_parses_strictly_unless_lenient_is_set_and_logged(tmp_path, monkeypatch, caplog, lenient):
    """A policy whose every answer names a move outside the tag: invalid in training by default; with
    agent.lenient=true valid, and the run's log says so at the start. untagged_rate counts it both ways."""
    import json
    import logging

    from agentrl.agents.backends import HFBackend
    from agentrl.trainers.multistep import train_llm

    def untagged(self, prompts, sampling, *, seed=None):
        ids = self.tokenizer(" I go right", add_special_tokens=False).input_ids
        return [(ids, [-1.0] * len(ids)) for _ in prompts]

    monkeypatch.setattr(HFBackend, "generate", untagged)
    overrides = [
        "task=train",
        "algo=msgrpo",
        "model=tiny-random",
        "agent.prefill=''",
        "algo.iterations=1",
        "algo.group_size=2",
        "algo.groups_per_iteration=1",
        "algo.gradient_accumulation_steps=1",
        "algo.eval_before=false",
        "algo.save_final=false",
        "eval.episodes=1",
    ]
    if lenient:
        overrides.append("agent.lenient=true")
    with caplog.at_level(logging.WARNING, logger="agentrl"):
        result = train_llm(compose_config(overrides), tmp_path, env_factory)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["train/untagged_rate"] == 1.0 and result.metrics["untagged_rate"] == 1.0
    assert row["train/invalid_rate"] == (0.0 if lenient else 1.0)
    assert result.metrics["invalid_rate"] == (0.0 if lenient else 1.0)
    warned = [r for r in caplog.records if "agent.lenient=true" in r.getMessage()]
    assert len(warned) == (1 if lenient else 0)
    assert not warned or warned[0].levelno == logging.WARNING
