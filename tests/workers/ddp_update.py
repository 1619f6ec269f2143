"""MS-GRPO updates on fixed rows, for tests/test_distributed.py: run as one process (all rows) or under
torchrun with several, each process taking a part of the eight rows (with two, process 0 takes the first
5 and process 1 the other 3, so their micro-batches differ in size; with more, near-equal parts).
argv[2], if given and not "-", is `algo.max_batch_tokens` (the processes then split their micro-batches
into different numbers of passes); argv[3], if given, the number of iterations (default 1; each trains
on the same rows). With the environment of TRL's fsdp2.yaml (tests/test_gpu_defects.py FSDP2_ENV) the
processes run accelerate's FSDP2 path (tests/workers/fsdp_cpu.py). Writes the first iteration's logged
loss and its synchronised grad norm, the updated weights' checksum, the optimizer steps taken and the
iterations logged, as JSON to argv[1] (process 0)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

if os.environ.get("ACCELERATE_USE_FSDP") == "true":
    import tests.workers.fsdp_cpu  # noqa: F401  (keeps accelerate's FSDP plugin on the CPU)

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


def cuts(world: int, count: int = 8) -> list[int]:
    """Where each process's rows start (and the last ends): 5 + 3 for two processes, else near-equal."""
    if world == 2:
        return [0, 5, count]
    return [count * k // world for k in range(world + 1)]


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient as one tensor (FSDP2 shards them as DTensors)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def main(out: str, budget: int | None = None, iterations: int = 1) -> None:
    dist.ensure_process_group()
    rank, world = dist.rank(), dist.world_size()
    cfg = compose_config(["task=train", "algo=msgrpo", "model=tiny-random", "algo.torch_threads=1"])
    algo = typed(cfg.algo)
    model, tokenizer = load_model(cfg.model, for_training=True)
    cut = cuts(world)
    mine = rows()[cut[rank] : cut[rank + 1]]
    grads: list[float] = []
    steps: list[int] = []

    class Probe:
        """Records the synchronised gradient just before each optimizer step, and the steps."""

        def __getattr__(self, name):  # every other callback event: nothing to do
            return lambda *a, **k: None

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            total = sum(
                float(_full(p.grad).double().pow(2).sum()) for p in model.parameters() if p.grad is not None
            )
            grads.append(total**0.5)
            return control

        def on_optimizer_step(self, args, state, control, **kwargs):
            steps.append(state.global_step)
            return control

    with tempfile.TemporaryDirectory() as tmp:
        args = grpo_config(algo, Path(tmp), "cpu", 0)
        args.max_steps = iterations
        args.max_grad_norm = 0.0  # the raw gradient reaches the probe
        trainer = MultiStepTrainer(
            model=model,
            reward_funcs=[_unused_reward],
            args=args,
            processing_class=tokenizer,
            collect=lambda iteration: (list(mine), {}),
            max_batch_tokens=budget,
        )
        trainer.add_callback(Probe())
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    checksum = sum(float(_full(p.detach()).double().sum()) for p in trainer.model.parameters())
    if dist.is_main():
        Path(out).write_text(
            json.dumps(
                {
                    "loss": losses[0] if losses else None,
                    "grad_norm": grads[0] if grads else None,
                    "weights": checksum,
                    "world": world,
                    "optimizer_steps": len(steps),
                    "iterations_logged": len(losses),
                    "fsdp": bool(trainer.is_fsdp_enabled),
                }
            )
        )
    if dist.active():  # every process done before the group goes (its threads would abort at exit)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    given = sys.argv[2] if len(sys.argv) > 2 else "-"
    main(sys.argv[1], None if given == "-" else int(given), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
