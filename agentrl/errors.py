"""Typed exceptions. Library code raises these; only cli.py turns them into a one-line message."""

from typing import Any


class AgentRLError(Exception):
    """Base class: a problem the user can fix (bad config, missing package, bad run directory)."""

    exit_code = 2


class ConfigError(AgentRLError):
    """A config key, group option or value is wrong."""


class UnknownChoiceError(ConfigError):
    """A name is not one of the valid choices; the message lists them."""

    def __init__(self, kind: str, value: object, choices: list[str] | tuple[str, ...]):
        self.kind, self.value, self.choices = kind, value, list(choices)
        super().__init__(f"unknown {kind} {value!r}; valid choices: {', '.join(map(str, self.choices))}")


class ModelLoadError(AgentRLError):
    """A model or tokenizer cannot be loaded (missing package, no local files, bad path)."""


class RunDirError(AgentRLError):
    """A run directory is missing, incomplete or corrupt (for resume, eval of a checkpoint, report)."""


class BackendError(AgentRLError):
    """A generation backend failed (HTTP endpoint unreachable, vLLM missing)."""


def signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class TrainingIncomplete(AgentRLError):
    """Training ended with fewer iterations than the run asked for, without a stop signal, its time limit
    or its target success (algo.stop_at_success): the run fails rather than report the model it has."""

    exit_code = 1


class TrainingInterrupted(AgentRLError):
    """Training stopped on a signal; the exit code is 128 + the signal number."""

    def __init__(self, signum: int, message: str | None = None):
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(message or f"stopped by {signal_name(self.signum)}")

    def __reduce__(self) -> tuple[Any, ...]:  # multirun launchers pickle a job's exception
        return (type(self), (self.signum, str(self)))
