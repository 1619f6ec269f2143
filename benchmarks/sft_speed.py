"""Seconds per SFT update: TRL's SFTTrainer loss vs the shared-prefix path, side by side on the same batches.

For each warm-up preset it builds the demonstrations the preset trains on (the embedded model, the
preset's own prompt and answer format, `--episodes` episodes on training seeds), cuts them into the
preset's micro-batches (`algo.batch_size` rows) and times one forward and backward of the loss per
batch, alternating TRL's `SFTTrainer.compute_loss` and ours (`agentrl/trainers/sft.py`:
`shared_prefix_sft_trainer`), `--repeats` times. The optimizer step is the same in both and not timed.
It prints the median seconds per batch of each, their ratio, the tokens per row (prompt, answer,
the batch's common prefix) and that the two losses agree, and writes `--out` (JSON).

    .venv/bin/python benchmarks/sft_speed.py --threads 2
    .venv/bin/python benchmarks/sft_speed.py --presets rlft_bandit_warmup --episodes 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

PRESETS = ("frozenlake_tagged_warmup", "rlft_bandit_warmup", "rlft_tictactoe_warmup", "snake_summary_warmup")


def measure(preset: str, episodes: int, repeats: int, batches: int) -> dict:
    from datasets import Dataset
    from trl import SFTTrainer

    from agentrl.agents.llm import build_llm_agent
    from agentrl.config import compose_config, typed
    from agentrl.envs import env_factory
    from agentrl.kernels.kvcache import common_prefix_length
    from agentrl.models import load_model, model_config
    from agentrl.trainers.sft import demonstration_rows, demonstrations, sft_config, shared_prefix_sft_trainer

    cfg = compose_config(["task=train", f"experiment={preset}", f"algo.episodes={episodes}"])
    algo = typed(cfg.algo)
    model, tokenizer = load_model(model_config(cfg.model), for_training=True)
    agent = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    rows = demonstration_rows(demonstrations(cfg, env_factory, agent.interface, tokenizer))
    size = algo.batch_size
    chunks = [rows[i : i + size] for i in range(0, len(rows) - size + 1, size)][:batches]
    if not chunks:
        raise SystemExit(f"{preset}: {len(rows)} rows, fewer than one batch of {size}: raise --episodes")
    trainer = shared_prefix_sft_trainer()(
        model=model,
        args=sft_config(algo, Path(tempfile.mkdtemp()), "cpu", 0, "fp32"),  # nothing is saved there
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    model.train()
    prepared = list(trainer.train_dataset)  # as TRL prepared them: the answer mask folded into labels
    inputs = [
        trainer._prepare_inputs(trainer.data_collator(prepared[i * size : (i + 1) * size]))
        for i in range(len(chunks))
    ]
    paths = {
        "trl": lambda m, b, **k: SFTTrainer.compute_loss(trainer, m, b, **k),
        "shared_prefix": trainer.compute_loss,
    }
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    losses: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, compute in paths.items():
            for batch in inputs:
                model.zero_grad(set_to_none=True)
                tokens = torch.tensor(int((batch["labels"] != -100).sum()))
                start = time.perf_counter()
                loss = compute(model, dict(batch), num_items_in_batch=tokens)
                loss.backward()
                seconds[name].append(time.perf_counter() - start)
                losses[name].append(float(loss.detach()))

    def prompt(row: dict) -> list[int]:
        return row["input_ids"][: row["completion_mask"].index(1)]

    prompts = [len(prompt(r)) for r in rows]
    answers = [sum(r["completion_mask"]) for r in rows]
    common = [common_prefix_length([prompt(r) for r in chunk]) for chunk in chunks]
    median = {name: statistics.median(s) for name, s in seconds.items()}
    return {
        "preset": preset,
        "rows": len(rows),
        "batch_size": size,
        "batches_timed": len(chunks),
        "repeats": repeats,
        "prompt_tokens_mean": round(statistics.mean(prompts), 1),
        "answer_tokens_mean": round(statistics.mean(answers), 1),
        "common_prefix_tokens_mean": round(statistics.mean(common), 1),
        "seconds_per_batch": {k: round(v, 3) for k, v in median.items()},
        "speedup": round(median["trl"] / median["shared_prefix"], 2),
        "max_loss_difference": max(
            abs(a - b) for a, b in zip(losses["trl"], losses["shared_prefix"], strict=True)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    parser.add_argument("--episodes", type=int, default=2, help="demonstration episodes per preset")
    parser.add_argument("--batches", type=int, default=2, help="micro-batches timed per preset")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sft_speed.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("AGENTRL_NO_PROGRESS", "1")
    logging.basicConfig(level=logging.WARNING)
    results = []
    for preset in args.presets:
        result = measure(preset, args.episodes, args.repeats, args.batches)
        results.append(result)
        s = result["seconds_per_batch"]
        print(
            f"{preset}: {result['batch_size']} rows/batch, prompt {result['prompt_tokens_mean']} tokens "
            f"(common prefix {result['common_prefix_tokens_mean']}), answer {result['answer_tokens_mean']}: "
            f"TRL {s['trl']:.2f} s, shared prefix {s['shared_prefix']:.2f} s per batch -> "
            f"{result['speedup']:.2f}x (loss difference {result['max_loss_difference']:.1e})",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    options = " ".join(
        f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items()
        if k != "out"
    )
    payload = {
        "command": f"python benchmarks/sft_speed.py {options}",
        "threads": args.threads,
        "results": results,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
