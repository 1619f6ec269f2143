"""GPU check: a few MS-GRPO iterations on CUDA in bf16 with a randomly initialised Qwen2.5-3B-shaped model.

No hub access: the model is built from a `Qwen2Config` with Qwen2.5-3B's shape (36 layers, hidden 2048,
16 query / 2 key-value heads, MLP 11008, vocab 151936, tied embeddings) and random weights, saved once
to a temporary directory with the embedded SmolLM2 tokenizer (its ids fit in the larger vocabulary), and
trained through `train_llm` exactly as `agentrl train` would (bf16, optional gradient
checkpointing). Its answers are noise, so invalid actions are replaced by random legal moves
(`agent.invalid_rule=random`) to make returns vary and every update real.

Reports seconds per iteration split into rollout and update, rollout and update tokens/s, and peak GPU
memory. Has not run on this project's CPU machines.

    python benchmarks/gpu_check.py                         # 3 iterations, 2 groups x 8 episodes
    python benchmarks/gpu_check.py --iterations 5 --gradient-checkpointing algo.group_size=16
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path


def build_model(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from agentrl.models import load_tokenizer

    tokenizer = load_tokenizer({"name_or_path": "builtin:smollm2-135m"})
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tune)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible; nothing to check on this machine")
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    from agentrl.config import compose_config
    from agentrl.trainers.multistep import train_llm

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "qwen2.5-3b-shaped"
        start = time.perf_counter()
        build_model(model_dir)
        print(f"built random Qwen2.5-3B-shaped model in {time.perf_counter() - start:.1f} s", flush=True)
        cfg = compose_config(
            [
                "task=train",
                "algo=msgrpo",
                "env=frozenlake",
                "model=qwen2.5-3b",
                f"model.name_or_path={model_dir}",
                "model.dtype=bfloat16",
                f"model.lora.r={args.lora}",
                f"algo.iterations={args.iterations}",
                f"algo.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
                "algo.group_size=8",
                "algo.groups_per_iteration=2",
                "algo.eval_every=0",
                "algo.checkpoint_every=0",
                "algo.eval_before=false",
                "algo.save_final=false",
                "agent.invalid_rule=random",
                "eval.episodes=4",
                *args.overrides,
            ]
        )
        torch.cuda.reset_peak_memory_stats()
        run_dir = Path(tmp) / "run"
        result = train_llm(cfg, run_dir).metrics
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"device: {torch.cuda.get_device_name()}  gradient checkpointing: {args.gradient_checkpointing}")
    print("iter  rollout_s  update_s  rollout tok/s  update tok/s  samples")
    for r in rows:
        print(
            f"{r['iteration']:>4}  {r['rollout_s']:9.2f}  {r['update_s']:8.2f}  {r['rollout_tokens_per_s']:13.0f}"
            f"  {r.get('update_tokens_per_s', 0):12.0f}  {r['samples']:7d}"
        )
    steady = rows[1:] or rows
    mean = lambda key: sum(r[key] for r in steady) / len(steady)  # noqa: E731
    print(
        f"steady state: {mean('rollout_s') + mean('update_s'):.2f} s/iteration "
        f"(rollout {mean('rollout_s'):.2f} s, update {mean('update_s'):.2f} s); peak GPU memory {peak:.1f} GiB"
    )
    print(f"final eval (random weights, expect ~0): {result['success_rate']}")


if __name__ == "__main__":
    main()
