"""Single-purpose callbacks of the LLM trainer, in the manner of Stable-Baselines3's callbacks: each does
one thing at one point of the transformers Trainer loop.

`BeforeTraining` runs the evaluation before training once the Trainer has prepared the model; `EndOnLoad`
ends a resume that has nothing left to train once the checkpoint is loaded. Order
within an iteration (transformers calls them in the order added): before the optimizer step ->
`SkipEmptyUpdate`, `PPOEpochs` (value-head clipping, KL gate), `SignalSafePoints` (holds stop signals
off); after it -> `PPOEpochs` (the further epochs), `RolloutCacheReset`; the end of the step ->
`TimeLimit`, `PeriodicEval` (which may stop at a target), `CheckpointEvery` (also the last iteration); then
the Trainer logs -> `MetricsWriter` (one metrics.jsonl row, the progress line), `SignalSafePoints` (a held
signal stops training here), then saves if asked.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from agentrl import distributed as dist
from agentrl.trainers.signals import TrainingInterrupted

log = logging.getLogger(__name__)


class BeforeTraining(TrainerCallback):
    """Runs `run()` once when training begins: after the Trainer has prepared the model (the engine's
    wrapping, sharding and device placement, mixed precision's autocast), before the first iteration."""

    def __init__(self, run: Callable[[], None]):
        self.run: Callable[[], None] | None = run

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        run, self.run = self.run, None
        if run is not None:
            run()
        return control


class TrainingEnded(Exception):
    """Raised by `EndOnLoad`: the resumed run has no iteration left to train."""


class EndOnLoad(TrainerCallback):
    """Ends `Trainer.train` as soon as it has loaded the checkpoint it resumes from (every engine has
    loaded the weights by `on_train_begin`), before any iteration: a run that had already stopped at its
    target or its time limit when it was killed has only its final model and eval left. The Trainer
    checks its stop flag only after an iteration, hence the exception (`TrainingEnded`), which the caller
    catches."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        raise TrainingEnded


class RolloutCacheReset(TrainerCallback):
    """Tells the rollout backend that the weights changed, so it drops what it computed with the old ones
    (prefix KV states, one-token logits). Fused optimizers update in place without moving the parameters'
    version counters, so the backend cannot see the change by itself."""

    def __init__(self, *backends: Any):
        self.backends = [b for b in backends if b is not None]

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        for backend in self.backends:
            changed = getattr(backend, "weights_changed", None)
            if changed is not None:
                changed()
        return control


class SkipEmptyUpdate(TrainerCallback):
    """An iteration without training rows (no informative group) takes no optimizer step. Its gradient
    is zero, but Adam's momentum from earlier iterations would still move the weights; parameters
    without a gradient are left alone by torch's optimizers."""

    def __init__(self, is_empty: Callable[[], bool]):
        self.is_empty = is_empty

    def on_pre_optimizer_step(
        self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> Any:
        if self.is_empty() and model is not None:
            for param in model.parameters():
                param.grad = None
        return control


class PPOEpochs(TrainerCallback):
    """Before every optimizer step, `before_step(model)` (the value head's clipping, the KL gate); after
    the iteration's step, `more_epochs(model)` runs its remaining PPO epochs over the same rows."""

    def __init__(self, before_step: Callable[[Any], None], more_epochs: Callable[[Any], None]):
        self.before_step, self.more_epochs = before_step, more_epochs

    def on_pre_optimizer_step(
        self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> Any:
        self.before_step(model)
        return control

    def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        self.more_epochs(model)
        return control


class TimeLimit(TrainerCallback):
    """The run's training clock, and a stop after the iteration that crosses `seconds` on it. The clock
    starts at `on_train_begin` (after the eval before training) from `used`: a resume passes the time
    logged at its checkpoint's iteration (rundir.metrics_time_at), so the limit is the whole run's and
    iterations redone after a kill count once. MetricsWriter writes this clock as `time_s`."""

    def __init__(self, seconds: float | None, used: float = 0.0):
        self.seconds, self.used = seconds, float(used)
        self.start = time.perf_counter()
        self.reached = False  # training stopped here (fewer iterations than asked is then expected)

    @property
    def spent(self) -> bool:
        """The limit was crossed before this part began (a resume from the iteration that crossed it)."""
        return bool(self.seconds) and self.used >= self.seconds

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.start = time.perf_counter()
        return control

    def clock(self) -> float:
        """Training seconds of the run so far, every part included."""
        return self.used + time.perf_counter() - self.start

    def seconds_left(self) -> float | None:
        """Training seconds left before the limit (None without one); the iteration that crosses it
        still finishes."""
        if not self.seconds:
            return None
        return max(self.seconds - self.clock(), 0.0)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # every process stops after the same iteration (their clocks differ a little)
        if dist.any_true(bool(self.seconds) and self.clock() >= self.seconds):
            log.info("Time limit reached after iteration %d: stopping", state.global_step)
            control.should_training_stop = self.reached = True
        return control


class PeriodicEval(TrainerCallback):
    """Every `every` iterations (not the last: the final evaluation follows training), runs `evaluate`
    and puts its metrics, prefixed `eval/`, into `pending`, which `MetricsWriter` adds to the iteration's
    row. With `stop_at`, training stops after the eval whose success rate reaches it (`reached`)."""

    def __init__(
        self,
        every: int,
        evaluate: Callable[[int], dict[str, Any]],
        pending: dict[str, Any],
        stop_at: float | None = None,
    ):
        self.every, self.evaluate, self.pending, self.stop_at = every, evaluate, pending, stop_at
        self.reached = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = state.global_step
        if (
            self.every
            and step % self.every == 0
            and step < state.max_steps
            and not control.should_training_stop
        ):
            metrics = self.evaluate(step)
            self.pending.update({f"eval/{k}": v for k, v in metrics.items()})
            success = metrics.get("success_rate")
            # every process plays a share of the seeds and gets the same metrics back: all stop together
            if self.stop_at is not None and success is not None and success >= self.stop_at:
                log.info("Eval success %.3f >= %g after iteration %d: stopping", success, self.stop_at, step)
                control.should_training_stop = self.reached = True
        return control


class CheckpointEvery(TrainerCallback):
    """Asks the Trainer to save a checkpoint every `every` iterations and after the last one (the end of
    `algo.iterations`, a time limit, a target reached; add it after the callbacks that stop training), so
    that a run extended later (`resume=<run> algo.iterations=<more>`) continues from its newest state."""

    def __init__(self, every: int):
        self.every = every

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = state.global_step
        if self.every and (step % self.every == 0 or step >= state.max_steps or control.should_training_stop):
            control.should_save = True
        return control


class SignalSafePoints(TrainerCallback):
    """Lets a stop signal (`signals.StopSignals`) interrupt training only where the saved state is
    consistent: from the optimizer step until the iteration's metrics row is written, the weights have
    moved but metrics.jsonl does not show it yet, so a signal is held until `on_log` (add this callback
    after `MetricsWriter`). Each iteration's start checks again, for a signal whose exception an
    `except Exception` somewhere swallowed."""

    def __init__(self, stop: Any):
        self.stop = stop

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.stop.collective:
            # several processes: all stop at the same iteration when any of them got a signal
            if dist.any_true(self.stop.stopping):
                raise TrainingInterrupted(self.stop.received or signal.SIGTERM)
            return control
        self.stop.check()
        return control

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.stop.hold()
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        self.stop.release()
        return control


class MetricsWriter(TrainerCallback):
    """Writes each iteration's log row (TRL's loss statistics + the rollout metrics + pending periodic
    eval) to the run's MetricsLog and advances the progress bar with a one-line summary. `time_left`
    (TimeLimit.seconds_left) bounds the bar's ETA: a run that stops on its time limit ends within the
    time left plus one more iteration, however many iterations `algo.iterations` allows. `clock`
    (TimeLimit.clock) gives the rows' `time_s`."""

    def __init__(
        self,
        metrics_log: Any,
        bar: Any,
        pending: dict[str, Any],
        rename: dict[str, str] | None = None,
        time_left: Callable[[], float | None] | None = None,
        clock: Callable[[], float] | None = None,
    ):
        self.metrics_log, self.bar, self.pending = metrics_log, bar, pending
        self.rename = rename or {}
        self.time_left, self.clock = time_left, clock

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        if not logs or "train_runtime" in logs:  # the Trainer's end-of-training summary
            return control
        row = {self.rename.get(k, k): v for k, v in logs.items()}
        row.update(self.pending)
        self.pending.clear()
        self.metrics_log.log(state.global_step, row, self.clock() if self.clock is not None else None)
        left = self.time_left() if self.time_left is not None else None
        if left is not None:
            left += float(row.get("iteration_s") or 0.0)  # the iteration that crosses the limit
        self.bar.advance(self.progress_line(row), eta_s=left)
        return control

    @staticmethod
    def progress_line(row: dict[str, Any]) -> str:
        """The iteration's key numbers for the progress line (metrics.jsonl has all of them)."""
        line = (
            f"success {row.get('train/success_rate', 0):.2f} return {row.get('train/mean_return', 0):.2f}"
            f" invalid {row.get('train/invalid_rate', 0):.2f}"
            f" zero-var {row.get('zero_variance_groups', 0)}/{row.get('groups', 0)}"
            f" kept {row.get('episodes_kept', 0)} loss {row.get('loss', 0):.4f}"
            f" iteration {row.get('iteration_s', 0):.1f}s"
        )
        if "eval/success_rate" in row:
            line += f" | eval success {row['eval/success_rate']:.2f} return {row['eval/mean_return']:.2f}"
        return line


__all__ = [
    "BeforeTraining",
    "CheckpointEvery",
    "MetricsWriter",
    "PPOEpochs",
    "PeriodicEval",
    "RolloutCacheReset",
    "SignalSafePoints",
    "SkipEmptyUpdate",
    "TimeLimit",
]
