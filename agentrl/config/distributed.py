"""`distributed=` schema: several training processes (docs/distributed.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentrl.config.base import Schema, setting

#: distributed option -> the accelerate config TRL ships for it (trl/accelerate_configs/<name>.yaml)
ACCELERATE_CONFIGS = {"ddp": "multi_gpu", "zero2": "zero2", "zero3": "zero3", "fsdp2": "fsdp2"}
DISTRIBUTED = ("none", *ACCELERATE_CONFIGS)


@dataclass
class DistributedConfig(Schema):
    """Every conf/distributed/*.yaml: how many training processes and which engine shares the model."""

    PREFIX: ClassVar[str | None] = "distributed"

    name: str = setting(
        "none",
        "none | ddp (a full copy per GPU) | zero2 | zero3 | fsdp2 (shard the model)",
        choices=DISTRIBUTED,
    )
    num_processes: int | None = setting(
        None, "processes (one per GPU); null: every visible GPU (none: 1)", ge=1
    )
    main_process_port: int | None = setting(
        None,
        "rendezvous port of the launcher; null: the launcher's default (set it to run two jobs on one node)",
    )
    num_machines: int = setting(1, "nodes (multi-node: also machine_rank and main_process_ip)", ge=1)
    machine_rank: int = setting(0, "this node's index among num_machines", ge=0)
    main_process_ip: str | None = setting(None, "multi-node: the address of node 0")

    def check(self, prefix: str) -> None:
        if self.name == "none" and (self.num_processes or 1) > 1:
            self.fail(prefix, "num_processes", "needs a distributed engine, e.g. distributed=ddp")
        if self.num_machines > 1 and not self.main_process_ip:
            self.fail(prefix, "main_process_ip", "required with num_machines > 1 (the address of node 0)")
