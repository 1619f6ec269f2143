"""Several training processes (one per GPU): which process this is, and the few collectives the engine
needs. docs/distributed.md says how a run is launched.

Every process rolls out its own groups of episodes (its rank is part of each group's env seed), computes
its rows' loss, and the gradients are averaged by DDP (or reduced by ZeRO/FSDP). Process 0 (`is_main()`)
alone writes metrics, eval results, checkpoints' shared files and the final model; every process saves
its own RNG state. Without a process group (one process) every helper here is the identity, so the
one-process engine is unchanged.

Launchers (`accelerate launch`, `torchrun`) set WORLD_SIZE, RANK and LOCAL_RANK; `ensure_process_group`
creates the group before the model loads, so each process puts its model on its own device.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.config import refuse_under_deepspeed

#: environment variable the relaunching parent sets: the run directory it has locked for its children
LOCKED_RUN_DIR = "AGENTRL_LOCKED_RUN_DIR"


#: how long a collective waits for the other processes, as Hugging Face's `TrainingArguments.ddp_timeout`
#: (NCCL's own default is 600 s, less than a rank-0 checkpoint of a 3B model with its optimizer state)
PROCESS_GROUP_TIMEOUT_S = 1800


def launched() -> bool:
    """True under a launcher: several processes (WORLD_SIZE > 1), or the processes `agentrl train
    distributed=...` relaunched itself as, even one (`num_processes` null on a machine with one GPU)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or bool(os.environ.get(LOCKED_RUN_DIR))


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def ensure_process_group(timeout_s: float | None = None) -> None:
    """Under a launcher, create the process group now (accelerate's: nccl on CUDA, gloo on CPU) so the
    model loads onto this process's device and every later collective has a group. The group keeps the
    timeout it is created with (the Trainer's own `ddp_timeout` comes too late to apply), so it is given
    here (default `PROCESS_GROUP_TIMEOUT_S`, which `grpo_config` passes on as `ddp_timeout`)."""
    if launched() and not (dist.is_available() and dist.is_initialized()):
        from datetime import timedelta

        from accelerate import PartialState

        seconds = PROCESS_GROUP_TIMEOUT_S if timeout_s is None else timeout_s
        PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(seconds=seconds))


def pin_one_device(args: Any, device: str) -> None:
    """One training process on a machine with several visible GPUs trains on the first: the Trainer's
    arguments count every visible GPU (`n_gpu`) and would wrap the model in `nn.DataParallel`, which
    TRL's GRPOTrainer refuses. The Trainer places the model on `cuda:0`, so another index is refused."""
    from agentrl.errors import ConfigError

    index = torch.device(device).index or 0
    if index != 0:
        raise ConfigError(
            f"model.device={device}: one training process runs on cuda:0; choose the GPU with "
            f"CUDA_VISIBLE_DEVICES={index} and model.device=cuda"
        )
    if args.n_gpu > 1:  # reading it first sets up the devices, which would reset it
        args._n_gpu = 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def _device() -> torch.device:
    """Where collective tensors live: the process's GPU under nccl, else the CPU."""
    if active() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_sum(values: list[float]) -> list[float]:
    """Element-wise sum over processes (float64)."""
    if not active():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def all_max(value: float) -> float:
    """The largest `value` over processes."""
    if not active():
        return float(value)
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def any_true(flag: bool) -> bool:
    """True on every process when it is true on any: a decision all of them must take together."""
    if not active():
        return bool(flag)
    tensor = torch.tensor([1.0 if flag else 0.0], device=_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item() > 0)


def gather(obj: Any) -> list[Any]:
    """Every process's `obj`, in rank order, on every process."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if active():
        dist.barrier()


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Process 0's parameters in `module` on every process (a module outside DDP starts equal)."""
    if not active():
        return
    for param in module.parameters():
        data = param.data.to(_device())
        dist.broadcast(data, src=0)
        param.data.copy_(data.to(param.device))


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum the gradients of `params` (outside DDP, e.g. the value head) over processes."""
    if not active():
        return
    for param in params:
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
        buffer = grad.to(_device())
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
        param.grad = buffer.to(param.device)


@contextlib.contextmanager
def shared_atomic_dir(final_path: Path) -> Iterator[Path]:
    """`runlog.atomic_dir` for every process at once: all write into one staging directory (each its own
    files: its RNG state, its shards), and process 0 puts it in place in one rename once all are done.
    Call it on every process."""
    from agentrl.runs.runlog import atomic_dir, replace_dir

    if not active():
        with atomic_dir(final_path) as tmp:
            yield tmp
        return
    final_path = Path(final_path)
    tmp = final_path.with_name(f".tmp-{final_path.name}-shared")
    if is_main():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    yield tmp
    barrier()
    if is_main():
        replace_dir(tmp, final_path, tag="shared")
    barrier()


def accelerate_config(name: str) -> Path:
    """The accelerate config TRL ships for a `distributed` option (ddp -> multi_gpu.yaml, zero3, ...)."""
    import trl

    from agentrl.config.distributed import ACCELERATE_CONFIGS

    return Path(trl.__file__).parent / "accelerate_configs" / f"{ACCELERATE_CONFIGS[name]}.yaml"


def launcher_command(dcfg: Any, args: list[str], *, cuda: bool, mixed_precision: str = "no") -> list[str]:
    """The command that runs `python -m agentrl <args>` as `dcfg.num_processes` processes per machine:
    `accelerate launch` with TRL's config for the engine on GPUs; on a machine without CUDA (tests,
    gloo), `torchrun`, which only DDP can use."""
    from agentrl.errors import ConfigError

    name = str(dcfg.name)
    if not cuda and name != "ddp":
        raise ConfigError(
            f"distributed={name} needs CUDA GPUs; on a machine without one, distributed=ddp runs the "
            "processes on the CPU (gloo)"
        )
    per_machine = dcfg.num_processes
    if per_machine is None:
        if not cuda:
            raise ConfigError(
                f"distributed={name}: set distributed.num_processes (no GPU to count on this machine)"
            )
        import torch

        per_machine = torch.cuda.device_count()
    module = ["-m", "agentrl", *args]
    if not cuda:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={per_machine}"]
        if dcfg.num_machines > 1:
            port = dcfg.main_process_port or 29500
            cmd += [
                f"--nnodes={dcfg.num_machines}",
                f"--node_rank={dcfg.machine_rank}",
                f"--master_addr={dcfg.main_process_ip}",
                f"--master_port={port}",
            ]
        elif dcfg.main_process_port:
            cmd.append(f"--master_port={dcfg.main_process_port}")
        else:
            cmd.append("--standalone")  # a free port: several jobs can share the machine
        return [*cmd, *module]
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(accelerate_config(name)),
        "--num_processes",
        str(per_machine * dcfg.num_machines),  # accelerate counts the processes of all machines
        "--num_machines",
        str(dcfg.num_machines),
        "--machine_rank",
        str(dcfg.machine_rank),
        "--mixed_precision",
        mixed_precision,
    ]
    if dcfg.main_process_ip:
        cmd += ["--main_process_ip", str(dcfg.main_process_ip)]
    if dcfg.main_process_port:
        cmd += ["--main_process_port", str(dcfg.main_process_port)]
    return [*cmd, *module]


def sharded(accelerator: Any) -> bool:
    """True under an engine that shards parameters (ZeRO-3, FSDP): every forward is a collective, so
    every process must run the same number of them."""
    state = getattr(accelerator, "state", None)
    kind = str(getattr(state, "distributed_type", ""))
    if "FSDP" in kind:
        return True
    if "DEEPSPEED" in kind:
        plugin = getattr(state, "deepspeed_plugin", None)
        return int(getattr(plugin, "zero_stage", 0) or 0) == 3
    return False


__all__ = [
    "LOCKED_RUN_DIR",
    "PROCESS_GROUP_TIMEOUT_S",
    "accelerate_config",
    "launcher_command",
    "active",
    "all_max",
    "all_sum",
    "any_true",
    "barrier",
    "broadcast_parameters",
    "ensure_process_group",
    "gather",
    "is_main",
    "launched",
    "local_rank",
    "pin_one_device",
    "rank",
    "refuse_under_deepspeed",
    "shared_atomic_dir",
    "sharded",
    "sum_gradients",
    "world_size",
]
