"""The LLM trainer: its pure helpers, what one update does to the weights, a 2-iteration tiny-random run
through composed configs, its callbacks, and (slow) learning checks."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from helpers import WeightCasts, fast_paths, interrupt_rollout

from agentrl.config import compose_config, typed
from agentrl.envs import env_factory
from agentrl.envs.base import TextEnv
from agentrl.errors import ConfigError
from agentrl.runs.runlog import checkpoint_problem, newest_checkpoint
from agentrl.trainers.grpo_trainer import MultiStepTrainer
from agentrl.trainers.iteration import training_seed
from agentrl.trainers.multistep import train_llm
from agentrl.trainers.packing import pack_samples, split_even
from agentrl.trainers.settings import grpo_config
from agentrl.trainers.signals import TrainingInterrupted
from agentrl.types import StepSample


def make_cfg(*overrides: str, model: str = "tiny-random") -> Any:
    """A composed training config: MS-GRPO on FrozenLake with the tiny random model by default."""
    return compose_config(
        [
            "task=train",
            "algo=msgrpo",
            f"model={model}",
            "agent.prefill='<action>'",
            "agent.sampling.max_new_tokens=4",
            "eval.episodes=2",
            *overrides,
        ]
    )


def factory_for(env_cls: type[TextEnv]) -> Any:
    """An env factory for `train_llm` that builds `env_cls` whatever the composed config's env is: the
    trainer makes every env, training and evaluation, through the factory it is given."""
    return lambda env_cfg: env_cls


def metrics_rows(run_dir: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


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


def test_pack_samples_per_token_advantages():
    samples = [StepSample([1], [4, 5], None, [0.5, -0.5], 0, 0), StepSample([2], [6], None, 2.0, 1, 0)]
    batch = pack_samples(samples, pad_id=0, device="cpu")
    assert batch["advantages"].tolist() == [[0.5, -0.5], [2.0, 0.0]]


def test_training_seeds_are_deterministic_distinct_and_below_eval_range():
    seeds = {training_seed(0, it, g) for it in range(20) for g in range(8)}
    assert len(seeds) == 160 and max(seeds) < 1_000_000
    assert training_seed(3, 4, 5) == training_seed(3, 4, 5) != training_seed(4, 4, 5)


# ---- one update: what it does to the weights -----------------------------------------------------------
def one_update(
    tmp_path: Any,
    samples: list[StepSample],
    *overrides: str,
    first: list[StepSample] | None = None,
    max_batch_tokens: int | str | None = None,
) -> tuple[Any, dict, dict]:
    """Run one optimizer step on fixed rows (after one on `first`, when given); return (model, weights
    before, weights after) of that step."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from agentrl.models import load_model

    iterations = 1 if first is None else 2
    cfg = make_cfg(
        f"algo.iterations={iterations}",
        "algo.learning_rate=1e-3",
        "algo.gradient_accumulation_steps=2",
        *overrides,
    )
    algo = typed(cfg.algo)
    torch.manual_seed(0)
    # fp32 master weights, as train_llm loads them (model.dtype=auto would be bf16 on a GPU)
    model, tokenizer = load_model(dataclasses.replace(typed(cfg.model), dtype="float32"), for_training=True)
    precision = {"auto": "fp32"}.get(algo.precision, algo.precision)
    if precision == "bf16-pure":
        model = model.to(torch.bfloat16)
    args = grpo_config(algo, tmp_path, model.device.type, 0, precision)
    trainer = MultiStepTrainer(
        model=model,
        reward_funcs=[lambda **kw: [0.0]],
        args=args,
        processing_class=tokenizer,
        collect=lambda iteration: (list(samples if iteration == iterations - 1 else first), {}),
        max_batch_tokens=max_batch_tokens,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    weights: list[dict[str, torch.Tensor]] = []

    class Snapshot(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == iterations - 1:
                weights.append(
                    {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
                )

    trainer.add_callback(Snapshot())
    trainer.train()
    after = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return model, weights[0], after


PROMPT = list(range(100, 130))


def rows(advantages: list[float]) -> list[StepSample]:
    completions = [[11, 12, 13], [14, 15], [16], [17, 18]]
    return [StepSample(PROMPT + [k], completions[k % 4], None, a, k, 0) for k, a in enumerate(advantages)]


def completion_logp(model: Any, sample: StepSample) -> float:
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1 : -1].float()
    targets = torch.tensor(sample.completion_ids)[:, None]
    return float(torch.log_softmax(logits, -1).gather(-1, targets).sum())


def test_update_with_nonzero_advantages_changes_every_trainable_parameter(tmp_path):
    from agentrl.kernels.features import fast_path

    model, before, after = one_update(tmp_path, rows([1.0, -1.0, 0.5, -0.5]))
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert unchanged == []
    # the tied embedding's lookups give sparse gradients where the shared-prefix kernel runs (the CPU),
    # unless AGENTRL_CPU_FEATURES switches them off
    assert model.get_input_embeddings().sparse == (
        model.device.type == "cpu" and fast_path("sparse-embedding")
    )


@pytest.mark.parametrize("tied", [True, False])
def test_sparse_embedding_gradients_give_the_same_dense_gradient(tied, monkeypatch):
    """Two lookups (a shared head and its rows) and the tied LM head: the sparse lookups add into the
    head's dense gradient, equal to the dense lookups' (the fallback, AGENTRL_CPU_FEATURES=
    no-sparse-embedding); an untied or frozen embedding is left alone."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.trainers.grpo_trainer import sparse_embedding_gradients

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )

    def gradients(sparse: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        fast_paths(monkeypatch, *([] if sparse else ["sparse-embedding"]))
        assert sparse_embedding_gradients(model) is (tied and sparse)
        head = model(input_ids=torch.tensor([[1, 2, 3, 2]]), use_cache=True)
        tail = model(input_ids=torch.tensor([[5, 2], [7, 7]]), cache=_expand(head, 2))
        loss = (tail.logits.log_softmax(-1)[..., 3] * torch.tensor([1.0, -0.5])[:, None]).sum()
        loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}

    dense, sparse = gradients(False), gradients(True)
    for name, grad in sparse.items():
        assert grad.layout == torch.strided, name
        torch.testing.assert_close(grad, dense[name], rtol=1e-5, atol=1e-7)
    fast_paths(monkeypatch)
    frozen = LlamaForCausalLM(config)
    frozen.get_input_embeddings().weight.requires_grad_(False)
    assert not sparse_embedding_gradients(frozen) and not frozen.get_input_embeddings().sparse


def _expand(out: Any, rows: int) -> Any:
    cache = out.past_key_values
    cache.batch_repeat_interleave(rows)
    return cache


@pytest.mark.parametrize(("checkpointing", "per_pass"), [(False, [2, 2]), (True, [1, 1])])
def test_auto_budget_splits_plain_forwards_by_padded_tokens_with_the_same_update(
    tmp_path, monkeypatch, checkpointing, per_pass
):
    """Where the shared-prefix kernel does not run (CUDA, several processes) every row runs its whole
    padded prompt with gradients: `algo.max_batch_tokens=auto` cuts a micro-batch into passes whose
    rows x padded width fit the activation budget, and the update equals the unsplit one. Under gradient
    checkpointing a token keeps less for the backward, so the same memory holds more rows a pass."""
    import agentrl.trainers.grpo_trainer as grpo_trainer
    from agentrl.trainers import settings

    gc = (f"algo.gradient_checkpointing={str(checkpointing).lower()}",)
    samples = rows([1.0, -1.0, 0.5, -0.5])
    _, _, whole = one_update(tmp_path / "whole", samples, *gc)
    passes: list[int] = []
    split = grpo_trainer.split_by_tokens

    def counted(*args: Any, **kwargs: Any) -> list:
        parts = split(*args, **kwargs)
        passes.append(len(parts))
        return parts

    monkeypatch.setattr(grpo_trainer, "kernel_applies", lambda device, processes: False)
    monkeypatch.setattr(grpo_trainer, "split_by_tokens", counted)
    monkeypatch.setattr(settings, "auto_token_budget", lambda free, vocab, fraction=0.2: 10**6)
    # room for the activations of one 34-token row a pass (31 prompt + 3 completion), not two; with
    # checkpointing a token costs half as much, room for two
    monkeypatch.setattr(
        settings, "activation_bytes_per_token", lambda model, checkpointing=False: 2 - checkpointing
    )
    monkeypatch.setattr(
        settings, "free_memory_bytes", lambda device: int(100 / settings.AUTO_ACTIVATION_FRACTION)
    )
    monkeypatch.setattr(grpo_trainer, "pending_training_state_bytes", lambda model, optimizer: 0)
    _, _, cut = one_update(tmp_path / "cut", samples, *gc, max_batch_tokens="auto")
    assert passes == per_pass  # two micro-batches of two rows, each one row a pass or both at once
    # Adam's first step moves each element by ~lr (1e-3) whatever its gradient's size, so an element whose
    # gradient is near Adam's eps moves by a rounding-sensitive amount: every element within lr/10, and
    # nearly all within 1e-6
    far = sum(int((~torch.isclose(cut[n], v, rtol=0, atol=1e-6)).sum()) for n, v in whole.items())
    assert far < 1e-4 * sum(v.numel() for v in whole.values()), far
    for name, value in whole.items():
        torch.testing.assert_close(cut[name], value, rtol=0, atol=1e-4)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_tiny_learning_rate_still_moves_the_weights(tmp_path, precision):
    """At the paper's lr of 1e-6 almost every weight element must change: fp32 master weights keep the
    update, also under bf16 autocast. With bf16 weights (bf16-pure) most of it is rounded away."""
    _, before, after = one_update(
        tmp_path, rows([1.0, -1.0, 0.5, -0.5]), "algo.learning_rate=1e-6", f"algo.precision={precision}"
    )
    moved = sum(int((before[n] != after[n]).sum()) for n in before) / sum(t.numel() for t in before.values())
    assert moved > 0.9, moved


@pytest.mark.parametrize(("precision", "autocast"), [("fp32", False), ("bf16-mixed", True)])
def test_bf16_mixed_runs_the_update_under_autocast(tmp_path, monkeypatch, precision, autocast):
    from agentrl.trainers import trainer_logps

    seen = []
    real = trainer_logps.shared_prefix_logps

    def spy(model: Any, *args: Any, **kwargs: Any):
        # inside the model's forward, where accelerate applies autocast
        layer = model.get_decoder().layers[0]
        hook = layer.register_forward_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
        try:
            return real(model, *args, **kwargs)
        finally:
            hook.remove()

    monkeypatch.setattr(trainer_logps, "shared_prefix_logps", spy)
    one_update(tmp_path, rows([1.0, -1.0]), f"algo.precision={precision}")
    assert seen and set(seen) == {autocast}


def test_bf16_weights_lose_tiny_updates(tmp_path):
    _, before, after = one_update(
        tmp_path, rows([1.0, -1.0, 0.5, -0.5]), "algo.learning_rate=1e-6", "algo.precision=bf16-pure"
    )
    moved = sum(int((before[n] != after[n]).sum()) for n in before) / sum(t.numel() for t in before.values())
    assert moved < 0.5, moved


@pytest.mark.parametrize("samples", [[], rows([0.0, 0.0, 0.0])], ids=["no-rows", "zero-advantages"])
def test_update_with_zero_advantages_changes_no_parameter(tmp_path, samples):
    _, before, after = one_update(tmp_path, samples)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed == []


def test_iteration_without_rows_takes_no_step_after_a_real_one(tmp_path):
    """Adam's momentum from the first update must not move the weights in an empty iteration."""
    _, before, after = one_update(tmp_path, [], first=rows([1.0, -1.0, 0.5, -0.5]))
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed == []


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_sets_the_direction_of_the_sampled_actions_logprobs(tmp_path, sign):
    samples = rows([sign] * 4)
    model, before, _ = one_update(tmp_path, samples, "algo.learning_rate=1e-4")
    trained = [completion_logp(model, s) for s in samples]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in before:
                param.copy_(before[name])
    base = [completion_logp(model, s) for s in samples]
    moved = [sign * (t - b) for t, b in zip(trained, base, strict=True)]
    assert all(m > 0 for m in moved), moved


# ---- a short real run ----------------------------------------------------------------------------------
def test_train_two_iterations_with_tiny_random(tmp_path, monkeypatch):
    from agentrl.agents.backends import HFBackend

    torch.manual_seed(0)
    steps = []  # the rollout backend must hear of every optimizer step (its caches hold old outputs)
    real_changed = HFBackend.weights_changed
    monkeypatch.setattr(HFBackend, "weights_changed", lambda self: steps.append(1) or real_changed(self))
    # invalid answers -> a random legal move, so returns vary inside a group and an update really happens
    overrides = [
        "algo.group_size=4",
        "algo.groups_per_iteration=2",
        "algo.eval_every=1",
        "algo.checkpoint_every=1",
        "algo.gradient_accumulation_steps=2",
        "algo.periodic_eval_episodes=1",
        "algo.learning_rate=1e-3",
        "agent.invalid_rule=random",
    ]
    result = train_llm(make_cfg("algo.iterations=2", *overrides), tmp_path, env_factory)
    rows_ = metrics_rows(tmp_path)
    assert [r["iteration"] for r in rows_] == [1, 2]
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
        assert key in rows_[0], key
    assert "eval/success_rate" in rows_[0] and "eval/success_rate" not in rows_[1]  # the last: final eval
    assert any(r["samples"] > 0 and r["grad_norm"] > 0 for r in rows_)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert (tmp_path / "checkpoint-1" / "optimizer.pt").is_file()
    assert json.loads((tmp_path / "checkpoint-1" / "manifest.json").read_text())["optimizer"] is True
    assert (tmp_path / "final" / "config.json").is_file()
    assert not (tmp_path / "eval.json").exists()  # the runner writes eval.json from the result
    assert result.extra["iterations"] == 2 and "before" in result.extra
    assert result.metrics["episodes"] == 2 == len(result.episodes)

    # resume from checkpoint-1 with 3 iterations in total: iterations 2 and 3 are (re)done, none duplicated
    train_llm(make_cfg("algo.iterations=3", *overrides), tmp_path, env_factory, resume=True)
    assert [r["iteration"] for r in metrics_rows(tmp_path)] == [1, 2, 3]


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_kl_to_the_reference_is_logged_and_positive_after_an_update(tmp_path, lora):
    """beta > 0: every row carries reference log-probs (a frozen copy, or the adapter-free base under
    LoRA); the KL is 0 before the first update and positive once the policy has moved."""
    cfg = make_cfg(
        "algo.iterations=2",
        "algo.beta=0.1",
        "algo.learning_rate=1e-2",
        "algo.group_size=4",
        "algo.groups_per_iteration=2",
        "algo.gradient_accumulation_steps=1",
        "algo.eval_before=false",
        "algo.save_final=false",
        "algo.min_informative_groups=1",
        "algo.max_rollout_rounds=4",
        "agent.invalid_rule=random",
        f"model.lora.r={lora}",
    )
    train_llm(cfg, tmp_path, env_factory)
    kl = [r.get("kl") for r in metrics_rows(tmp_path)]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 1e-6, kl


def test_time_limit_stops_after_the_iteration_that_crosses_it(tmp_path):
    cfg = make_cfg(
        "algo.iterations=5",
        "algo.time_limit_minutes=1e-6",
        "algo.group_size=2",
        "algo.groups_per_iteration=1",
        "algo.eval_before=false",
        "algo.gradient_accumulation_steps=1",
        "algo.save_final=false",
    )
    result = train_llm(cfg, tmp_path, env_factory)
    assert [r["iteration"] for r in metrics_rows(tmp_path)] == [1]
    assert result.extra["iterations"] == 1  # the iterations trained, not the 5 asked


def test_a_bf16_mixed_rollout_casts_each_weight_once(tmp_path, monkeypatch):
    """The rollout's lockstep steps are one generation call each; under bf16-mixed the Collector keeps the
    weights' casts for the whole rollout, so each trained weight is cast to bf16 once per iteration's
    rollout, not once per step (that the casts are dropped before the update, whose backward then
    reaches every weight: tests/test_backends.py)."""
    from agentrl.trainers import iteration

    most: list[int] = []
    steps: list[int] = []
    real = iteration.collect_groups

    def spy(make_env: Any, agent: Any, **kwargs: Any):
        with WeightCasts(agent.backend.model) as casts:
            episodes, rounds = real(make_env, agent, **kwargs)
        most.append(casts.most())
        steps.append(max(len(e.steps) for e in episodes))
        return episodes, rounds

    monkeypatch.setattr(iteration, "collect_groups", spy)
    cfg = make_cfg(
        "algo.iterations=1",
        "algo.precision=bf16-mixed",
        "algo.group_size=2",
        "algo.groups_per_iteration=2",
        "algo.gradient_accumulation_steps=1",
        "algo.eval_before=false",
        "algo.save_final=false",
    )
    train_llm(cfg, tmp_path, env_factory)
    assert steps[0] > 1 and most == [1]  # several generation calls, one cast of each weight


def test_a_bf16_mixed_update_casts_each_weight_once_per_micro_batch(tmp_path, monkeypatch):
    """Under bf16-mixed the passes of a split micro-batch, and each pass's prompt and completion forwards,
    share one bf16 cast of each trained weight; the step is the one a cast per forward gives."""
    import trl

    casts: list[int] = []
    passes: list[int] = []
    real_step, real_pass = MultiStepTrainer._training_step, trl.GRPOTrainer.training_step

    def micro_batch(self: Any, *args: Any, **kwargs: Any):
        with WeightCasts(self.model) as counted:
            loss = real_step(self, *args, **kwargs)
        casts.append(counted.most())
        return loss

    def one_pass(self: Any, *args: Any, **kwargs: Any):
        passes.append(1)
        return real_pass(self, *args, **kwargs)

    monkeypatch.setattr(MultiStepTrainer, "_training_step", micro_batch)
    monkeypatch.setattr(trl.GRPOTrainer, "training_step", one_pass)
    samples = rows([1.0, -1.0, 0.5, -0.5])
    _, before, kept = one_update(tmp_path / "kept", samples, "algo.precision=bf16-mixed", max_batch_tokens=8)
    assert casts == [1, 1] and len(passes) == 4  # two micro-batches of two one-row passes
    moved = sum(int((before[n] != kept[n]).sum()) for n in before) / sum(t.numel() for t in before.values())
    assert moved > 0.9, moved

    casts.clear()
    monkeypatch.setattr(MultiStepTrainer, "_shares_weight_casts", lambda self: False)
    _, _, apart = one_update(tmp_path / "apart", samples, "algo.precision=bf16-mixed", max_batch_tokens=8)
    assert min(casts) > 1  # a cast per forward: each pass's prompt and (longer) completion
    # Adam's first step moves each element by about lr times the sign of its gradient; where a use's
    # gradient adds up in bf16 instead of fp32 (prompt and completion in one backward), elements whose
    # gradient is near zero can flip: the steps agree in direction, not bit for bit
    step = lambda after: torch.cat([(after[n] - before[n]).flatten() for n in before])  # noqa: E731
    assert float(torch.nn.functional.cosine_similarity(step(kept), step(apart), dim=0)) > 0.999


def test_training_invalid_penalty_applies_to_rollouts_only(tmp_path, monkeypatch):
    """`algo.invalid_penalty` shapes training rewards; evaluation keeps the agent's own penalty."""
    from agentrl.trainers import iteration

    seen = []
    real = iteration.collect_groups

    def spy(make_env: Any, agent: Any, **kwargs: Any):
        episodes, rounds = real(make_env, agent, **kwargs)
        seen.extend(s.reward - s.env_reward for e in episodes for s in e.steps if not s.valid)
        return episodes, rounds

    monkeypatch.setattr(iteration, "collect_groups", spy)
    cfg = make_cfg(
        "algo.iterations=1",
        "algo.invalid_penalty=-3.0",
        "algo.group_size=2",
        "algo.groups_per_iteration=1",
        "algo.gradient_accumulation_steps=1",
        "algo.save_final=false",
        "agent.invalid_penalty=-1.0",
    )
    result = train_llm(cfg, tmp_path, env_factory)
    assert seen and set(seen) == {-3.0}
    evaluated = [s.reward - s.env_reward for e in result.episodes for s in e.steps if not s.valid]
    assert evaluated and set(evaluated) == {-1.0}


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
def test_policy_learns_the_rewarded_action(tmp_path):
    pytest.importorskip("gguf")
    from agentrl.models import load_model

    torch.manual_seed(0)
    cfg = make_cfg(
        "algo.iterations=5",
        "algo.group_size=8",
        "algo.groups_per_iteration=2",
        "algo.learning_rate=3e-5",
        "algo.top_k=5",
        "algo.temperature=1.0",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
        "algo.eval_before=false",
        "algo.trainable_layers=4",
        "algo.gradient_accumulation_steps=1",
        "agent.prefill='I move'",
        "agent.sampling.max_new_tokens=1",  # one-token answers: the asked format under strict parsing
        model="smollm2-135m",
    )
    env = OneStepEnv()
    env.reset(seed=0)
    base, tokenizer = load_model(cfg.model)
    before = _prob_of_right(base, tokenizer, cfg, env)
    train_llm(cfg, tmp_path, factory_for(OneStepEnv))
    trained, _ = load_model(make_cfg(f"model.name_or_path={tmp_path / 'final'}", model="smollm2-135m").model)
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
@pytest.mark.xfail(
    strict=True,
    reason="trained on its own env, the embedded model collapses to 'left' in both rooms (P(correct) A 0.69 -> "
    "1.00, B 0.31 -> 0.00 in 25 iterations): the state-independent answer of docs/results.md",
)
def test_policy_becomes_state_dependent(tmp_path):
    """Guards against one move on every observation: with every layer trainable and one-token answers
    (as in the frozenlake_learn preset) the embedded model learns a different move per observation, and
    the rollouts follow the updated weights. lr 1e-5, because at 3e-5 this tiny task collapses to one
    move within 2 iterations (the invalid-answer penalty rewards whichever valid word is commonest, in
    both rooms); training success goes from about 0.2 to above 0.9 in 25 iterations."""
    pytest.importorskip("gguf")
    from agentrl.models import load_model

    torch.manual_seed(0)
    cfg = make_cfg(
        "algo.iterations=25",
        "algo.group_size=8",
        "algo.groups_per_iteration=4",
        "algo.learning_rate=1e-5",
        "algo.top_k=5",
        "algo.temperature=1.0",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
        "algo.eval_before=false",
        "algo.gradient_accumulation_steps=1",
        "agent.prefill='I move'",
        "agent.sampling.max_new_tokens=1",
        model="smollm2-135m",
    )

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
    train_llm(cfg, tmp_path, factory_for(TwoRoomsEnv))
    trained, _ = load_model(make_cfg(f"model.name_or_path={tmp_path / 'final'}", model="smollm2-135m").model)
    after = p_correct(trained, tokenizer)
    assert min(after.values()) > 0.8, (before, after)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/success_rate"] > 0.8, [r["train/success_rate"] for r in rows]


def test_ctrl_c_saves_a_checkpoint_then_resume_continues(tmp_path, monkeypatch):
    real_rollout = interrupt_rollout(monkeypatch, 3)  # during the third iteration's rollout
    overrides = [
        "algo.group_size=2",
        "algo.groups_per_iteration=1",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
        "algo.eval_before=false",
        "algo.gradient_accumulation_steps=1",
        "algo.save_final=false",
        "agent.invalid_rule=random",
    ]
    with pytest.raises(TrainingInterrupted) as caught:  # the CLI exits 130, as for a Ctrl-C
        train_llm(make_cfg("algo.iterations=5", *overrides), tmp_path, env_factory)
    assert caught.value.exit_code == 130 and "after iteration 2: checkpoint-2 is saved" in str(caught.value)
    assert newest_checkpoint(tmp_path).name == "checkpoint-2"
    assert checkpoint_problem(tmp_path / "checkpoint-2") is None  # with its manifest
    monkeypatch.setattr("agentrl.rollout.rollout", real_rollout)
    train_llm(make_cfg("algo.iterations=3", *overrides), tmp_path, env_factory, resume=True)
    assert [r["iteration"] for r in metrics_rows(tmp_path)] == [1, 2, 3]


# ---- the token budget: bounded micro-batches, the same gradient ---------------------------------------------
def test_split_by_tokens_keeps_every_row_within_the_budget():
    from agentrl.trainers.packing import split_by_tokens

    samples = [
        StepSample([1] * p, [2] * c, None, [0.5] * c, k, 0, returns=[1.0] * c, old_values=[0.0] * c)
        for k, (p, c) in enumerate([(30, 3), (5, 1), (12, 2), (40, 4), (8, 8)])
    ]
    batch = pack_samples(samples, pad_id=0, device="cpu")
    batch["num_items_in_batch"] = torch.tensor(18.0)
    parts = split_by_tokens(batch, budget=40)
    assert len(parts) > 1
    for part in parts:
        rows, width = part["prompt_ids"].size(0), part["prompt_ids"].size(1) + part["completion_ids"].size(1)
        assert rows == 1 or rows * width <= 40  # a row above the budget is a chunk of its own
        assert part["num_items_in_batch"] is batch["num_items_in_batch"]
    # every row survives, unchanged: the real tokens of each chunk equal the original rows'
    real = [
        (ids[m.bool()].tolist(), cids[cm.bool()].tolist(), adv[cm.bool()].tolist(), ret[cm.bool()].tolist())
        for part in parts
        for ids, m, cids, cm, adv, ret in zip(
            part["prompt_ids"],
            part["prompt_mask"],
            part["completion_ids"],
            part["completion_mask"],
            part["advantages"],
            part["returns"],
            strict=True,
        )
    ]
    assert real == [(s.prompt_ids, s.completion_ids, s.advantage, s.returns) for s in samples]
    assert split_by_tokens(batch, budget=10_000) == [batch]


def test_a_token_budget_gives_the_same_update(tmp_path):
    samples = rows([1.0, -1.0, 0.5, -0.5])
    _, before, whole = one_update(tmp_path / "whole", samples)
    _, _, split = one_update(tmp_path / "split", samples, "algo.max_batch_tokens=40")  # one row per pass
    moved = [n for n in before if not torch.equal(before[n], whole[n])]
    assert moved
    for name in before:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-5)


def test_training_episodes_are_cut_at_algo_max_steps_on_the_same_instances():
    from agentrl.trainers.multistep import _train_env

    cfg = make_cfg("algo.max_steps=2", "algo.curriculum.random_start=0")
    make_train, options = _train_env(cfg, typed(cfg.algo), env_factory)
    train, standard = make_train(), env_factory(cfg.env)()
    assert options is None and (train.max_steps, standard.max_steps) == (2, 8)
    for seed in range(5):  # the maps are the eval env's: drawn solvable within its own 8-move cap
        assert train.reset(seed=seed)[1]["state"]["map"] == standard.reset(seed=seed)[1]["state"]["map"]
    train.reset(seed=0)
    assert [train.step("left")[3] for _ in range(2)] == [False, True]  # truncated after 2 moves
    with pytest.raises(ConfigError, match="algo.max_steps needs an env with a move cap"):
        bandit = make_cfg("env=bandit", "algo.max_steps=2", "algo.curriculum.random_start=0")
        _train_env(bandit, typed(bandit.algo), env_factory)
