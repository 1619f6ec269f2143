"""Stop a training run cleanly on SIGTERM (timeouts, `scancel`, SLURM pre-emption), SIGINT (Ctrl-C) and
SIGUSR1 (SLURM's warning signal with `sbatch --signal=USR1@60`): the trainer saves a checkpoint of the
last finished iteration, then the run exits with 128 + the signal number (143 for SIGTERM, 130 for
Ctrl-C), as a process killed by that signal would.

`StopSignals` installs the handlers for the duration of training and restores the previous ones after.
A signal raises `TrainingInterrupted` at once, except while the trainer holds it off (`hold()` ...
`release()`), when it only records that training must stop. The LLM trainer holds signals from an
optimizer step until that iteration's metrics row is written (in between, the weights, the optimizer
and metrics.jsonl disagree); the DQN trainer holds them throughout and stops within `train_freq` env
steps, which take milliseconds (an exception inside SB3's loop could leave a half-stored transition or
a half-copied target network). After the first signal, SIGTERM and SIGUSR1 are ignored (the checkpoint
is being written) and a second Ctrl-C quits at once (the atomic write leaves no half-written checkpoint
behind).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from agentrl.errors import TrainingInterrupted, signal_name

log = logging.getLogger(__name__)

STOP_SIGNALS: tuple[int, ...] = tuple(
    s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None
)


class StopSignals:
    """Context manager: while active, the stop signals raise `TrainingInterrupted` (see the module doc).
    Outside the main thread, where Python cannot install handlers, it does nothing; a signal the process
    ignores when it starts stays ignored."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS, *, collective: bool = False):
        self.signals = signals
        self.collective = collective
        self.received: int | None = None
        self._held = collective
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                # an ignored signal stays ignored (a background job of a shell script ignores SIGINT)
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            log.warning("%s again: already stopping (Ctrl-C twice quits without saving)", signal_name(signum))
            return
        self.received = signum
        if self._held:
            log.warning("%s: stopping at the next safe point, then saving a checkpoint", signal_name(signum))
            return
        log.warning("%s: stopping, then saving a checkpoint", signal_name(signum))
        raise TrainingInterrupted(signum)

    @property
    def stopping(self) -> bool:
        return self.received is not None

    def hold(self) -> None:
        """From here until `release()`, a signal only records that training must stop."""
        self._held = True

    def release(self) -> None:
        """End a `hold()`; a signal received during it raises now. Collective: several processes stop
        only together, so a signal stays held until `SignalSafePoints` asks them all."""
        if self.collective:
            return
        self._held = False
        self.check()

    def check(self) -> None:
        """Raise `TrainingInterrupted` if a signal came and nothing holds it off (a safe point; it also
        catches a signal whose exception some `except Exception` swallowed)."""
        if self.received is not None and not self._held:
            raise TrainingInterrupted(self.received)


__all__ = ["STOP_SIGNALS", "StopSignals", "TrainingInterrupted", "signal_name"]
