"""`agentrl train <argv>` as one process of a torch FSDP2 run on the CPU (gloo), for
tests/test_gpu_defects.py under torchrun with the environment `accelerate launch` sets for TRL's
fsdp2.yaml (ACCELERATE_USE_FSDP, FSDP_VERSION=2, ...).

accelerate takes FSDP only on GPU-like distributed types: on the CPU its state stays MULTI_CPU (DDP)
and drops the FSDP plugin. This worker keeps the plugin instead (distributed type FSDP, on gloo); the
rest is accelerate's own FSDP2 path (`fully_shard` of each decoder layer and the root, FULL_STATE_DICT
checkpoints, `optimizer.bin`), driven by the Trainer and agentrl unchanged. With DUMP_LOADED_OPTIMIZER
set, a resume writes the optimizer state it loaded there (process 0)."""

from __future__ import annotations

import sys

from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

_init = AcceleratorState.__init__


def _fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):
    _init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        # every later AcceleratorState() copies the process state's type again: set it there too
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = fsdp_plugin


AcceleratorState.__init__ = _fsdp_on_cpu


def _dump_loaded_optimizer(path: str) -> None:
    """After a resume loads the optimizer, process 0 writes its full (unsharded) state to `path`."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from agentrl.trainers.grpo_trainer import MultiStepTrainer

    load = MultiStepTrainer._load_optimizer_and_scheduler

    def dumping(self, checkpoint):
        load(self, checkpoint)
        if checkpoint is None:
            return
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_optimizer_state_dict(self.model_wrapped, self.optimizer, options=options)
        if self.accelerator.is_main_process:
            torch.save({"optimizer": state, "lr": self.lr_scheduler.get_last_lr()}, path)

    MultiStepTrainer._load_optimizer_and_scheduler = dumping


if __name__ == "__main__":
    import os

    from agentrl.cli import main

    if os.environ.get("DUMP_LOADED_OPTIMIZER"):
        _dump_loaded_optimizer(os.environ["DUMP_LOADED_OPTIMIZER"])
    sys.argv = ["agentrl", *sys.argv[1:]]
    main()
