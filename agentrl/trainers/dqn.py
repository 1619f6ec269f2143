"""DQN baseline: Stable-Baselines3's DQN on an env's numeric observation (docs/algorithms.md).

The seed paper reports a DQN agent ahead of the LLM agents on Snake; this is that baseline, trained
and evaluated with the same env, the same held-out seeds and the same eval code as every other agent.
The Q-network reads `env.numeric_observation()` (Snake: 26 compact features, see envs/snake.py), and
agents/dqn.py plays a saved model (`agentrl eval agent=dqn agent.path=<run dir>`). What a run writes
into its run directory:

- `metrics.jsonl` + `tb/` (runlog.MetricsLog): every `log_every` env steps, the rollout stats over the
  last 100 training episodes (mean_return, success_rate, mean_length) and SB3's train stats (loss,
  exploration_rate, ...); iteration = env steps.
- `sb3/` SB3's own logger output (progress.csv, TensorBoard), for people who know SB3's keys.
- `checkpoint-<steps>.zip` every `checkpoint_every` steps (SB3 zip, written atomically), with
  `checkpoint-<steps>.json` (steps, train time), when `save_replay_buffer` the newest
  `checkpoint-<steps>.replay.pkl`, and last `checkpoint-<steps>.manifest.json` (sizes and
  fingerprints of those files): resume takes the newest checkpoint whose manifest checks out (runlog).
- SIGTERM, SIGINT or SIGUSR1 (signals.py) stop training within `train_freq` env steps, save a
  checkpoint there and raise `TrainingInterrupted` (the run exits with 128 + the signal number).
- `eval_before.json`: the untrained Q-network's greedy eval (eval.json's `before`; `algo.eval_before`).
- `final/model.zip` + `final/dqn.json` (env, steps, train time), then `eval.json` / `episodes.jsonl`
  from evaluation.evaluate on the held-out seeds. A resume that asks for more steps continues from the
  newest of the last checkpoint and final/ (`resume_point`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.agents.dqn import FINAL_MODEL, DQNAgent
from agentrl.envs.base import NumericObservation
from agentrl.errors import ConfigError
from agentrl.runs.rundir import shell_override
from agentrl.runs.runlog import (
    atomic_dir,
    atomic_file,
    manifest_path,
    newest_valid_checkpoint,
    write_manifest,
)
from agentrl.trainers.signals import StopSignals, TrainingInterrupted, signal_name
from agentrl.types import EnvFactory, TrainResult

log = logging.getLogger(__name__)

#: config keys that are ours, not SB3 DQN constructor arguments
_OWN_KEYS = frozenset(
    {
        "name",
        "total_timesteps",
        "net_arch",
        "log_every",
        "checkpoint_every",
        "save_replay_buffer",
        "device",
        "torch_threads",
        "eval_before",
    }
)


class TrainingEpisodes(gym.Wrapper):
    """Seeds every training episode from its own stream, below `seed_offset`, so training never plays
    a held-out eval seed (evaluation.eval_seeds uses seed_offset and up); reports the env's `success`
    as SB3's `is_success` at episode end (SB3 then logs rollout/success_rate)."""

    def __init__(self, env: gym.Env, seed: int, seed_offset: int):
        super().__init__(env)
        self._rng = np.random.default_rng([int(seed), 7919])
        self._limit = max(1, int(seed_offset))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        return self.env.reset(seed=int(self._rng.integers(self._limit)), options=options)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            info = {**info, "is_success": bool(info.get("success", False))}
        return obs, reward, terminated, truncated, info


def training_env(cfg: Any, env_factory: EnvFactory, seed_stream: int) -> gym.Env:
    """The env SB3 trains on: numeric observations, training seeds, Monitor (episode returns)."""
    from stable_baselines3.common.monitor import Monitor

    env = env_factory(cfg.env)()
    wrapped = TrainingEpisodes(
        NumericObservation(env), seed=seed_stream, seed_offset=int(cfg.eval.seed_offset)
    )
    return Monitor(wrapped)


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------
def save_checkpoint(model: Any, run_dir: Path, steps: int, train_time_s: float, save_replay: bool) -> Path:
    """checkpoint-<steps>.zip (+ .json, + newest .replay.pkl), each written atomically, then the manifest
    that vouches for them. A manifest left by an earlier checkpoint of the same step goes first, so it
    never describes the new files."""
    run_dir = Path(run_dir)
    final = run_dir / f"checkpoint-{steps}.zip"
    meta = run_dir / f"checkpoint-{steps}.json"
    replay = run_dir / f"checkpoint-{steps}.replay.pkl"
    manifest_path(final).unlink(missing_ok=True)
    if save_replay:
        with atomic_file(replay) as tmp:
            model.save_replay_buffer(tmp)
    with atomic_file(meta) as tmp:
        tmp.write_text(
            json.dumps({"steps": int(steps), "train_time_s": round(float(train_time_s), 3)}) + "\n"
        )
    with atomic_file(final) as tmp:  # the temp name ends in .zip, so SB3 keeps it as given
        model.save(tmp)
    # the replay buffer is optional in the manifest: the next checkpoint deletes it
    write_manifest(final, (meta,), (replay,) if save_replay else (), step=steps)
    # Replay buffers are large: keep only the newest one.
    for old in run_dir.glob("checkpoint-*.replay.pkl"):
        if old != replay:
            old.unlink(missing_ok=True)
    log.info("checkpoint %s", final)
    return final


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------
def _plain(node: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
    return dict(node)


def _rollout_stats(model: Any) -> dict[str, float]:
    """Training-episode stats over SB3's window (the last 100 episodes)."""
    stats: dict[str, float] = {"episodes": float(model._episode_num)}
    if model.ep_info_buffer:
        stats["mean_return"] = float(np.mean([ep["r"] for ep in model.ep_info_buffer]))
        stats["mean_length"] = float(np.mean([ep["l"] for ep in model.ep_info_buffer]))
    if model.ep_success_buffer:
        stats["success_rate"] = float(np.mean(model.ep_success_buffer))
    return stats


def _callback(
    run_dir: Path,
    metrics: Any,
    bar: Any,
    *,
    log_every: int,
    checkpoint_every: int,
    save_replay: bool,
    time_offset: float,
    stop: StopSignals,
):
    """One SB3 callback for the progress bar, the metrics.jsonl mirror, checkpoints, and stopping soon
    after a stop signal (the row and checkpoint of the step it stops at are written first)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RunCallback(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()
            self.pending = 0
            self.line = ""
            self.saved: int | None = None  # steps of the newest checkpoint this run wrote

        def save(self, steps: int) -> None:
            save_checkpoint(self.model, run_dir, steps, self.train_time(), save_replay)
            self.saved = steps

        def train_time(self) -> float:
            return time_offset + time.perf_counter() - self.start

        def _on_step(self) -> bool:
            steps = int(self.num_timesteps)
            self.pending += 1
            if steps % log_every == 0:
                self.log_metrics(steps)
            if checkpoint_every > 0 and steps % checkpoint_every == 0:
                self.save(steps)
            if self.pending >= 100:  # a rich update per env step would cost more than the step
                bar.advance(self.line, n=self.pending)
                self.pending = 0
            return not self.stop_here(steps)  # False ends model.learn

        def stop_here(self, steps: int) -> bool:
            """After a stop signal, at the end of the current `train_freq` chunk of env steps, so a
            resumed run keeps SB3's cadence and ends exactly at total_timesteps."""
            freq = self.model.train_freq
            aligned = freq.unit.value != "step" or steps % max(int(freq.frequency), 1) == 0
            return stop.stopping and aligned

        def log_metrics(self, steps: int) -> None:
            row = _rollout_stats(self.model)
            sb3 = self.model.logger.name_to_value
            for key, ours in (
                ("train/loss", "loss"),
                ("rollout/exploration_rate", "exploration_rate"),
                ("train/learning_rate", "learning_rate"),
                ("train/n_updates", "n_updates"),
            ):
                if key in sb3:
                    row[ours] = float(sb3[key])
            row["train_time_s"] = round(self.train_time(), 3)
            metrics.log(steps, row, time_s=self.train_time())  # the clock its checkpoints carry on
            self.model.dump_logs()  # SB3's own csv/tensorboard rows at the same step
            self.line = " ".join(
                f"{k} {row[k]:.3g}"
                for k in ("mean_return", "success_rate", "exploration_rate", "loss")
                if k in row
            )

        def _on_training_end(self) -> None:
            if self.pending:
                bar.advance(self.line, n=self.pending)
                self.pending = 0

    return RunCallback()


def train_dqn(cfg: Any, run_dir: Path, env_factory: EnvFactory, resume: bool = False) -> TrainResult:
    """Train SB3 DQN on the env `env_factory` builds for cfg.env with cfg.algo (conf/algo/dqn.yaml),
    checkpointing into `run_dir`; with `resume`, continue from the newest complete checkpoint up to
    total_timesteps. Then evaluate the greedy policy on the held-out seeds. Returns the eval metrics and
    episodes, with `total_timesteps` and `train_time_s` as the extra fields of eval.json."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import configure

    from agentrl.evaluation import eval_seeds, evaluate
    from agentrl.runs.runlog import MetricsLog, progress

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    algo = _plain(cfg.algo)
    env_name = str(cfg.env.name)
    total = int(algo["total_timesteps"])
    log_every = max(1, int(algo.get("log_every", 1000)))
    checkpoint_every = int(algo.get("checkpoint_every", 0) or 0)
    device = str(algo.get("device", "cpu"))
    seed = int(cfg.seed)
    if total < 1:
        raise ConfigError(f"algo.total_timesteps must be >= 1, got {total}")

    checkpoint = resume_point(run_dir) if resume else None
    if resume and checkpoint is None:
        log.warning("resume: no usable checkpoint in %s; training from the start", run_dir)
    start_steps, time_offset = 0, 0.0
    threads = algo.get("torch_threads")
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        if checkpoint is not None:
            path, start_steps, time_offset = checkpoint
            env = training_env(cfg, env_factory, seed_stream=seed * 1_000_003 + start_steps)
            model = DQN.load(path, env=env, device=device)
            replay = run_dir / f"checkpoint-{start_steps}.replay.pkl"
            if replay.is_file():
                model.load_replay_buffer(replay)
            else:
                log.warning(
                    "resume: no replay buffer for step %d; refilling it from new experience", start_steps
                )
            sb3_dir = run_dir / "sb3" / f"resume-{start_steps}"
            log.info("resuming %s from step %d of %d", run_dir, start_steps, total)
        else:
            env = training_env(cfg, env_factory, seed_stream=seed)
            kwargs = {k: v for k, v in algo.items() if k not in _OWN_KEYS}
            model = DQN(
                "MlpPolicy",
                env,
                policy_kwargs={"net_arch": list(algo.get("net_arch", [64, 64]))},
                seed=seed,
                device=device,
                verbose=0,
                **kwargs,
            )
            sb3_dir = run_dir / "sb3"
        # SB3's CSV writer truncates its file: a resumed run writes its own sub-folder.
        model.set_logger(configure(str(sb3_dir), ["csv", "tensorboard"]))
        before = (
            _eval_before(cfg, env_factory, model, run_dir) if bool(algo.get("eval_before", True)) else None
        )
        metrics = MetricsLog(run_dir, resume=checkpoint is not None)
        remaining = max(0, total - int(model.num_timesteps))
        save_replay = bool(algo.get("save_replay_buffer", False))
        stop = StopSignals()
        stop.hold()  # signals only ask; the callback stops at the next env step
        try:
            with stop, progress(f"train dqn {env_name}", total=total) as bar:
                if start_steps:
                    bar.advance(f"resumed at step {start_steps}", n=start_steps)
                callback = _callback(
                    run_dir,
                    metrics,
                    bar,
                    log_every=log_every,
                    checkpoint_every=checkpoint_every,
                    save_replay=save_replay,
                    time_offset=time_offset,
                    stop=stop,
                )
                start = time.perf_counter()
                if remaining:
                    model.learn(
                        total_timesteps=remaining,
                        callback=callback,
                        log_interval=None,  # our callback dumps SB3's logs every log_every steps
                        reset_num_timesteps=checkpoint is None,
                    )
                train_time_s = time_offset + time.perf_counter() - start
                if stop.received is not None:
                    steps = int(model.num_timesteps)
                    if getattr(callback, "saved", None) != steps:  # not saved at this very step
                        log.warning("%s: saving checkpoint-%d.zip", signal_name(stop.received), steps)
                        save_checkpoint(model, run_dir, steps, train_time_s, save_replay)
                    raise TrainingInterrupted(
                        stop.received,
                        f"stopped by {signal_name(stop.received)} at step {steps}: checkpoint-{steps}.zip"
                        f" is saved; continue with: agentrl train {shell_override('resume', run_dir)}",
                    )
        finally:
            metrics.close()
            env.close()
        final = run_dir / FINAL_MODEL
        with atomic_dir(final.parent) as tmp:
            model.save(tmp / final.name)
            (tmp / "dqn.json").write_text(
                json.dumps(
                    {
                        "env": env_name,
                        "steps": int(model.num_timesteps),
                        "train_time_s": round(train_time_s, 3),
                    }
                )
                + "\n",
                encoding="utf-8",
            )

        agent = DQNAgent(model)
        eval_metrics, episodes = evaluate(
            env_factory(cfg.env),
            agent,
            eval_seeds(cfg),
            lockstep=bool(cfg.eval.get("lockstep", True)),
            description=f"eval dqn {env_name}",
        )
    finally:
        torch.set_num_threads(old_threads)
    extra: dict[str, Any] = {
        "total_timesteps": int(model.num_timesteps),
        "train_time_s": round(train_time_s, 3),
    }
    if before is not None:
        extra["before"] = before
    return TrainResult(eval_metrics, episodes, extra)


def resume_point(run_dir: Path) -> tuple[Path, int, float] | None:
    """Where a resumed run continues: (model zip, env steps, train time so far) of the newest intact
    checkpoint-N.zip or of final/model.zip, whichever holds more steps (a complete run that is asked
    for more steps continues from its final model, not from an older checkpoint). None: neither."""
    points = []
    checkpoint = newest_valid_checkpoint(run_dir, kind="zip")
    if checkpoint is not None:
        meta = checkpoint.with_suffix(".json")
        seconds = float(json.loads(meta.read_text()).get("train_time_s", 0.0)) if meta.is_file() else 0.0
        points.append((checkpoint, int(checkpoint.stem.split("-")[1]), seconds))
    final, sidecar = run_dir / FINAL_MODEL, run_dir / FINAL_MODEL.parent / "dqn.json"
    if final.is_file() and sidecar.is_file():
        saved = json.loads(sidecar.read_text(encoding="utf-8"))
        seconds = saved.get("train_time_s")
        if seconds is None:  # a final model saved without its time: eval.json has it
            with contextlib.suppress(OSError, ValueError):
                seconds = json.loads((run_dir / "eval.json").read_text()).get("train_time_s")
        points.append((final, int(saved["steps"]), float(seconds or 0.0)))
    return max(points, key=lambda p: p[1]) if points else None


def _eval_before(cfg: Any, env_factory: EnvFactory, model: Any, run_dir: Path) -> dict[str, Any] | None:
    """The greedy policy of the untrained Q-network on the held-out seeds (eval.json's `before`, as for
    the LLM trainers), written once to eval_before.json and read back on resume."""
    from agentrl.evaluation import eval_record, eval_seeds, evaluate
    from agentrl.runs.runlog import write_json

    path = run_dir / "eval_before.json"
    if path.is_file():
        return json.loads(path.read_text())
    if int(model.num_timesteps) > 0:  # resumed without the file: the untrained network is gone
        return None
    before = eval_record(
        *evaluate(
            env_factory(cfg.env),
            DQNAgent(model),
            eval_seeds(cfg),
            lockstep=bool(cfg.eval.get("lockstep", True)),
            description=f"eval dqn {cfg.env.name} before training",
        )
    )
    write_json(path, before)
    model.policy.set_training_mode(True)  # DQNAgent switched it off for playing
    return before


def snake_apples(episodes: Sequence[Any]) -> float:
    """Mean apples eaten per Snake episode (the final state's score)."""
    scores = [float(ep.final_info.get("state", {}).get("score", 0)) for ep in episodes]
    return float(np.mean(scores)) if scores else 0.0


__all__ = [
    "TrainingEpisodes",
    "save_checkpoint",
    "snake_apples",
    "train_dqn",
    "training_env",
]
