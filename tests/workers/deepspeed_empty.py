"""For tests/test_gpu_defects.py, under torchrun with two processes, DS_ACCELERATOR=cpu and the
environment of TRL's zero2.yaml: two MS-GRPO iterations through DeepSpeed, the first with rows (Adam's
moments become non-zero), the second with no row on any process. Writes the weights' checksum and the
step count and first-moment checksum of the torch optimizer inside DeepSpeed's ZeRO optimizer after each
iteration as JSON to argv[1] (process 0): equal when the empty iteration moved nothing."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from transformers import TrainerCallback

from agentrl import distributed as dist
from agentrl.config import compose_config, typed
from agentrl.models import load_model
from agentrl.trainers.grpo_trainer import MultiStepTrainer, _unused_reward
from agentrl.trainers.settings import grpo_config
from tests.workers.ddp_update import rows
from tests.workers.zero3_cpu import _deepspeed_group


def main(out: str) -> None:
    _deepspeed_group()
    rank = dist.rank()
    cfg = compose_config(["task=train", "algo=msgrpo", "model=tiny-random", "algo.torch_threads=1"])
    algo = typed(cfg.algo)
    model, tokenizer = load_model(cfg.model, for_training=True)
    mine = rows()[rank * 4 : rank * 4 + 4]
    sums: list[float] = []
    adam: list[tuple[float, float]] = []

    class Checksum(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
            sums.append(sum(float(p.detach().double().sum()) for p in model.parameters()))
            inner = optimizer
            while getattr(inner, "optimizer", None) is not None:  # accelerate's wrapper, then ZeRO's
                inner = inner.optimizer
            states = list(inner.state.values())
            adam.append(
                (
                    max(float(s["step"]) for s in states),
                    sum(float(s["exp_avg"].double().sum()) for s in states),
                )
            )
            return control

    with tempfile.TemporaryDirectory() as tmp:
        args = grpo_config(algo, Path(tmp), "cpu", 0)
        args.max_steps, args.learning_rate = 2, 1e-3
        trainer = MultiStepTrainer(
            model=model,
            reward_funcs=[_unused_reward],
            args=args,
            processing_class=tokenizer,
            collect=lambda iteration: (list(mine) if iteration == 0 else [], {}),
        )
        trainer.add_callback(Checksum())
        trainer.train()
    if dist.is_main():
        Path(out).write_text(
            json.dumps({"sums": sums, "adam": adam, "deepspeed": trainer.is_deepspeed_enabled})
        )


if __name__ == "__main__":
    main(sys.argv[1])
