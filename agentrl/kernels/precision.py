"""Which precision a CPU trains in: the bf16 matrix instructions it has, and whether bf16 wins on it.

bf16 halves the bytes every matmul reads, but a CPU only computes bf16 products fast with matrix
instructions for them: AVX512-BF16 (`vdpbf16ps`) or AMX (`amx_bf16` on `amx_tile`). Without them a bf16
matmul has nothing to gain over fp32. Neither is assumed: the flags come from /proc/cpuinfo and
`algo.precision=auto` on a CPU switches to bf16-mixed only where one of them is present AND bf16 autocast
beats fp32 in a short timing at the model's own layer shapes (`autocast_speedup`; SmolLM2-135M's
576 -> 1536 projection: 2.1-3.0x with AVX512-BF16 on the development machine). Generation runs under
the same autocast (accelerate wraps the model's forward); the HF backend keeps each weight's cast for a
whole generation call (`HFBackend._weight_casts`), and a bf16 copy (`algo.rollout_dtype=bfloat16`)
avoids the casts altogether. `AGENTRL_CPU_FEATURES=plain` makes the probes answer as a CPU without bf16
matrix instructions (`usable_bf16_instructions`; kernels/features.py), and the log line says so.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.kernels.features import ENV, library_caps, requested

log = logging.getLogger(__name__)

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")
# bf16 autocast must beat fp32 by this much at the model's shapes (timing noise on a loaded machine is
# ~10-20%; a real win with AVX512-BF16 is ~2x, measured at SmolLM2-135M's MLP shape)
MIN_SPEEDUP = 1.3
# below this hidden size auto stays fp32 without timing: the probe's verdict on matrices that small swings
# with the machine's load (1.09x-1.43x measured for the tiny test model's 64x128), and a model's precision
# must not change from run to run
MIN_HIDDEN = 256
PROBE_ROWS = 512  # tokens per timed matmul: a few rows of an update pass
PROBE_FLOPS = 2e8  # per timing (~5 ms in fp32 here): long enough that timer and call overhead do not count


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags the kernel reports for the first CPU (empty where there is no cpuinfo)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def bf16_instructions(flags: frozenset[str]) -> tuple[str, ...]:
    """The bf16 matrix instructions among `flags` (amx_bf16 needs amx_tile to run)."""
    found = [f for f in BF16_FLAGS if f in flags]
    if "amx_bf16" in found and "amx_tile" not in found:
        found.remove("amx_bf16")
    return tuple(found)


def usable_bf16_instructions(flags: frozenset[str]) -> tuple[str, ...]:
    """The bf16 matrix instructions among `flags` that agentrl's probes may use: none where
    `AGENTRL_CPU_FEATURES=plain` makes them answer as a CPU without them (kernels/features.py)."""
    return () if requested().plain else bf16_instructions(flags)


def describe_cpu(flags: frozenset[str]) -> str:
    """One line for the log: the bf16 matrix instructions detected, what `AGENTRL_CPU_FEATURES` forces,
    torch's CPU kernel level and oneDNN's bf16 support (both follow the libraries' ISA caps)."""
    import torch

    found = bf16_instructions(flags)
    if found:
        amx = "AMX" if "amx_bf16" in found else "no AMX"
        names = ", ".join(f for f in found if f != "amx_tile") + f" ({amx})"
    else:
        names = "neither avx512_bf16 nor amx_bf16"
    features = requested()
    forced = f"; forced by {ENV}={features.forced}" if features.forced else ""
    mkldnn = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    caps = library_caps()
    return (
        f"{names}{forced}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}, oneDNN bf16 "
        f"{'yes' if mkldnn else 'no'}" + (f" ({caps})" if caps else "")
    )


@functools.cache
def autocast_speedup(hidden: int, intermediate: int, threads: int, rows: int = PROBE_ROWS) -> float:
    """fp32 seconds / bf16-autocast seconds of the MLP's up projection (rows x hidden -> intermediate) on
    `threads` threads: what bf16-mixed changes in the update's matmuls. Best of 5 timings of ~5 ms each,
    the two precisions taken in turn, so that another process's burst slows both sides of the ratio
    (timed one after the other, a burst during the bf16 timings once gave 0.91x where 2.15x is usual)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(rows, hidden)
        weight = torch.randn(intermediate, hidden)
        calls = max(1, round(PROBE_FLOPS / (2 * rows * hidden * intermediate)))

        def timed(autocast: bool) -> float:
            start = time.perf_counter()
            with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                for _ in range(calls):
                    torch.nn.functional.linear(x, weight)
            return time.perf_counter() - start

        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(6):  # the first of each is a warm-up
            for autocast in (False, True):
                times[autocast].append(timed(autocast))
        return min(times[False][1:]) / min(times[True][1:])
    finally:
        torch.set_num_threads(previous)


def fp32_without_timing(flags: frozenset[str], shapes: tuple[int, int] | None) -> str | None:
    """Why `auto` is fp32 on a CPU with these flags before anything is timed; None when the timing decides."""
    if not usable_bf16_instructions(flags):
        if bf16_instructions(flags):
            return f"no bf16 matrix instructions under {ENV}=plain"
        return "the CPU has no bf16 matrix instructions"
    if shapes is None:
        return "the model's layer sizes are unknown"
    if shapes[0] < MIN_HIDDEN:
        return f"hidden size {shapes[0]} < {MIN_HIDDEN}"
    return None


def cpu_auto_precision(
    shapes: tuple[int, int] | None, cpuinfo: str | Path = "/proc/cpuinfo"
) -> tuple[str, str]:
    """(precision, reason) for `algo.precision=auto` on a CPU: bf16-mixed where the CPU has bf16 matrix
    instructions and bf16 autocast wins at `shapes` (hidden, intermediate size); fp32 otherwise."""
    import torch

    flags = cpu_flags(cpuinfo)
    cpu = describe_cpu(flags)
    untimed = fp32_without_timing(flags, shapes)
    if untimed:
        return "fp32", f"{cpu}; {untimed}: fp32"
    assert shapes is not None
    speedup = autocast_speedup(*shapes, torch.get_num_threads())
    choice = "bf16-mixed" if speedup >= MIN_SPEEDUP else "fp32"
    return choice, (
        f"{cpu}; bf16 autocast {speedup:.2f}x fp32 at {PROBE_ROWS}x{shapes[0]}x{shapes[1]} "
        f"(switching needs {MIN_SPEEDUP}x): {choice}"
    )


@contextlib.contextmanager
def weight_casts_shared(enabled: bool = True) -> Iterator[None]:
    """Autocast's bf16 casts of the trainable weights kept for every forward inside, instead of one cast
    per forward: the forward and backward passes of one update micro-batch (the shared prompt head, the
    distinct prompts, the completions, each pass of a split micro-batch) all read the same weights.

    accelerate wraps each forward in its own autocast, whose exit drops the casts when it is the
    outermost one; holding autocast's nesting count above zero keeps them (the casts of weights that
    require grad, with their graph: each backward still reaches every weight). Backward passes run
    outside autocast as before. The weights must not change inside (no optimizer step); the casts are
    dropped on entering (one kept by an autocast still open could be of older weights) and on leaving.
    Within one backward the gradients of a weight's uses add up in bf16 before the cast's backward makes
    them fp32 (with a cast per forward, each use had its own)."""
    import torch

    if not enabled:
        yield
        return
    torch.clear_autocast_cache()
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()


def autocast_wrapped(model: Any) -> bool:
    """Whether accelerate's mixed precision wrapped `model`'s forward in autocast (it keeps the unwrapped
    one as `_original_forward`): the trained model under `algo.precision=bf16-mixed` and TRL's reference
    model, not a rollout copy (`HFCopyBackend` removes the copied wrapper)."""
    return "forward" in vars(model) and getattr(model, "_original_forward", None) is not None
