"""One MS-GRPO update on fixed rows, for tests/test_distributed.py: run as one process (all rows) or
under torchrun with two processes, process 0 taking the first 5 rows and process 1 the other 3 (so their
micro-batches differ in size). argv[2], if given, is `algo.max_batch_tokens` (the processes then split
their micro-batches into different numbers of passes). Writes the logged loss and grad norm, and the
updated weights' checksum, as JSON to argv[1] (process 0)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from datasets import Dataset

from agentrl import distributed as dist
from agentrl.config import compose_config, typed
from agentrl.models import load_model
from agentrl.trainers.grpo_trainer import MultiStepTrainer, _unused_reward
from agentrl.trainers.settings import grpo_config
from agentrl.types import StepSample


def rows() -> list[StepSample]:
    """Eight rows of four groups' worth of steps: varied lengths and advantages."""
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(8):
        prompt = torch.randint(5, 500, (6 + k % 3,), generator=g).tolist()
        completion = torch.randint(5, 500, (2 + k % 4,), generator=g).tolist()
        out.append(StepSample(prompt, completion, None, float(k % 3) - 1.0 + 0.25 * k, k, 0))
    return out


def main(out: str, budget: int | None = None) -> None:
    dist.ensure_process_group()
    rank, world = dist.rank(), dist.world_size()
    cfg = compose_config(["task=train", "algo=msgrpo", "model=tiny-random", "algo.torch_threads=1"])
    algo = typed(cfg.algo)
    model, tokenizer = load_model(cfg.model, for_training=True)
    all_rows = rows()
    cut = [0, 5, 8] if world == 2 else [0, 8]
    mine = all_rows[cut[rank] : cut[rank + 1]]
    grads: dict[str, float] = {}

    class Probe:
        """Records the synchronised gradient just before the optimizer step."""

        def __getattr__(self, name):  # every other callback event: nothing to do
            return lambda *a, **k: None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            total = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters() if p.grad is not None)
            grads["grad_norm"] = total**0.5
            return control

    with tempfile.TemporaryDirectory() as tmp:
        args = grpo_config(algo, Path(tmp), "cpu", 0)
        args.max_steps = 1
        args.max_grad_norm = 0.0  # the raw gradient reaches the probe
        trainer = MultiStepTrainer(
            model=model,
            reward_funcs=[_unused_reward],
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["<rollout>"] * (2 * args.steps_per_generation)}),
            processing_class=tokenizer,
            collect=lambda iteration: (list(mine), {}),
            max_batch_tokens=budget,
        )
        trainer.add_callback(Probe())
        trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h][0]
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    if dist.is_main():
        Path(out).write_text(
            json.dumps(
                {"loss": logged["loss"], "grad_norm": grads["grad_norm"], "weights": checksum, "world": world}
            )
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
