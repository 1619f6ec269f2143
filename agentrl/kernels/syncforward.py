"""Equal numbers of forward calls on every process, for modules whose forward is a collective.

Under a parameter-sharding engine (torch FSDP2 `fully_shard`, DeepSpeed ZeRO-3) a module's forward
all-gathers its parameters, so every process of the group must call it the same number of times. Rollouts
do not: each process plays its own episodes, with one forward per env step and per decoded token, and
episodes end when the env says so. A process that runs out of work leaves the others blocked in an
all-gather it never joins.

`synced_forwards(model)` makes the counts equal. Inside it, every top-level call of a synced module first
agrees with the other processes on what runs next, in one all_reduce(MAX) of an integer request:

* a process about to run a real forward of module k requests k + 1;
* a process that has left the `with` body requests 0 and serves: while the agreed value is positive it
  runs a dummy forward (a 1-token input, no autograd, output dropped) of the agreed module, then asks
  again; once it is 0 every process has left, and the context exits;
* a process whose request is lower than the agreed value (it wants another module, or several modules
  are synced together) runs a dummy forward of the agreed module and asks again.

Every round, every process runs one forward of the same module, so the collectives inside the forwards
pair up; the highest request is served each round, so every process gets through its own work. The
agreement runs in a forward pre-hook put ahead of the engine's own (which starts the all-gather), so it
comes first in every process. Calls made inside a forward that is already agreed on (submodules, the
dummy forwards themselves) pass through. The real forward is the caller's own call, arguments and
autograd unchanged; a dummy forward builds its own inputs, so it never sees the caller's KV cache, and
forks the RNG, so a process's random stream does not depend on how long the others run.

Inside the context the synced modules must be the only source of collectives on the group: a process
that calls another collective (a metric reduction, a barrier) while another process waits in an
agreement pairs the wrong operations. HF `generate` on a synced module runs with `synced_gpus=False`:
transformers turns it on by itself under ZeRO-3 (and its FSDP integration), and its per-token all_reduce
would be such a collective; the agreement already keeps the forwards in step.

It equalises forwards only. A forward with autograd is followed by a backward that is a collective too
(re-gather, reduce-scatter of the gradients); the dummies have none, so gradient forwards must have the
same count and structure on every process by construction. Without a process group, with one process,
or (by default) when no synced module has sharded parameters (single GPU, DDP), the context does nothing
and costs nothing, so callers can enter it unconditionally.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

#: builds the arguments of a module's dummy forward: module, device -> (args, kwargs)
DummyInput = Callable[[nn.Module, torch.device], tuple[tuple[Any, ...], dict[str, Any]]]


@dataclass
class ForwardCounts:
    """What a `synced_forwards` context ran on this process (counted only while it syncs)."""

    real: int = 0  # forwards the caller made
    dummy: int = 0  # forwards run to keep other processes' forwards company


def token_input(module: nn.Module, device: torch.device) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A one-token causal-LM call without a KV cache: `input_ids=[[0]], use_cache=False`."""
    kwargs: dict[str, Any] = {"input_ids": torch.zeros((1, 1), dtype=torch.long, device=device)}
    parameters = inspect.signature(module.forward).parameters
    if "use_cache" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        kwargs["use_cache"] = False
    return (), kwargs


class _Session:
    """The hooks and the agreement protocol of one active `synced_forwards` context."""

    def __init__(self, modules: tuple[nn.Module, ...], group: Any, dummy_input: DummyInput) -> None:
        self.modules = modules
        self.group = group
        self.dummy_input = dummy_input
        self.counts = ForwardCounts()
        self.depth = 0  # >0: inside a forward already agreed on (or a dummy one)
        self.input_devices: dict[int, torch.device] = {}  # per module: where its real inputs lived
        self.device = _collective_device(group, modules[0])
        self.handles: list[Any] = []
        self.patched_generate: list[nn.Module] = []

    # -- the protocol ----------------------------------------------------------------------------------
    def agree(self, request: int) -> int:
        """The highest request of all processes (0: none has a forward left)."""
        flag = torch.tensor([request], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return int(flag.item())

    def serve(self, request: int) -> None:
        """Run dummy forwards of what the others agree on until `request` is the agreed one (or, for
        request 0, until no process has a forward left)."""
        while (agreed := self.agree(request)) != request:
            self.dummy_forward(agreed - 1)

    def dummy_forward(self, index: int) -> None:
        module = self.modules[index]
        device = self.input_devices.get(index)
        if device is None:
            device = _parameter_device(module)
        args, kwargs = self.dummy_input(module, device)
        rng_devices = [device] if device.type == "cuda" else []
        self.depth += 1
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=rng_devices):
                module(*args, **kwargs)
        finally:
            self.depth -= 1
        self.counts.dummy += 1

    # -- hooks -----------------------------------------------------------------------------------------
    def install(self) -> None:
        for index, module in enumerate(self.modules):
            # prepend: the agreement must come before the engine's pre-hook starts gathering parameters
            self.handles.append(
                module.register_forward_pre_hook(self._pre_hook(index), prepend=True, with_kwargs=True)
            )
            self.handles.append(module.register_forward_hook(self._post_hook, always_call=True))
            if callable(getattr(module, "generate", None)) and "generate" not in vars(module):
                module.generate = _without_synced_gpus(module.generate)
                self.patched_generate.append(module)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for module in self.patched_generate:
            del module.generate
        self.handles, self.patched_generate = [], []

    def _pre_hook(self, index: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.depth += 1  # the post-hook (always called) takes it back, even when this raises
            if self.depth > 1:
                return  # a call inside a forward already agreed on
            device = _first_tensor_device(args, kwargs)
            if device is not None:
                self.input_devices[index] = device
            self.serve(index + 1)
            self.counts.real += 1

        return hook

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        # floor 0: it also runs when an earlier pre-hook raised before this session's pre-hook ran
        self.depth = max(self.depth - 1, 0)


_active: _Session | None = None


@contextlib.contextmanager
def synced_forwards(
    *modules: nn.Module,
    group: Any = None,
    dummy_input: DummyInput = token_input,
    enabled: bool | None = None,
) -> Iterator[ForwardCounts]:
    """Within the block, every process of `group` (default: the world) runs the same forwards of
    `modules`; on leaving it, a process keeps running dummy forwards until all have left (module doc).
    Every process of the group must enter and leave it, also one with nothing to run.

    Pass the modules that are called (the model `generate` and the log-prob code call, after the
    engine has wrapped it), all of them in one context, in the same order on every process.
    `dummy_input(module, device)` gives the dummy call's (args, kwargs); the default suits transformers
    models (`token_input`). `enabled=None` syncs only when a module has sharded parameters
    (`is_sharded`); True syncs whenever there are several processes. Re-entering with modules already
    synced does nothing. Yields this process's `ForwardCounts`. On an exception the hooks are removed and
    nothing is drained: the process is failing, and its launcher stops the others.
    """
    global _active
    if not modules:
        raise ValueError("synced_forwards needs at least one module")
    several = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    if several and enabled is None:
        enabled = any(is_sharded(m) for m in modules)
    if not (several and enabled):
        yield ForwardCounts()  # nothing to keep in step
        return
    if _active is not None:
        if all(any(m is s for s in _active.modules) for m in modules):
            yield _active.counts
            return
        raise RuntimeError(
            "synced_forwards is already active for other modules: enter all modules in one context "
            "(two contexts would interleave their agreements)"
        )
    session = _Session(modules, group, dummy_input)
    session.install()
    _active = session
    try:
        yield session.counts
        session.serve(0)
    finally:
        _active = None
        session.remove()


def is_sharded(module: nn.Module) -> bool:
    """True when `module` (or a submodule) has parameters sharded over processes: torch FSDP (2 or 1) or
    DeepSpeed ZeRO-3 (its parameters carry a `ds_id`). Such a module's forward is a collective."""
    if not dist.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in module.modules()):
        return True
    return any(hasattr(p, "ds_id") for p in module.parameters())


# -- helpers -----------------------------------------------------------------------------------------------
def _collective_device(group: Any, module: nn.Module) -> torch.device:
    """Where the agreement's tensor lives: the current GPU under nccl, the CPU under gloo."""
    backend = str(dist.get_backend(group))
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if "gloo" in backend:
        return torch.device("cpu")
    return _parameter_device(module)


def _parameter_device(module: nn.Module) -> torch.device:
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _first_tensor_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _without_synced_gpus(generate: Callable[..., Any]) -> Callable[..., Any]:
    """`generate` with transformers' own synced-GPUs loop off (the agreement keeps forwards in step)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["synced_gpus"] = False
        return generate(*args, **kwargs)

    return wrapper


__all__ = ["DummyInput", "ForwardCounts", "is_sharded", "synced_forwards", "token_input"]
