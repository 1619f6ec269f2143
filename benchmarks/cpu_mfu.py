"""How close one training iteration comes to this CPU's matmul peak (model FLOPs utilisation, MFU).

1. Peak: torch.matmul FLOP/s in fp32 and bf16 at the model's shapes (SmolLM2-135M: 512 tokens x hidden
   576 -> MLP 1536, 1536 -> 576, 576 -> vocabulary 49152); the best shape is the peak of each dtype.
2. Per preset, one training iteration (`agentrl train experiment=<preset> algo.iterations=1`, no eval
   before, no checkpoints) with every nn.Linear and attention call counted by forward hooks:
   - FLOPs executed: 2 x in x out per row of every linear (2N per token, the LM head only where logits
     are kept), attention 4 x query rows x key length x heads x head size per layer (QK^T and AV, masked
     positions included, as SDPA computes them); a forward with gradients costs twice its FLOPs again in
     the backward (4N per token);
   - tokens run (padding included) and real tokens (attention mask), so padding is visible;
   - how many times the system message (the env's instructions, the same head of every prompt) runs:
     its tokens in every forward row that does not take it from a KV cache;
   - wall and CPU seconds and MFU for the rollout (generation) and the update (old/reference log-probs,
     forward, backward, optimizer) separately; MFU = FLOPs / CPU seconds / peak FLOP/s per CPU-second of
     the precision that ran (CPU time: on a shared machine wall time counts the other processes' turns);
   - with `--profile`, a second iteration under torch.profiler: the top operators by self CPU time, and
     the share of wall time outside torch operators (Python: the env, prompts, sampling loop).

    nice -n 10 .venv/bin/python benchmarks/cpu_mfu.py --threads 1 --presets frozenlake_learn --profile
    .venv/bin/python benchmarks/cpu_mfu.py --threads 2 --profile \\
        --presets frozenlake_learn kitchen_learn snake_learn rlft_tictactoe        # all four (~15 min idle)
    .venv/bin/python benchmarks/cpu_mfu.py --peak-only                              # the matmul peak only

Extra Hydra overrides go after `--` (e.g. `-- algo.precision=bf16-mixed`). Results: `--out` (.json
and .md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

SHAPES = {"mlp_up": (576, 1536), "mlp_down": (1536, 576), "lm_head": (576, 49152)}


# ---- 1. the matmul peak -------------------------------------------------------------------------------
def matmul_peak(rows: int = 512, seconds: float = 1.0) -> dict[str, Any]:
    """GFLOP/s per CPU-second of torch.matmul per dtype and shape (best of timed repeats), and each
    dtype's best. CPU time, not wall time: on a shared machine a process's wall time counts the other
    processes' turns; its CPU time counts only its own (with one thread: the matmul's)."""
    result: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        shapes = {}
        for label, (k, n) in SHAPES.items():
            a, b = torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            torch.matmul(a, b)  # warm-up
            best, spent = float("inf"), 0.0
            while spent < seconds:
                start = time.process_time()
                torch.matmul(a, b)
                took = time.process_time() - start
                best, spent = min(best, took), spent + max(took, 1e-3)
            shapes[label] = round(2 * rows * k * n / max(best, 1e-9) / 1e9, 1)
        result[name] = {"gflops": shapes, "peak_gflops": max(shapes.values())}
    return result


# ---- 2. FLOPs of one iteration --------------------------------------------------------------------------
class FlopCounter:
    """Forward hooks on every nn.Linear and attention module of a model, adding FLOPs and tokens to the
    current phase ("rollout", "update", "eval"); a forward with gradients adds 2x its FLOPs for the
    backward to the update, where every backward runs (a rollout that keeps its forward's graph for the
    update, `algo.rollout_graph`, runs its forward with gradients)."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.flops: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, int] = defaultdict(int)
        self.real_tokens: dict[str, int] = defaultdict(int)
        self.handles: list[Any] = []
        # the system message (the env's instructions) at the head of a prompt: how often it runs
        self.system_tokens: dict[str, int] = defaultdict(int)
        self.system_length = 0
        self.chat_ids: tuple[int, int, int] | None = None  # <|im_start|>, "system", <|im_end|>

    def _add(self, flops: float) -> None:
        self.flops[self.phase] += flops
        if torch.is_grad_enabled():
            self.flops["update"] += 2 * flops

    def attach(self, model: Any, tokenizer: Any = None) -> None:
        if tokenizer is not None and "<|im_start|>" in tokenizer.get_vocab():
            ids = tokenizer.convert_tokens_to_ids(["<|im_start|>", "system", "<|im_end|>"])
            self.chat_ids = tuple(ids)
        config = model.config.get_text_config()
        self.width, self.layers = config.hidden_size, config.num_hidden_layers
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                self.handles.append(module.register_forward_hook(self._linear))
            elif hasattr(module, "embed_tokens") and hasattr(module, "layers"):  # the decoder
                self.handles.append(module.register_forward_pre_hook(self._decoder, with_kwargs=True))

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _linear(self, module: Any, inputs: Any, output: Any) -> None:
        rows = inputs[0].numel() // module.in_features
        self._add(2 * rows * module.in_features * module.out_features)

    def _decoder(self, module: Any, args: Any, kwargs: Any) -> None:
        """Tokens run, real tokens, and attention: each query row against every key (cached ones too)."""
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            return
        batch, queries = ids.shape
        cache = kwargs.get("past_key_values")
        past = int(cache.get_seq_length()) if cache is not None else 0
        self.tokens[self.phase] += ids.numel()
        mask = kwargs.get("attention_mask")
        self.real_tokens[self.phase] += (
            int(mask[:, -queries:].sum()) if mask is not None and mask.dim() == 2 else ids.numel()
        )
        self._add(4 * batch * queries * (past + queries) * self.width * self.layers)
        if past == 0 and self.chat_ids is not None:
            self._count_system(ids, mask)

    def _count_system(self, ids: Any, mask: Any) -> None:
        """Tokens of system messages run in this forward: every row that starts with one (after its left
        padding) runs it again, unless it came from a KV cache."""
        start, system, end = self.chat_ids
        rows = ids.tolist()
        queries = ids.shape[1]  # a mask may also cover cached positions: its last columns are these
        masks = (
            mask[:, -queries:].tolist()
            if mask is not None and mask.dim() == 2
            else [[1] * len(r) for r in rows]
        )
        for row, keep in zip(rows, masks, strict=True):
            real = [t for t, m in zip(row, keep, strict=True) if m]
            if len(real) > 2 and real[0] == start and real[1] == system and end in real:
                length = real.index(end) + 1
                self.system_tokens[self.phase] += length
                self.system_length = max(self.system_length, length)


@contextlib.contextmanager
def phases(counter: FlopCounter, clock: dict[str, float]):
    """Attribute FLOPs and seconds to the rollout (collect_groups), evaluation and the update (the rest
    of the trainer's step), by wrapping those functions for the duration."""
    import agentrl.evaluation as evaluation
    import agentrl.trainers.iteration as iteration
    from agentrl.trainers.grpo_trainer import MultiStepTrainer

    originals = {
        "collect": iteration.collect_groups,
        "evaluate": evaluation.evaluate,
        "train": MultiStepTrainer.train,
        "init": MultiStepTrainer.__init__,
    }

    def timed(clock_key: str, phase: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            previous, start, cpu = counter.phase, time.perf_counter(), time.process_time()
            counter.phase = phase
            try:
                return fn(*args, **kwargs)
            finally:
                clock[clock_key] += time.perf_counter() - start
                clock[f"{clock_key}_cpu"] += time.process_time() - cpu
                counter.phase = previous

        return wrapper

    from agentrl.agents.backends.hf import HFCopyBackend

    originals["copy"] = HFCopyBackend.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        originals["init"](self, *args, **kwargs)
        counter.attach(self.model, self.processing_class)

    def copy_init(self: Any, *args: Any, **kwargs: Any) -> None:  # algo.rollout_dtype: its own model
        originals["copy"](self, *args, **kwargs)
        counter.attach(self.model, self.tokenizer)

    iteration.collect_groups = timed("rollout", "rollout", originals["collect"])
    evaluation.evaluate = timed("eval", "eval", originals["evaluate"])
    MultiStepTrainer.train = timed("train", "update", originals["train"])
    MultiStepTrainer.__init__ = init
    HFCopyBackend.__init__ = copy_init
    try:
        yield
    finally:
        iteration.collect_groups = originals["collect"]
        evaluation.evaluate = originals["evaluate"]
        MultiStepTrainer.train = originals["train"]
        MultiStepTrainer.__init__ = originals["init"]
        HFCopyBackend.__init__ = originals["copy"]
        counter.detach()


# presets that name no algorithm, with the one their documented command trains (docs/presets.md)
PRESET_ALGOS = {"kitchen_learn": "poad"}


def preset_config(preset: str, threads: int, extra: list[str]) -> Any:
    from agentrl.config import compose_config

    algo = [f"algo={PRESET_ALGOS[preset]}"] if preset in PRESET_ALGOS else []
    return compose_config(
        [
            "task=train",
            *algo,
            f"experiment={preset}",
            "algo.iterations=1",
            "algo.eval_before=false",
            "algo.eval_every=0",
            "algo.checkpoint_every=0",
            "algo.save_final=false",
            "algo.time_limit_minutes=null",
            f"algo.torch_threads={threads}",
            "eval.episodes=1",
            *extra,
        ]
    )


def one_iteration(preset: str, threads: int, extra: list[str], peak: dict[str, Any]) -> dict[str, Any]:
    """FLOPs, tokens, seconds and MFU of one iteration's rollout and update."""
    from agentrl.envs import env_factory
    from agentrl.trainers.multistep import train_llm

    cfg = preset_config(preset, threads, extra)
    counter, clock = FlopCounter(), defaultdict(float)
    with tempfile.TemporaryDirectory() as tmp, phases(counter, clock):
        train_llm(cfg, Path(tmp), env_factory)
    precision = precision_of(cfg)
    peak_flops = peak["bfloat16" if precision != "fp32" else "float32"]["peak_gflops"] * 1e9
    wall = {"rollout": clock["rollout"], "update": clock["train"] - clock["rollout"]}
    cpu = {"rollout": clock["rollout_cpu"], "update": clock["train_cpu"] - clock["rollout_cpu"]}
    row: dict[str, Any] = {"preset": preset, "threads": threads, "precision": precision}
    for phase in ("rollout", "update"):
        flops = counter.flops[phase]
        # MFU per CPU-second of the process against the per-CPU-second peak times the threads: the
        # share of the cores' matmul capacity that the phase's CPU time turned into model FLOPs
        per_cpu_second = flops / max(cpu[phase], 1e-9)
        row[phase] = {
            "wall_s": round(wall[phase], 2),
            "cpu_s": round(cpu[phase], 2),
            "gflop": round(flops / 1e9, 1),
            "tokens_run": counter.tokens[phase],
            "padding_share": round(1 - counter.real_tokens[phase] / max(counter.tokens[phase], 1), 3),
            "gflops_per_cpu_s": round(per_cpu_second / 1e9, 2),
            "mfu": round(per_cpu_second / peak_flops, 4),
            "system_prompt_tokens_run": counter.system_tokens[phase],
        }
    row["system_prompt_length"] = counter.system_length
    return row


def precision_of(cfg: Any) -> str:
    from agentrl.models import model_shapes
    from agentrl.trainers.settings import resolve_precision

    return resolve_precision(str(cfg.algo.precision), "cpu", model_shapes(cfg.model))


def profile_iteration(preset: str, threads: int, extra: list[str], top: int = 12) -> dict[str, Any]:
    """One more iteration under torch.profiler: top operators by self CPU time, and how much of the wall
    time no torch operator accounts for."""
    from torch.profiler import ProfilerActivity, profile

    from agentrl.envs import env_factory
    from agentrl.trainers.multistep import train_llm

    cfg = preset_config(preset, threads, extra)
    with tempfile.TemporaryDirectory() as tmp, profile(activities=[ProfilerActivity.CPU]) as prof:
        start, cpu = time.perf_counter(), time.process_time()
        train_llm(cfg, Path(tmp), env_factory)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    events = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in events) / 1e6
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    # the profiler's self times are wall times of the operators: on a shared machine they include other
    # processes' turns, so the share outside operators is taken against the wall time of the whole run
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "torch_ops_s": round(total_self, 2),
        "outside_torch_ops_share": round(max(0.0, 1 - total_self / wall), 3),
        "top_ops": [
            {"op": e.key, "self_s": round(e.self_cpu_time_total / 1e6, 2), "calls": e.count} for e in ranked
        ],
    }


# ---- output ---------------------------------------------------------------------------------------------
def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# CPU MFU (`benchmarks/cpu_mfu.py`)",
        "",
        f"CPU: {result['cpu']}; torch {result['torch']}; threads {result['threads']}. {result['note']}",
        "",
        "## Peak matmul GFLOP/s (512 tokens, SmolLM2-135M shapes)",
        "",
        "| dtype | " + " | ".join(SHAPES) + " | peak |",
        "|---|" + "---|" * (len(SHAPES) + 1),
    ]
    for dtype, row in result["peak"].items():
        cells = " | ".join(str(row["gflops"][s]) for s in SHAPES)
        lines.append(f"| {dtype} | {cells} | {row['peak_gflops']} |")
    if result["presets"]:
        lines += [
            "",
            "## One iteration per preset",
            "",
            "| preset | precision | phase | wall s | CPU s | GFLOP | tokens run | padding | GFLOP per CPU s "
            "| MFU |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in result["presets"]:
            for phase in ("rollout", "update"):
                p = row[phase]
                lines.append(
                    f"| {row['preset']} | {row['precision']} | {phase} | {p['wall_s']} | {p['cpu_s']} | "
                    f"{p['gflop']} | {p['tokens_run']} | {p['padding_share']:.1%} | {p['gflops_per_cpu_s']} | "
                    f"{p['mfu']:.1%} |"
                )
    if result["presets"]:
        lines += [
            "",
            "System prompt (the env's instructions, the head of every prompt) run per iteration:",
            "",
        ]
        for row in result["presets"]:
            length = row["system_prompt_length"]
            runs = {phase: row[phase]["system_prompt_tokens_run"] for phase in ("rollout", "update")}
            lines.append(
                f"- {row['preset']}: {length} tokens long; rollout ran {runs['rollout']} of its tokens "
                f"({runs['rollout'] / max(length, 1):.0f} times), update {runs['update']} "
                f"({runs['update'] / max(length, 1):.0f} times); once per weights version would be {length}."
            )
    for row in result["presets"]:
        prof = row.get("profile")
        if not prof:
            continue
        lines += [
            "",
            f"### {row['preset']}: where the time goes (a second iteration under torch.profiler)",
            "",
            f"wall {prof['wall_s']} s (CPU {prof['cpu_s']} s; the whole run: model load, one iteration, a "
            f"one-episode eval), torch operators' self time {prof['torch_ops_s']} s: "
            f"{prof['outside_torch_ops_share']:.0%} of the wall time is outside torch operators "
            "(Python: env, prompts, sampling loop, trainer).",
            "",
            "| operator | self s | calls |",
            "|---|---|---|",
        ]
        lines += [f"| `{op['op']}` | {op['self_s']} | {op['calls']} |" for op in prof["top_ops"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="*", default=["frozenlake_learn"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peak-only", action="store_true")
    parser.add_argument("--peak-seconds", type=float, default=1.0, help="timing per dtype and shape")
    parser.add_argument("--profile", action="store_true", help="a second iteration under torch.profiler")
    parser.add_argument("--note", default="", help="a line for the results (e.g. how loaded the machine was)")
    parser.add_argument("--out", default="benchmarks/results/cpu_mfu", help="writes <out>.json and <out>.md")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every preset (after --)")
    args = parser.parse_args()

    from agentrl.kernels.precision import cpu_flags, describe_cpu

    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "cpu": describe_cpu(cpu_flags()),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "note": args.note,
        "peak": matmul_peak(seconds=args.peak_seconds),
        "presets": [],
    }
    print(json.dumps(result["peak"]), flush=True)
    for preset in [] if args.peak_only else args.presets:
        row = one_iteration(preset, args.threads, args.overrides, result["peak"])
        if args.profile:
            row["profile"] = profile_iteration(preset, args.threads, args.overrides)
        result["presets"].append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
