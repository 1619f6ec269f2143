"""For tests/test_gpu_defects.py, under torchrun with two processes: create the process group as
`train_llm` does, with `distributed.PROCESS_GROUP_TIMEOUT_S` set to argv[2], and write the group's
timeout and the Trainer's `ddp_timeout` (seconds) as JSON to argv[1] (process 0)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed

from agentrl import distributed as dist
from agentrl.config import compose_config, typed
from agentrl.trainers.settings import grpo_config


def main(out: str, seconds: str) -> None:
    dist.PROCESS_GROUP_TIMEOUT_S = int(seconds)
    dist.ensure_process_group()
    group = torch.distributed.distributed_c10d._get_default_group()
    timeout = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    algo = typed(compose_config(["task=train", "algo=msgrpo", "model=tiny-random"]).algo)
    with tempfile.TemporaryDirectory() as tmp:
        args = grpo_config(algo, Path(tmp), "cpu", 0)
    if dist.is_main():
        Path(out).write_text(json.dumps({"group": timeout, "trainer": args.ddp_timeout}))
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
