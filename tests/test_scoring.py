"""TWOSOME's decision rule (agents/scoring.py): candidate scores against a brute-force forward, the
normalised action policy, greedy and sampled choices, gradients, and `agent.decision=score` end to end."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from agentrl.agents.backends import HFBackend, SamplingConfig
from agentrl.agents.llm import LLMAgent, TextInterface, build_llm_agent, resolve_interface
from agentrl.agents.scoring import (
    candidate_logps,
    candidate_text,
    choose,
    normalizers,
    score_candidates,
    twosome_log_policy,
    word_count,
)
from agentrl.cli import app
from agentrl.config import compose_config
from agentrl.envs import make_env
from agentrl.errors import ConfigError
from agentrl.models import load_model
from agentrl.types import StepContext

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")


def _brute_force(model, prompt: list[int], candidate: list[int]) -> list[float]:
    """Per-token log-probs of `candidate` after `prompt` from one plain forward of the concatenation."""
    ids = torch.tensor([prompt + candidate])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    rows = log_probs[len(prompt) - 1 : -1]
    return rows.gather(-1, torch.tensor(candidate)[:, None]).squeeze(-1).tolist()


def test_scores_equal_a_brute_force_forward_per_candidate(tiny):
    model, _ = tiny
    model.eval()
    head = list(range(100, 130))  # a common head of 30 tokens: runs once as the shared prefix
    prompts = [head + [7, 8, 9], head + [11], head + [7, 8, 9]]  # a repeated prompt runs once
    candidates = [[[5], [6, 7, 8], [300, 301]], [[42, 43, 44, 45]], [[9, 9]]]
    with torch.no_grad():
        scores = score_candidates(model, prompts, candidates, pad_id=0)
    assert [len(s) for s in scores] == [3, 1, 1]
    for prompt, group, scored in zip(prompts, candidates, scores, strict=True):
        for candidate, score in zip(group, scored, strict=True):
            exact = _brute_force(model, prompt, candidate)
            assert len(score.token_logprobs) == len(candidate)
            assert np.allclose(score.token_logprobs, exact, atol=1e-5)
            assert score.loglik == pytest.approx(sum(exact), abs=1e-5)
            assert score.loglik < 0


def test_word_normalised_policy_on_hand_made_numbers():
    logliks = [-2.0, -6.0, -3.0]
    words = [word_count(a) for a in ["left", "go to the door", "pick up"]]
    assert words == [1, 4, 2]
    got = twosome_log_policy(logliks, words)
    scaled = np.array([-2.0, -1.5, -1.5])  # log L / n: the long action is no longer the least likely
    expected = scaled - np.log(np.exp(scaled).sum())
    assert np.allclose(got.numpy(), expected, atol=1e-12)
    assert np.exp(got.numpy()).sum() == pytest.approx(1.0)
    # temperature divides once more; the normalisers of the other schemes
    assert np.allclose(
        twosome_log_policy(logliks, words, temperature=0.5).numpy(),
        torch.log_softmax(torch.tensor(scaled) / 0.5, 0),
    )
    assert normalizers(["go left", "up"], [3, 2], "word") == [2, 1]
    assert normalizers(["go left", "up"], [3, 2], "token") == [3, 2]
    assert normalizers(["go left", "up"], [3, 2], "none") == [1, 1]
    with pytest.raises(ValueError):
        twosome_log_policy(logliks, [1, 0, 1])


def test_greedy_picks_the_argmax_with_ties_to_the_first():
    rng = np.random.default_rng(0)
    assert choose(np.log([0.2, 0.5, 0.3]), 0.0, rng) == 1
    assert choose(np.log([0.4, 0.2, 0.4]), 0.0, rng) == 0


def test_sampling_frequencies_follow_the_softmax():
    probs = np.array([0.6, 0.3, 0.1])
    rng = np.random.default_rng(123)
    counts = Counter(choose(np.log(probs), 1.0, rng) for _ in range(4000))
    freqs = np.array([counts[k] for k in range(3)]) / 4000
    assert np.allclose(freqs, probs, atol=0.03)
    # temperature 0.5 squares and renormalises the probabilities
    sharper = probs**2 / (probs**2).sum()
    counts = Counter(choose(np.log(probs), 0.5, rng) for _ in range(4000))
    assert np.allclose(np.array([counts[k] for k in range(3)]) / 4000, sharper, atol=0.03)


def test_gradients_flow_into_the_model_weights(tiny):
    model, _ = tiny
    model.train()
    model.zero_grad()
    prompts = [[1, 2, 3, 4, 5]]
    names = ["a", "bb cc", "d"]
    candidates = [[[50, 51], [60, 61, 62], [70]]]
    logps, mask = candidate_logps(model, prompts, candidates)
    log_policy = twosome_log_policy(logps.sum(-1), [word_count(n) for n in names])
    assert log_policy.requires_grad and mask.sum().item() == 6
    (-log_policy[1]).backward()  # raise pi(bb cc | s)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    model.zero_grad()
    model.eval()


def _agent(tiny, temperature: float) -> LLMAgent:
    model, tokenizer = tiny
    cfg = compose_config(["model=tiny-random", "env=tictactoe", "agent.decision=score"])
    resolved = resolve_interface(cfg.agent, [], tokenizer)
    assert resolved.prefill == "<action>" and resolved.scored
    interface = TextInterface.from_cfg(cfg.agent, prefill=resolved.prefill)
    backend = HFBackend(model, tokenizer)
    return LLMAgent(interface, backend, SamplingConfig(temperature=temperature), decision="score")


def _contexts(n: int, seed: int = 0) -> list[StepContext]:
    contexts = []
    for k in range(n):
        env = make_env("tictactoe")
        obs, info = env.reset(seed=seed + k)
        contexts.append(StepContext(env, obs, info, [], np.random.default_rng(seed + k), k))
    return contexts


def test_score_decisions_are_valid_and_record_the_chosen_candidate(tiny):
    model, tokenizer = tiny
    agent = _agent(tiny, temperature=0.0)
    contexts = _contexts(2)
    decisions = agent.act(contexts)
    for ctx, decision in zip(contexts, decisions, strict=True):
        gen = decision.generation
        valid = ctx.info.get("valid_actions") or ctx.env.valid_actions()
        assert decision.valid and decision.penalty == 0
        assert gen.prompt_text.endswith("<action>") and set(gen.action_probs) == set(valid)
        assert sum(gen.action_probs.values()) == pytest.approx(1.0)
        best = max(valid, key=lambda a: gen.action_probs[a])  # greedy: the first most probable action
        assert ctx.env.action_names[decision.action] == best
        assert gen.completion_text == candidate_text(best, "action")
        assert gen.completion_ids == tokenizer(gen.completion_text, add_special_tokens=False).input_ids
        assert np.allclose(gen.logprobs, _brute_force(model, gen.prompt_ids, gen.completion_ids), atol=1e-5)
    # sampling uses the episodes' generators: same seeds, same choices
    sampled = [_agent(tiny, temperature=1.0).act(_contexts(4, seed=7)) for _ in range(2)]
    assert [d.action for d in sampled[0]] == [d.action for d in sampled[1]]


def test_score_needs_the_hf_backend(tiny):
    cfg = compose_config(["model=openai", "model.base_url=http://127.0.0.1:9/v1", "agent.decision=score"])
    with pytest.raises(ConfigError, match="decision=score needs model.backend=hf"):
        build_llm_agent(cfg)
    with pytest.raises(ConfigError, match="cot"):
        compose_config(["agent.decision=score", "agent.cot=true"])


def test_eval_cli_with_scored_decisions_is_never_invalid(run_dir):
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "env=tictactoe",
            "agent=llm",
            "agent.decision=score",
            "agent.sampling.temperature=1.0",
            "model=tiny-random",
            "eval.episodes=2",
            f"hydra.run.dir={run_dir}",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads((run_dir / "eval.json").read_text())
    assert metrics["episodes"] == 2 and metrics["invalid_rate"] == 0.0
    rows = [json.loads(line) for line in (run_dir / "transcripts.jsonl").read_text().splitlines()]
    assert rows and all(r["valid"] and r["completion"] == f"{r['action']}</action>" for r in rows)


@pytest.mark.parametrize(
    ("prefill", "expected"),
    [("auto", "<action>"), ("''", "<action>"), ("'Move: '", "Move: <action>"), ("'<action>'", "<action>")],
)
def test_scored_prefill_opens_the_answer_tag_once(prefill, expected):
    # experiment=kitchen_learn prefills "<action>" for its sampled algorithms; algo=twosome scores after it
    cfg = compose_config(
        ["model=tiny-random", "env=tictactoe", "agent.decision=score", f"agent.prefill={prefill}"]
    )
    assert resolve_interface(cfg.agent, [], None).prefill == expected
