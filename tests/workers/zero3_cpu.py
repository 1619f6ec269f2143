"""`agentrl train <argv>` as one process of a DeepSpeed run on the CPU (DS_ACCELERATOR=cpu, gloo), under
torchrun with the environment `accelerate launch` derives from TRL's zero2.yaml/zero3.yaml
(ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_ZERO_STAGE, ...). Needs deepspeed installed.

accelerate turns DeepSpeed on only for a process group created with `cpu=False`; agentrl creates it
with `cpu=True` on a machine without CUDA. This worker creates it with `cpu=False` (DeepSpeed's CPU
accelerator then picks gloo); the rest is the Trainer's and accelerate's DeepSpeed path unchanged. With DUMP_LOADED_OPTIMIZER set, a
resume writes the optimizer state each process loaded to `<it>.<rank>`."""

from __future__ import annotations

import sys

from agentrl import distributed

_ensure = distributed.ensure_process_group


def _deepspeed_group(timeout_s=None):
    from datetime import timedelta

    from accelerate import PartialState

    if distributed.launched() and not distributed.dist.is_initialized():
        seconds = distributed.PROCESS_GROUP_TIMEOUT_S if timeout_s is None else timeout_s
        PartialState(cpu=False, timeout=timedelta(seconds=seconds))


distributed.ensure_process_group = _deepspeed_group


def _dump_loaded_optimizer(path: str) -> None:
    """After a resume loads DeepSpeed's checkpoint, each process writes its ZeRO optimizer's state (its
    partition: the base optimizer's Adam moments) to `<path>.<rank>`."""
    import torch

    from agentrl.trainers.grpo_trainer import MultiStepTrainer

    load = MultiStepTrainer._load_optimizer_and_scheduler

    def dumping(self, checkpoint):
        load(self, checkpoint)
        if checkpoint is not None:
            state = self.optimizer.optimizer.state_dict()["optimizer_state_dict"]
            torch.save(state, f"{path}.{self.accelerator.process_index}")

    MultiStepTrainer._load_optimizer_and_scheduler = dumping


if __name__ == "__main__":
    import os

    from agentrl.cli import main

    if os.environ.get("DUMP_LOADED_OPTIMIZER"):
        _dump_loaded_optimizer(os.environ["DUMP_LOADED_OPTIMIZER"])
    sys.argv = ["agentrl", *sys.argv[1:]]
    main()
