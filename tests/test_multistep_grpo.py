"""The MS-GRPO trainer: its pure helpers, a 2-iteration tiny-random run, and (slow) a learning check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from agentrl.types import StepSample
from agentrl.envs import ENV_SPECS, EnvSpec, make_env
from agentrl.envs.base import TextEnv
from agentrl.trainers.multistep_grpo import (
    newest_checkpoint,
    pack_samples,
    random_start_env,
    split_even,
    train_msgrpo,
    training_seed,
)

CONF = Path(__file__).resolve().parents[1] / "agentrl" / "conf"


def make_cfg(model: str = "tiny-random", env: dict | None = None, **algo: Any) -> Any:
    """A training config from the shipped yaml files (env, model, algo) plus test overrides."""
    cfg = OmegaConf.create(
        {
            "seed": 0,
            "task": "train",
            "env": env or OmegaConf.load(CONF / "env" / "frozenlake.yaml"),
            "model": OmegaConf.load(CONF / "model" / f"{model}.yaml"),
            "agent": {"name": "llm", "prefill": "<action>", "sampling": {"max_new_tokens": 4}},
            "algo": OmegaConf.load(CONF / "algo" / "msgrpo.yaml"),
            "eval": {"episodes": 2, "seed_offset": 1000000, "lockstep": True, "transcripts": True},
        }
    )
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"algo.{k}={v}" for k, v in algo.items()]))


# ---- helpers -------------------------------------------------------------------------------------------
def test_split_even_keeps_every_row():
    rows = list(range(10))
    chunks = split_even(rows, 4)
    assert [len(c) for c in chunks] == [3, 3, 2, 2]
    assert sum(chunks, []) == rows
    assert split_even([1], 3) == [[1], [], []]


def test_pack_samples_pads_prompts_left_and_completions_right():
    samples = [
        StepSample([1, 2, 3], [4], [-0.1], 0.5, 0, 0),
        StepSample([5], [6, 7, 8], [-0.2, -0.3, -0.4], -1.0, 1, 0),
    ]
    batch = pack_samples(samples, pad_id=0, device="cpu", with_old_logprobs=True)
    assert batch["prompt_ids"].tolist() == [[1, 2, 3], [0, 0, 5]]
    assert batch["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch["completion_ids"].tolist() == [[4, 0, 0], [6, 7, 8]]
    assert batch["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 1]]
    assert batch["advantages"].tolist() == [0.5, -1.0]
    assert batch["old_per_token_logps"][1].tolist() == pytest.approx([-0.2, -0.3, -0.4])


def test_training_seeds_are_deterministic_distinct_and_below_eval_range():
    seeds = {training_seed(0, it, g) for it in range(50) for g in range(8)}
    assert len(seeds) == 400 and max(seeds) < 1_000_000
    assert training_seed(3, 7, 1) == training_seed(3, 7, 1) != training_seed(4, 7, 1)


def test_newest_checkpoint_ignores_incomplete_and_staging_dirs(tmp_path):
    for name in ("checkpoint-2", "checkpoint-10", "checkpoint-11", ".staging-1"):
        (tmp_path / name).mkdir()
    for name in ("checkpoint-2", "checkpoint-10", ".staging-1"):
        (tmp_path / name / "trainer_state.json").write_text("{}")
    assert newest_checkpoint(tmp_path).name == "checkpoint-10"  # checkpoint-11 has no trainer_state.json
    assert newest_checkpoint(tmp_path / "checkpoint-2") is None


def test_random_start_curriculum_shares_start_within_a_seed_and_varies_across_seeds():
    make = random_start_env(lambda: make_env("frozenlake"), probability=1.0)
    starts = {}
    for seed in range(20):
        first = make().reset(seed=seed)[1]["state"]
        again = make().reset(seed=seed)[1]["state"]
        assert (first["row"], first["col"]) == (again["row"], again["col"])
        starts[seed] = (first["row"], first["col"])
    assert len(set(starts.values())) > 3
    holes = {tuple(h) for h in make_env("frozenlake").state()["holes"]}
    assert not set(starts.values()) & holes
    plain = make_env("frozenlake").reset(seed=5)[1]["state"]
    assert (plain["row"], plain["col"]) == (0, 0)  # the standard task is untouched


# ---- a short real run ----------------------------------------------------------------------------------
def test_train_two_iterations_with_tiny_random(tmp_path, monkeypatch):
    from agentrl.agents.backends import HFBackend

    torch.manual_seed(0)
    steps = []  # the rollout backend must hear of every optimizer step (its caches hold old outputs)
    real_changed = HFBackend.weights_changed
    monkeypatch.setattr(HFBackend, "weights_changed", lambda self: steps.append(1) or real_changed(self))
    # invalid answers -> a random legal move, so returns vary inside a group and an update really happens
    cfg = make_cfg(
        iterations=2,
        group_size=4,
        groups_per_iteration=2,
        eval_every=1,
        checkpoint_every=1,
        gradient_accumulation_steps=2,
        periodic_eval_episodes=1,
        learning_rate=1e-3,
    )
    cfg.agent.invalid_rule = "random"
    result = train_msgrpo(cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    assert len(steps) == 2
    for key in (
        "train/success_rate",
        "advantage/std",
        "zero_variance_groups",
        "episodes_kept",
        "loss",
        "grad_norm",
        "clip_fraction",
        "rollout_s",
        "update_s",
        "rollout_tokens_per_s",
    ):
        assert key in rows[0], key
    assert "eval/success_rate" in rows[0]
    assert any(r["samples"] > 0 and r["grad_norm"] > 0 for r in rows)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [
        "checkpoint-1"
    ]  # final iteration -> final/
    assert (tmp_path / "checkpoint-1" / "optimizer.pt").is_file()
    assert (tmp_path / "final" / "config.json").is_file()
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert "before" in saved and saved["iterations"] == 2 and saved["success_rate"] == result["success_rate"]

    # resume from checkpoint-1 with 3 iterations in total: iterations 2 and 3 are (re)done, none duplicated
    cfg.algo.iterations = 3
    train_msgrpo(cfg, tmp_path, resume=True)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]


# ---- slow: learning on a one-step, two-action task -------------------------------------------------------
class OneStepEnv(TextEnv):
    """Say `right` (+1) or `left` (0); the episode ends after one move."""

    name = "onestep"
    action_names = ["left", "right"]
    max_steps = 1

    @property
    def instructions(self) -> str:
        return "Choose left or right. Right gives reward 1, left gives 0."

    def render_text(self) -> str:
        return "Pick a side."

    def state(self) -> dict:
        return {}

    def _reset(self, options: dict) -> None:
        pass

    def _step(self, index: int):
        return float(index == 1), True, index == 1, {}


def _prob_of_right(model: Any, tokenizer: Any, cfg: Any, env: TextEnv) -> float:
    """P(completion starts with " right" | the prompt for `env`'s current observation) vs " left" (the
    words after the prefill "I move"): the policy's preference, renormalised over the two moves."""
    from agentrl.agents.llm import TextInterface
    from agentrl.types import StepContext

    interface = TextInterface.from_cfg(cfg.agent)
    ctx = StepContext(env, env.render_text(), {}, [], None, 0)
    ids = tokenizer(interface.render(interface.messages(ctx), tokenizer), add_special_tokens=False).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    moves = [tokenizer(word, add_special_tokens=False).input_ids[0] for word in (" left", " right")]
    return float(torch.softmax(logits[moves], 0)[1])


@pytest.mark.slow
def test_policy_learns_the_rewarded_action(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from agentrl.models import load_model

    monkeypatch.setitem(
        ENV_SPECS, "onestep", EnvSpec("onestep", "agentrl/OneStep-v0", f"{__name__}:OneStepEnv", {}, "test")
    )
    torch.manual_seed(0)
    cfg = make_cfg(
        model="smollm2-135m",
        env={"name": "onestep"},
        iterations=5,
        group_size=8,
        groups_per_iteration=2,
        learning_rate=3e-5,
        top_k=5,
        temperature=1.0,
        eval_every=0,
        checkpoint_every=0,
        eval_before=False,
        trainable_layers=4,
        gradient_accumulation_steps=1,
    )
    cfg.agent.prefill = "I move"
    env = OneStepEnv()
    env.reset(seed=0)
    base, tokenizer = load_model(cfg.model)
    before = _prob_of_right(base, tokenizer, cfg, env)
    train_msgrpo(cfg, tmp_path)
    trained, _ = load_model({**OmegaConf.to_container(cfg.model), "name_or_path": str(tmp_path / "final")})
    after = _prob_of_right(trained, tokenizer, cfg, env)
    assert after > before + 0.1, (before, after)


class TwoRoomsEnv(TextEnv):
    """Two moves, one in each room (in random order): `left` pays 1 in room A, `right` in room B.
    Success is both right; a policy that ignores the observation never succeeds. Every episode visits
    both rooms, so each group's gradient weighs them equally."""

    name = "tworooms"
    action_names = ["left", "right"]
    max_steps = 2

    @property
    def instructions(self) -> str:
        return "You are in a room. Choose left or right. One of them gives reward 1."

    def render_text(self) -> str:
        return f"You are in room {self.room}."

    def state(self) -> dict:
        return {"room": self.room}

    def _reset(self, options: dict) -> None:
        self.room = "AB"[int(self.np_random.integers(2))]
        self.moves, self.wins = 0, 0

    def _step(self, index: int):
        won = index == (0 if self.room == "A" else 1)
        self.moves += 1
        self.wins += int(won)
        self.room = "B" if self.room == "A" else "A"
        done = self.moves == 2
        return float(won), done, done and self.wins == 2, {}


@pytest.mark.slow
def test_policy_becomes_state_dependent(tmp_path, monkeypatch):
    """The failure mode of the first FrozenLake attempts: one move on every cell. With every layer
    trainable and one-token answers (as in the frozenlake_learn preset) the embedded model learns a
    different move per observation, and the rollouts follow the updated weights. lr 1e-5: at 3e-5 this
    tiny task collapsed to one move within 2 iterations (the invalid-answer penalty rewards whichever
    valid word is commonest, in both rooms); measured here: training success 0.22 -> 0.97 in 25
    iterations, ~90 s on one thread."""
    pytest.importorskip("gguf")
    from agentrl.models import load_model

    monkeypatch.setitem(
        ENV_SPECS,
        "tworooms",
        EnvSpec("tworooms", "agentrl/TwoRooms-v0", f"{__name__}:TwoRoomsEnv", {}, "test"),
    )
    torch.manual_seed(0)
    cfg = make_cfg(
        model="smollm2-135m",
        env={"name": "tworooms"},
        iterations=25,
        group_size=8,
        groups_per_iteration=4,
        learning_rate=1e-5,
        top_k=5,
        temperature=1.0,
        eval_every=0,
        checkpoint_every=0,
        eval_before=False,
        gradient_accumulation_steps=1,
    )
    cfg.agent.prefill = "I move"
    cfg.agent.sampling.max_new_tokens = 1

    def p_correct(model: Any, tokenizer: Any) -> dict[str, float]:
        out = {}
        for room in "AB":
            env = TwoRoomsEnv()
            env.reset(seed=0)
            env.room = room
            right = _prob_of_right(model, tokenizer, cfg, env)
            out[room] = right if room == "B" else 1.0 - right
        return out

    base, tokenizer = load_model(cfg.model)
    before = p_correct(base, tokenizer)
    train_msgrpo(cfg, tmp_path)
    trained, _ = load_model({**OmegaConf.to_container(cfg.model), "name_or_path": str(tmp_path / "final")})
    after = p_correct(trained, tokenizer)
    assert min(after.values()) > 0.8, (before, after)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/success_rate"] > 0.8, [r["train/success_rate"] for r in rows]


def test_completion_logprobs_match_trl_fused_head():
    """Our CPU shortcut (LM head on the completion positions only) equals a plain full-logits forward
    exactly, and TRL's fused tiled head up to that kernel's own rounding (~1e-3 on CPU)."""
    from datasets import Dataset
    from trl import GRPOConfig

    from agentrl.models import load_model
    from agentrl.trainers.multistep_grpo import _trainer_class

    model, tokenizer = load_model(OmegaConf.load(CONF / "model" / "tiny-random.yaml"), for_training=True)
    args = GRPOConfig(
        output_dir="/tmp/unused",
        per_device_train_batch_size=2,
        num_generations=2,
        use_cpu=True,
        report_to="none",
        temperature=1.3,
        max_steps=1,
        activation_checkpointing=False,
    )
    trainer = _trainer_class()(
        model=model,
        reward_funcs=[lambda **kw: [0.0]],
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": ["x", "y"]}),
        iteration_fn=lambda i: ([], {}),
    )
    ids = torch.randint(0, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ours, ours_entropy, _ = trainer._get_per_token_logps_and_entropies(
        model, ids, mask, 4, compute_entropy=True
    )
    parent = super(type(trainer), trainer)._get_per_token_logps_and_entropies
    theirs, their_entropy, _ = parent(model, ids, mask, 4, compute_entropy=True)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float() / 1.3, -1)
    exact = full[:, -5:-1].gather(-1, ids[:, -4:, None]).squeeze(-1)
    assert ours.shape == theirs.shape == (3, 4)
    assert torch.allclose(ours, exact, atol=1e-5)
    assert torch.allclose(ours, theirs, atol=5e-3)
    assert torch.allclose(ours_entropy, their_entropy, atol=5e-3)


def test_shared_prefix_logps_equal_per_row_forward_values_and_gradients():
    from agentrl.models import load_model

    model, _ = load_model(OmegaConf.load(CONF / "model" / "tiny-random.yaml"), for_training=True)
    system = list(range(100, 120))  # a common prefix long enough for its own pass (MIN_SHARED_PREFIX)
    prompts = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [9, 10]]  # 2 distinct prompts
    check_rows(model, prompts)
    check_rows(model, [system + p for p in prompts])
    check_rows(model, [system + p for p in prompts[:1]])  # one row only


def check_rows(model: Any, prompts: list[list[int]]) -> None:
    from agentrl.trainers.multistep_grpo import shared_prefix_logps

    model.zero_grad()
    completions = [[11, 12, 13], [14, 15], [16, 17, 18], [11], [19, 20, 21]][: len(prompts)]
    samples = [
        StepSample(p, c, None, 1.0, i, 0) for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    batch = pack_samples(samples, pad_id=0, device="cpu")
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width = batch["completion_ids"].size(1)
    logps, entropy = shared_prefix_logps(model, ids, mask, width, temperature=0.7, compute_entropy=True)
    loss = (logps * batch["completion_mask"]).sum()
    loss.backward()
    ours_grad = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    reference = 0.0
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float() / 0.7
        row_logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
        assert torch.allclose(logps[row, : len(c)], row_logps, atol=1e-5), row
        reference = reference + row_logps.sum()
    reference.backward()
    for name, param in model.named_parameters():
        if param.grad is not None:
            assert torch.allclose(ours_grad[name], param.grad, rtol=1e-3, atol=1e-4), (
                name,
                (ours_grad[name] - param.grad).abs().max(),
            )
    assert entropy.shape == logps.shape


def test_shared_prefix_backend_matches_hf_backend():
    from agentrl.agents.backends import HFBackend, SamplingConfig
    from agentrl.models import load_model
    from agentrl.trainers.multistep_grpo import shared_prefix_backend

    model, tokenizer = load_model(OmegaConf.load(CONF / "model" / "tiny-random.yaml"))
    plain = HFBackend(model, tokenizer)
    shared = shared_prefix_backend(plain)
    system = list(range(100, 120))
    prompts = [system + p for p in ([5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [5, 6, 7, 8], [11, 12, 13])]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=5)
    expected, got = plain.generate(prompts, greedy), shared.generate(prompts, greedy)
    for (ids_a, lp_a), (ids_b, lp_b) in zip(expected, got, strict=True):
        assert ids_a == ids_b
        assert lp_a == pytest.approx(lp_b, abs=1e-4)
    # sampling: each duplicate row samples on its own; log-probs are log_softmax(logits / T) of the token
    hot = SamplingConfig(temperature=1.5, max_new_tokens=3, top_k=50)
    rows = shared.generate(prompts * 4, hot, seed=1)
    assert len({tuple(ids) for ids, _ in rows[::5]}) > 1  # copies of prompt 0 differ
    ids, lps = rows[1]
    with torch.no_grad():
        row = prompts[1] + ids
        logits = model(input_ids=torch.tensor([row])).logits[0, len(prompts[1]) - 1 : -1].float() / 1.5
    reference = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
    assert lps == pytest.approx(reference.tolist(), abs=1e-4)
    assert shared.generate(prompts, hot, seed=3) == shared.generate(prompts, hot, seed=3)


def test_one_token_answers_reuse_logits_until_the_weights_change(monkeypatch):
    from agentrl.agents.backends import HFBackend, SamplingConfig
    from agentrl.models import load_model
    from agentrl.trainers import multistep_grpo

    model, tokenizer = load_model(OmegaConf.load(CONF / "model" / "tiny-random.yaml"))
    plain = HFBackend(model, tokenizer)
    shared = multistep_grpo.shared_prefix_backend(plain)
    system = list(range(100, 120))
    prompts = [system + p for p in ([5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [11, 12, 13])]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=1)
    for (ids_a, lp_a), (ids_b, lp_b) in zip(
        plain.generate(prompts, greedy), shared.generate(prompts, greedy), strict=True
    ):
        assert ids_a == ids_b and len(ids_b) == 1
        assert lp_a == pytest.approx(lp_b, abs=1e-4)

    runs = []
    real = multistep_grpo.prefill_shared
    monkeypatch.setattr(
        multistep_grpo,
        "prefill_shared",
        lambda m, p, pad, prefix=None: runs.append(len(p)) or real(m, p, pad, prefix),
    )
    hot = SamplingConfig(temperature=1.0, max_new_tokens=1, top_k=5)
    first = shared.generate(prompts * 8, hot, seed=2)
    assert runs == []  # every distinct prompt was already computed under these weights
    assert len({tuple(ids) for ids, _ in first[::4]}) > 1  # copies still sample on their own
    shared.generate([system + [14, 15]] + prompts, hot, seed=2)
    assert runs == [1]  # only the new prompt ran, on top of the kept KV states of the shared head
    [(ids_a, lp_a)] = plain.generate([system + [16, 17]], greedy)
    [(ids_b, lp_b)] = shared.generate([system + [16, 17]], greedy)
    assert ids_a == ids_b and lp_a == pytest.approx(lp_b, abs=1e-4)
    with torch.no_grad():
        next(model.parameters()).add_(0.5)  # an in-place change moves the version counters
    shared.generate(prompts, greedy)
    assert runs[-1] == 3  # all distinct prompts recomputed
    # torch's fused AdamW (the HF Trainer's CPU default) updates in place without moving version
    # counters: the trainer says so through weights_changed()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    model(input_ids=torch.tensor([prompts[0]])).logits.sum().backward()
    optimizer.step()
    runs.clear()
    shared.generate(prompts, greedy)
    assert runs == []  # not detectable from the parameters alone
    shared.weights_changed()
    after = shared.generate(prompts, greedy)
    assert runs == [3]
    fresh = HFBackend(model, tokenizer).generate(prompts, greedy)
    assert [lp[0] for _, lp in after] == pytest.approx([lp[0] for _, lp in fresh], abs=1e-4)
    assert [ids for ids, _ in after] == [ids for ids, _ in fresh]


def test_ctrl_c_saves_a_checkpoint_then_resume_continues(tmp_path, monkeypatch):
    from agentrl.trainers import multistep_grpo

    calls = {"n": 0}
    real_rollout = multistep_grpo.rollout

    def interrupted_rollout(*args: Any, **kwargs: Any):
        calls["n"] += 1
        if calls["n"] == 3:  # during the third iteration's rollout
            raise KeyboardInterrupt
        return real_rollout(*args, **kwargs)

    monkeypatch.setattr(multistep_grpo, "rollout", interrupted_rollout)
    cfg = make_cfg(
        iterations=5,
        group_size=2,
        groups_per_iteration=1,
        eval_every=0,
        checkpoint_every=0,
        eval_before=False,
        gradient_accumulation_steps=1,
        save_final=False,
    )
    cfg.agent.invalid_rule = "random"
    with pytest.raises(KeyboardInterrupt):
        train_msgrpo(cfg, tmp_path)
    assert newest_checkpoint(tmp_path).name == "checkpoint-2"
    monkeypatch.setattr(multistep_grpo, "rollout", real_rollout)
    cfg.algo.iterations = 3
    train_msgrpo(cfg, tmp_path, resume=True)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3]
