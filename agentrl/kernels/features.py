"""Which CPU fast paths run: all that this CPU supports by default, fewer where `AGENTRL_CPU_FEATURES` says.

Every CPU fast path has a plain fallback that computes the same thing (the tests compare the two):

- `plain`: the probes answer as a CPU without bf16 matrix instructions would (an AVX2 laptop or VM): no
  AVX512-BF16, no AMX, no oneDNN bf16 kernels. `algo.precision=auto` then trains in fp32 and linear
  weights are never packed in bf16. The bf16 flags are hidden from agentrl's probes only; torch's own
  kernels still use what the CPU has, so timings are not an AVX2 CPU's. To run the kernels as on an
  AVX2 CPU as well, set the libraries' own caps before torch starts: `ATEN_CPU_CAPABILITY=avx2`
  (ATen's vectorised kernels), `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN: packed linears, its bf16 support) and
  `MKL_ENABLE_INSTRUCTIONS=AVX2` (MKL's fp32 matmuls). agentrl does not set them itself: they take
  effect only if set before torch loads its libraries, which an imported package cannot promise.
- `no-<path>` switches one fast path off (`FAST_PATHS`): `no-packs`, `no-packed-attention`,
  `no-sparse-embedding`, `no-rollout-graph`.
- `none`: `plain` and every fast path off.
- `auto` (the default, also an empty value): everything this CPU supports.

Names combine with commas (`plain,no-rollout-graph`). The value is read whenever a path decides (it is a
string split, cheap), so a test can set it with monkeypatch; a wrong name is a `ConfigError` listing the
valid ones, raised before launch (`agentrl.runs.launch.prelaunch_check`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from agentrl.errors import ConfigError

ENV = "AGENTRL_CPU_FEATURES"

#: the fast paths that switch off one by one, and where each lives
FAST_PATHS = {
    "packs": "linear weights packed once for oneDNN in no-grad forwards (kernels/packed.py)",
    "packed-attention": "query heads packed over the key/value heads in CPU attention (kernels/attention.py)",
    "sparse-embedding": "the tied embedding's sparse gradients (trainers/grpo_trainer.py)",
    "rollout-graph": "the update backpropagates through the rollout's forward (algo.rollout_graph)",
}
#: the ISA caps that make torch's own kernels run as on an AVX2 CPU (set before torch loads)
LIBRARY_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


@dataclass(frozen=True)
class CpuFeatures:
    """What `AGENTRL_CPU_FEATURES` asks for: `plain` hides the bf16 matrix instructions from the probes;
    `off` names the fast paths switched off."""

    plain: bool = False
    off: frozenset[str] = frozenset()

    def enabled(self, path: str) -> bool:
        if path not in FAST_PATHS:
            raise KeyError(path)
        return path not in self.off

    @property
    def forced(self) -> str | None:
        """What is forced, for the log (None: nothing, `auto`)."""
        names = (["plain"] if self.plain else []) + [f"no-{p}" for p in FAST_PATHS if p in self.off]
        return ",".join(names) or None


def valid_names() -> list[str]:
    return ["auto", "plain", "none", *(f"no-{p}" for p in FAST_PATHS)]


@functools.cache
def parse(value: str) -> CpuFeatures:
    """The features a value of `AGENTRL_CPU_FEATURES` asks for; ConfigError for a name it does not know."""
    plain, off = False, set()
    for name in (n.strip().lower() for n in value.split(",")):
        if name in ("", "auto"):
            continue
        if name == "plain":
            plain = True
        elif name == "none":
            plain, off = True, set(FAST_PATHS)
        elif name.startswith("no-") and name[3:] in FAST_PATHS:
            off.add(name[3:])
        else:
            raise ConfigError(
                f"{ENV}={value}: unknown name {name!r}; valid choices: {', '.join(valid_names())}"
            )
    return CpuFeatures(plain, frozenset(off))


def requested() -> CpuFeatures:
    """What the environment asks for now."""
    return parse(os.environ.get(ENV, ""))


def fast_path(path: str) -> bool:
    """Whether the fast path `path` (a key of FAST_PATHS) may run."""
    return requested().enabled(path)


def library_caps() -> str | None:
    """The ISA caps set in the environment, for the log (None: none)."""
    caps = [f"{name}={os.environ[name]}" for name in LIBRARY_CAPS if os.environ.get(name)]
    return ", ".join(caps) or None


__all__ = ["ENV", "FAST_PATHS", "LIBRARY_CAPS", "CpuFeatures", "fast_path", "parse", "requested"]
