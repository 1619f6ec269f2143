"""Update-step overhead of MultiStepTrainer vs plain trl.GRPOTrainer on the same rows (target <= 1.15x).

Both trainers get the same N rows (prompt P tokens, completion C tokens, random advantages), the same
GRPOConfig (loss, micro-batches, lr) and a fresh copy of the same model. Generation is taken out of
both: the plain trainer's `_generate_and_score_completions` returns the pre-packed batch (TRL then
shuffles and splits it as usual); ours gets the same rows from `collect`. What is timed is
`trainer.train()` for a few optimizer steps: data plumbing, forward, backward, optimizer, logging.
Runs alternate (plain, ours, ours-fast, ...) and the median seconds per iteration is compared. "ours"
forces TRL's own log-prob computation (pure plumbing overhead, the 1.15x target); "ours-fast" is the
default on CPU (LM head on completion tokens only, each distinct prompt once; here all prompts differ).

    .venv/bin/python benchmarks/trainer_overhead.py                         # tiny-random, fast
    .venv/bin/python benchmarks/trainer_overhead.py --model smollm2-135m --rows 32 --prompt 100
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny-random", help="model config name (conf/model/<name>.yaml)")
    parser.add_argument("--rows", type=int, default=64, help="step samples per iteration")
    parser.add_argument("--prompt", type=int, default=120, help="prompt tokens per row")
    parser.add_argument("--completion", type=int, default=4, help="completion tokens per row")
    parser.add_argument(
        "--micro", type=int, default=4, help="micro-batches per iteration (grad accumulation)"
    )
    parser.add_argument("--iterations", type=int, default=3, help="optimizer steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per trainer (alternating)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.rows % args.micro:
        parser.error("--rows must be a multiple of --micro (plain TRL would drop the remainder)")

    torch.set_num_threads(args.threads)
    os.environ.setdefault("AGENTRL_NO_PROGRESS", "1")
    logging.basicConfig(level=logging.WARNING)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.config import compose_config
    from agentrl.models import load_model
    from agentrl.trainers.grpo_trainer import MultiStepTrainer
    from agentrl.trainers.packing import pack_samples
    from agentrl.types import StepSample

    model_cfg = compose_config([f"model={args.model}"]).model
    base, tokenizer = load_model(model_cfg, for_training=True)
    state = {k: v.clone() for k, v in base.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    vocab = min(len(tokenizer), base.config.vocab_size)
    samples = [
        StepSample(
            torch.randint(0, vocab, (args.prompt,), generator=generator).tolist(),
            torch.randint(0, vocab, (args.completion,), generator=generator).tolist(),
            None,
            float(torch.randn((), generator=generator)),
            i,
            0,
        )
        for i in range(args.rows)
    ]
    packed = pack_samples(samples, tokenizer.pad_token_id, "cpu")
    packed["num_items_in_batch"] = torch.tensor(float(args.rows * args.completion))

    class PlainGRPO(GRPOTrainer):
        """TRL's own path; only generation + reward scoring is replaced by the fixed rows."""

        def _generate_and_score_completions(self, inputs):  # noqa: ANN001
            return {k: v.clone() for k, v in packed.items()}

    def config(out: str, per_device: int) -> GRPOConfig:
        return GRPOConfig(
            output_dir=out,
            max_steps=args.iterations,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=args.micro,
            steps_per_generation=args.micro,
            num_generations=2,
            learning_rate=1e-6,
            loss_type="dapo",
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            use_cpu=True,
            remove_unused_columns=False,
        )

    def fresh_model():  # noqa: ANN202
        base.load_state_dict(state)
        return base

    def run(kind: str) -> float:
        """kind: plain | ours (TRL's log-prob path, pure plumbing overhead) | ours-fast (our default)."""
        with tempfile.TemporaryDirectory() as out:
            if kind == "plain":
                per_device = args.rows // args.micro  # generation batch = rows exactly: nothing dropped
                dataset = Dataset.from_dict({"prompt": ["x"] * args.rows})
                trainer = PlainGRPO(
                    model=fresh_model(),
                    reward_funcs=[lambda **kw: [0.0]],
                    args=config(out, per_device),
                    train_dataset=dataset,
                    processing_class=tokenizer,
                )
            else:
                trainer = MultiStepTrainer(
                    model=fresh_model(),
                    reward_funcs=[lambda **kw: [0.0]],
                    args=config(out, 2),
                    processing_class=tokenizer,
                    collect=lambda iteration: (list(samples), {}),
                )
                trainer.trl_logprobs = kind == "ours"
            from transformers.trainer_callback import PrinterCallback

            trainer.remove_callback(PrinterCallback)
            start = time.perf_counter()
            trainer.train()
            return (time.perf_counter() - start) / args.iterations

    times: dict[str, list[float]] = {"plain": [], "ours": [], "ours-fast": []}
    run("plain")  # warm-up (allocator, kernels), not counted
    for _ in range(args.repeats):
        for kind in times:
            times[kind].append(run(kind))
    plain, ours, fast = (statistics.median(times[k]) for k in ("plain", "ours", "ours-fast"))
    print(
        f"model {args.model}, {args.rows} rows x ({args.prompt} prompt + {args.completion} completion) tokens, "
        f"{args.micro} micro-batches, {args.threads} threads"
    )
    print(
        f"plain trl.GRPOTrainer  {plain:.3f} s/iteration  (runs: {', '.join(f'{t:.3f}' for t in times['plain'])})"
    )
    print(
        f"MultiStepTrainer       {ours:.3f} s/iteration  (TRL's log-prob path; runs: "
        f"{', '.join(f'{t:.3f}' for t in times['ours'])})"
    )
    print(f"  default CPU path (completion-only LM head, shared prompts): {fast:.3f} s/iteration")
    ratio = ours / plain
    print(
        f"overhead ratio ours/plain  {ratio:.3f}x  (target <= 1.15x): {'PASS' if ratio <= 1.15 else 'FAIL'}"
    )
    print(f"speed-up of the default CPU path over plain TRL: {plain / fast:.1f}x")


if __name__ == "__main__":
    main()
