"""DQN baseline: Stable-Baselines3's DQN on an env's numeric observation (DESIGN.md "Training").

The seed paper (ALGORITHMS.md §1, results) reports a DQN agent ahead of the LLM agents on Snake; this is
that baseline, trained and evaluated with the same env, the same held-out seeds and the same eval code
as every other agent. What a run writes into its run directory:

- `metrics.jsonl` + `tb/` (runlog.MetricsLog): every `log_every` env steps, the rollout stats over the
  last 100 training episodes (mean_return, success_rate, mean_length) and SB3's train stats (loss,
  exploration_rate, ...); iteration = env steps.
- `sb3/` SB3's own logger output (progress.csv, TensorBoard), for people who know SB3's keys.
- `checkpoint-<steps>.zip` every `checkpoint_every` steps (SB3 zip, written to a temp file then
  renamed, so a present zip is complete), with `checkpoint-<steps>.json` (steps, train time) and, when
  `save_replay_buffer`, the newest `checkpoint-<steps>.replay.pkl`.
- `final/model.zip` + `final/dqn.json`, then `eval.json` / `episodes.jsonl` from evaluation.evaluate on
  the held-out seeds.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.agents.base import PolicyAgent
from agentrl.envs import NumericObservation, TextEnv, make_env
from agentrl.errors import ConfigError, RunDirError
from agentrl.types import Decision, StepContext

log = logging.getLogger(__name__)

OBSERVATIONS = ("auto", "planes", "features")
SNAKE_ENVS = ("snake", "snake_poison")
#: config keys that are ours, not SB3 DQN constructor arguments
_OWN_KEYS = frozenset(
    {
        "name",
        "observation",
        "total_timesteps",
        "net_arch",
        "log_every",
        "checkpoint_every",
        "save_replay_buffer",
        "device",
        "torch_threads",
    }
)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.zip$")


# ---------------------------------------------------------------------------------------------
# observations
# ---------------------------------------------------------------------------------------------
SNAKE_FEATURES = 26


def snake_features(env: TextEnv) -> np.ndarray:
    """Compact Snake features read from `env.state()` (order of each 4-block: up, down, left, right).

    danger (4): the move dies now (wall, own body except the tail that moves away, enemy head/body);
    head_on (4): the target cell is next to the enemy head (it may move there: head-on collision);
    poison (4): the target cell holds a poison apple;
    apple (4): the nearest apple (Manhattan) lies up / down / left / right of the head;
    room (4): free cells reachable from the target cell (flood fill) / board cells, 0 if it dies;
    heading (4): one-hot direction of the last move; then length / board cells, and the nearest
    apple's distance / (2 * size).
    """
    from agentrl.envs.snake import DIRECTIONS, SnakeEnv

    state = env.state()
    n = int(state["size"])
    head = (int(state["head"][0]), int(state["head"][1]))
    body = [(int(r), int(c)) for r, c in state["body"]]
    # The tail leaves its cell this step unless the snake eats; with one body segment the tail is
    # the neck and reversing into it kills (SnakeEnv rules).
    blocked = set(body[:-1] if len(body) >= 2 else body)
    near_enemy: set[tuple[int, int]] = set()
    opp = state.get("opponent")
    if opp:
        opp_head = (int(opp["head"][0]), int(opp["head"][1]))
        blocked |= {opp_head} | {(int(r), int(c)) for r, c in opp["body"]}
        near_enemy = {(opp_head[0] + dr, opp_head[1] + dc) for dr, dc in DIRECTIONS.values()}
    poison = {(int(r), int(c)) for r, c in state.get("poison", [])}
    apples = [(int(r), int(c)) for r, c in state.get("apples", [])]
    free = {(r, c) for r in range(n) for c in range(n)} - blocked - {head}
    component = _component_sizes(free)
    names = list(SnakeEnv.action_names)  # up, down, left, right: the Q-network's action order too
    feats = np.zeros(SNAKE_FEATURES, dtype=np.float32)
    for k, name in enumerate(names):
        dr, dc = DIRECTIONS[name]
        cell = (head[0] + dr, head[1] + dc)
        dies = cell not in free
        feats[k] = float(dies)
        feats[4 + k] = float(cell in near_enemy)
        feats[8 + k] = float(cell in poison)
        feats[16 + k] = 0.0 if dies else component.get(cell, 0) / (n * n)
    if apples:
        ar, ac = min(apples, key=lambda a: abs(a[0] - head[0]) + abs(a[1] - head[1]))
        feats[12:16] = [ar < head[0], ar > head[0], ac < head[1], ac > head[1]]
        feats[25] = (abs(ar - head[0]) + abs(ac - head[1])) / (2 * n)
    direction = state.get("direction")
    if direction in names:
        feats[20 + names.index(direction)] = 1.0
    feats[24] = (len(body) + 1) / (n * n)
    return feats


def _component_sizes(free: set[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """Size of the 4-connected component of every free cell (one pass over the board)."""
    sizes: dict[tuple[int, int], int] = {}
    for start in free:
        if start in sizes:
            continue
        seen, stack = {start}, [start]
        while stack:
            r, c = stack.pop()
            for nxt in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if nxt in free and nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        for cell in seen:
            sizes[cell] = len(seen)
    return sizes


def resolve_observation(mode: str, env_name: str) -> str:
    """`auto` -> `features` on Snake, `planes` (the env's numeric_observation) elsewhere."""
    if mode not in OBSERVATIONS:
        raise ConfigError(f"algo.observation {mode!r}; valid choices: {', '.join(OBSERVATIONS)}")
    if mode == "auto":
        return "features" if env_name in SNAKE_ENVS else "planes"
    if mode == "features" and env_name not in SNAKE_ENVS:
        raise ConfigError(f"algo.observation=features exists for snake only; use planes for env {env_name!r}")
    return mode


def observation_fn(mode: str) -> Callable[[TextEnv], np.ndarray]:
    """The function from env to the Q-network's input for a resolved observation mode."""
    if mode == "features":
        return snake_features
    return lambda env: env.numeric_observation()


class SnakeFeatures(gym.ObservationWrapper):
    """Observations are `snake_features(env)` (SB3 side of the `features` mode)."""

    def __init__(self, env: TextEnv):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(SNAKE_FEATURES,), dtype=np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        return snake_features(self.env.unwrapped)


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


def training_env(cfg: Any, mode: str, seed_stream: int) -> gym.Env:
    """The env SB3 trains on: observation wrapper, training seeds, Monitor (episode returns)."""
    from stable_baselines3.common.monitor import Monitor

    env_cfg = _plain(cfg.env)
    env = make_env(env_cfg["name"], **{k: v for k, v in env_cfg.items() if k != "name"})
    wrapped: gym.Env = SnakeFeatures(env) if mode == "features" else NumericObservation(env)
    wrapped = TrainingEpisodes(wrapped, seed=seed_stream, seed_offset=int(cfg.eval.seed_offset))
    return Monitor(wrapped)


# ---------------------------------------------------------------------------------------------
# the agent
# ---------------------------------------------------------------------------------------------
class DQNAgent(PolicyAgent):
    """Greedy policy of a trained SB3 DQN. Illegal argmax actions (tic-tac-toe: an occupied cell) are
    replaced by the legal action with the highest Q-value. `act` scores all episodes of a lockstep
    batch in one forward pass."""

    name = "dqn"

    def __init__(self, model: Any, observation: Callable[[TextEnv], np.ndarray] | None = None):
        self.model = model
        self.observe = observation or (lambda env: env.numeric_observation())
        model.policy.set_training_mode(False)

    def q_values(self, observations: np.ndarray) -> np.ndarray:
        """Q-values, shape (batch, actions)."""
        import torch

        with torch.no_grad():
            obs, _ = self.model.policy.obs_to_tensor(observations)
            return self.model.policy.q_net(obs).cpu().numpy()

    @staticmethod
    def _valid(ctx: StepContext) -> list[int]:
        valid = [ctx.env.action_index(a) for a in ctx.info.get("valid_actions", [])]
        return valid or list(range(len(ctx.env.action_names)))  # none listed: every action

    def choose(self, ctx: StepContext) -> int:
        obs = self.observe(ctx.env)
        action, _ = self.model.predict(obs, deterministic=True)
        valid = self._valid(ctx)
        if int(action) in valid:
            return int(action)
        q = self.q_values(obs[None])[0]
        return max(valid, key=lambda i: q[i])

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        if not contexts:
            return []
        q = self.q_values(np.stack([self.observe(ctx.env) for ctx in contexts]))
        # argmax over the legal actions = predict(deterministic=True) whenever its action is legal
        return [
            Decision(action=max(self._valid(ctx), key=lambda i: row[i]))
            for ctx, row in zip(contexts, q, strict=True)
        ]


def load_dqn_agent(
    path: Path, env_name: str, observation: str | None = None, device: str = "cpu"
) -> DQNAgent:
    """A DQNAgent from a saved SB3 zip (`final/model.zip` or `checkpoint-N.zip`). The observation mode
    is read from `final/dqn.json` / `checkpoint-N.json` next to it when not given."""
    from stable_baselines3 import DQN

    path = Path(path)
    if not path.is_file():
        raise RunDirError(f"no DQN model at {path}")
    if observation is None:
        sidecar = path.parent / "dqn.json" if path.name == "model.zip" else path.with_suffix(".json")
        observation = (
            json.loads(sidecar.read_text()).get("observation", "auto") if sidecar.is_file() else "auto"
        )
    mode = resolve_observation(observation, env_name)
    return DQNAgent(DQN.load(path, device=device), observation_fn(mode))


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------
def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(steps, path) of every complete checkpoint zip, oldest first. A zip only appears by rename
    after it was fully written, so a listed zip is complete."""
    found = []
    for path in Path(run_dir).glob("checkpoint-*.zip"):
        match = _CHECKPOINT.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def save_checkpoint(model: Any, run_dir: Path, steps: int, train_time_s: float, save_replay: bool) -> Path:
    """checkpoint-<steps>.zip (+ .json, + newest .replay.pkl), each written to a temp name then renamed."""
    run_dir = Path(run_dir)
    if save_replay:
        replay = run_dir / f"checkpoint-{steps}.replay.pkl"
        tmp = run_dir / f".{replay.name}.tmp"
        model.save_replay_buffer(tmp)
        os.replace(tmp, replay)
    meta = run_dir / f"checkpoint-{steps}.json"
    tmp = run_dir / f".{meta.name}.tmp"
    tmp.write_text(json.dumps({"steps": int(steps), "train_time_s": round(float(train_time_s), 3)}) + "\n")
    os.replace(tmp, meta)
    final = run_dir / f"checkpoint-{steps}.zip"
    tmp = run_dir / f".{final.name}.tmp"  # suffix ".tmp": SB3 keeps the name as given
    model.save(tmp)
    os.replace(tmp, final)
    # Replay buffers are large: keep only the newest one.
    for old in run_dir.glob("checkpoint-*.replay.pkl"):
        if old.name != f"checkpoint-{steps}.replay.pkl":
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
):
    """One SB3 callback for the progress bar, the metrics.jsonl mirror and checkpoints."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RunCallback(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()
            self.pending = 0
            self.line = ""

        def train_time(self) -> float:
            return time_offset + time.perf_counter() - self.start

        def _on_step(self) -> bool:
            steps = int(self.num_timesteps)
            self.pending += 1
            if steps % log_every == 0:
                self.log_metrics(steps)
            if checkpoint_every > 0 and steps % checkpoint_every == 0:
                save_checkpoint(self.model, run_dir, steps, self.train_time(), save_replay)
            if self.pending >= 100:  # a rich update per env step would cost more than the step
                bar.advance(self.line, n=self.pending)
                self.pending = 0
            return True

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
            metrics.log(steps, row)
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


def train_dqn(cfg: Any, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Train SB3 DQN on cfg.env with cfg.algo (conf/algo/dqn.yaml), checkpointing into `run_dir`;
    with `resume`, continue from the newest complete checkpoint up to total_timesteps. Then evaluate
    the greedy policy on the held-out seeds and write eval.json. Returns the eval metrics."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import configure

    from agentrl.evaluation import env_factory, eval_seeds, evaluate, write_eval
    from agentrl.runlog import MetricsLog, atomic_dir, progress

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    algo = _plain(cfg.algo)
    env_name = str(cfg.env.name)
    mode = resolve_observation(str(algo.get("observation", "auto")), env_name)
    total = int(algo["total_timesteps"])
    log_every = max(1, int(algo.get("log_every", 1000)))
    checkpoint_every = int(algo.get("checkpoint_every", 0) or 0)
    device = str(algo.get("device", "cpu"))
    seed = int(cfg.seed)
    if total < 1:
        raise ConfigError(f"algo.total_timesteps must be >= 1, got {total}")

    checkpoints = list_checkpoints(run_dir) if resume else []
    if resume and not checkpoints:
        log.warning("resume: no complete checkpoint in %s; training from the start", run_dir)
    start_steps, time_offset = 0, 0.0
    threads = algo.get("torch_threads")
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        if checkpoints:
            start_steps, path = checkpoints[-1]
            meta = path.with_suffix(".json")
            if meta.is_file():
                time_offset = float(json.loads(meta.read_text()).get("train_time_s", 0.0))
            env = training_env(cfg, mode, seed_stream=seed * 1_000_003 + start_steps)
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
            env = training_env(cfg, mode, seed_stream=seed)
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
        metrics = MetricsLog(run_dir, resume=bool(checkpoints))
        remaining = max(0, total - int(model.num_timesteps))
        try:
            with progress(f"train dqn {env_name}", total=total) as bar:
                if start_steps:
                    bar.advance(f"resumed at step {start_steps}", n=start_steps)
                callback = _callback(
                    run_dir,
                    metrics,
                    bar,
                    log_every=log_every,
                    checkpoint_every=checkpoint_every,
                    save_replay=bool(algo.get("save_replay_buffer", False)),
                    time_offset=time_offset,
                )
                start = time.perf_counter()
                if remaining:
                    model.learn(
                        total_timesteps=remaining,
                        callback=callback,
                        log_interval=None,  # our callback dumps SB3's logs every log_every steps
                        reset_num_timesteps=not checkpoints,
                    )
                train_time_s = time_offset + time.perf_counter() - start
        finally:
            metrics.close()
            env.close()
        with atomic_dir(run_dir / "final") as tmp:
            model.save(tmp / "model.zip")
            (tmp / "dqn.json").write_text(
                json.dumps({"env": env_name, "observation": mode, "steps": int(model.num_timesteps)}) + "\n"
            )

        agent = DQNAgent(model, observation_fn(mode))
        eval_metrics, episodes = evaluate(
            env_factory(cfg.env),
            agent,
            eval_seeds(cfg),
            lockstep=bool(cfg.eval.get("lockstep", True)),
            description=f"eval dqn {env_name}",
        )
    finally:
        torch.set_num_threads(old_threads)
    write_eval(
        run_dir,
        eval_metrics,
        episodes,
        env=env_name,
        agent="dqn",
        algo="dqn",
        seed=seed,
        observation=mode,
        total_timesteps=int(model.num_timesteps),
        train_time_s=round(train_time_s, 3),
    )
    return eval_metrics


def snake_apples(episodes: Sequence[Any]) -> float:
    """Mean apples eaten per Snake episode (the final state's score)."""
    scores = [float(ep.final_info.get("state", {}).get("score", 0)) for ep in episodes]
    return float(np.mean(scores)) if scores else 0.0


__all__ = [
    "DQNAgent",
    "SnakeFeatures",
    "TrainingEpisodes",
    "list_checkpoints",
    "load_dqn_agent",
    "observation_fn",
    "resolve_observation",
    "save_checkpoint",
    "snake_apples",
    "snake_features",
    "train_dqn",
]
