"""What every layer's checks before launch share.

Each layer owns the checks of what it builds, as one function `prelaunch_check(cfg, machine)` in its
package (`agentrl.runs.launch.PRELAUNCH_CHECKS` names them in the order the runner walks them). A check
raises a ConfigError for a config rule (the job is refused at once), and hands a check of what this
machine and its files provide (a model's weights, a library, CUDA, a trained run) to `machine`, which
raises it too, or, for `--dry-run`, collects it so that every such problem is listed at once.

The two probes are called through this module (`checks.cuda_available()`), so a test can stand in for a
machine with or without CUDA or a library.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

#: `machine(check, *args)`: run `check(*args)`, a check of what this machine or its files provide
Machine = Callable[..., None]


#: the device nodes through which Linux processes reach a GPU torch can use as CUDA: NVIDIA's driver,
#: ROCm's, WSL2's and Jetson's
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg", "/dev/nvmap")


def cuda_available() -> bool:
    """Whether torch sees a CUDA (or ROCm) GPU. On Linux without any GPU device node it cannot, and the
    answer comes without importing torch (1-2 s, which the checks before launch and --dry-run save)."""
    if sys.platform.startswith("linux") and "torch" not in sys.modules:
        if not any(os.path.exists(node) for node in GPU_DEVICE_NODES):
            return False
    import torch

    return torch.cuda.is_available()


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def trains_llm(cfg: Any) -> bool:
    """Whether the job trains a language model (every trainer but DQN's)."""
    return cfg.task == "train" and cfg.get("algo") is not None and cfg.algo.name != "dqn"


def uses_llm(cfg: Any) -> bool:
    """Whether the job generates with a language model (LLM training, or an eval of agent=llm)."""
    return trains_llm(cfg) if cfg.task == "train" else cfg.agent.name == "llm"
