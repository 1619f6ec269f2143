"""Small helpers several test modules share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
