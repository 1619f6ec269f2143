"""The policy updates: the multi-step LLM trainer on TRL (`multistep.py` and the modules it uses), SFT
warm-ups on TRL's SFTTrainer (`sft.py`) and DQN on Stable-Baselines3 (`dqn.py`). They receive the env
factory from the runner and import no env module."""

from __future__ import annotations

from typing import Any


def prelaunch_check(cfg: Any, machine: Any) -> None:
    """What a trainer needs of the env before launch: SFT's demonstrator must play it."""
    if cfg.task == "train" and cfg.algo.name == "sft":
        from agentrl.trainers.sft import check_sft

        check_sft(cfg)
