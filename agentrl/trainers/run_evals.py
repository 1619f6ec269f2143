"""The evaluations a training run makes: before training (once; kept across resumes), periodically, and
after, each on the held-out seeds of the standard task with the policy's evaluation view.

With several processes each plays every world-th seed inside `synced_forwards` (a sharded model needs
every process's forwards) and all get the episodes back in seed order; process 0 writes
`eval_before.json`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from agentrl import distributed as dist
from agentrl.kernels.syncforward import synced_forwards
from agentrl.runs.runlog import write_json
from agentrl.types import EnvFactory, Episode

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Evaluations:
    """The run's evaluations of the policy (`agent` on `env`, greedy-ish): before training (once; kept in
    `eval_before.json` across resumes), periodically, and after. With several processes each plays every
    world-th seed and all get the episodes back in seed order."""

    env: Any
    agent: Any
    seeds: list[int]
    model: Any  # the trained policy: a sharded one makes every process run as many forwards
    seed: int
    lockstep: bool
    before_path: Path
    before: dict[str, Any] | None = None

    @classmethod
    def for_run(
        cls, cfg: DictConfig, agent: Any, model: Any, run_dir: Path, env_factory: EnvFactory
    ) -> Evaluations:
        """The evaluations of the run in `run_dir` on the standard task of `cfg.env`."""
        from agentrl.evaluation import eval_seeds

        env = env_factory(cfg.env)
        path = run_dir / "eval_before.json"
        before = json.loads(path.read_text()) if path.is_file() else None
        return cls(env, agent, eval_seeds(cfg), model, int(cfg.seed), cfg.eval.lockstep, path, before)

    def run(self, description: str, episodes: int | None = None) -> tuple[dict[str, Any], list[Episode]]:
        """The metrics and episodes of the first `episodes` seeds (all by default)."""
        from agentrl.evaluation import episode_metrics, evaluate

        seeds = self.seeds[: episodes or None]
        kwargs = {"lockstep": self.lockstep, "description": description, "agent_seed": self.seed}
        rank, world = dist.rank(), dist.world_size()
        if world == 1:
            return evaluate(self.env, self.agent, seeds, **kwargs)
        # every process plays every world-th seed; the episodes come back in seed order on all of them
        mine = seeds[rank::world]
        with synced_forwards(self.model):  # every process enters, even one without seeds
            played = evaluate(self.env, self.agent, mine, **kwargs)[1] if mine else []
        shards = dist.gather(played)
        ordered = [shards[k % world][k // world] for k in range(len(seeds))]
        return episode_metrics(ordered), ordered

    def before_training(self) -> None:
        """Runs when training begins (`BeforeTraining`): the engine has prepared the model by then (ZeRO-3's
        partitions, FSDP's shards on this process's device, mixed precision's autocast around `forward`),
        so the evaluations before and after training run the same model the same way."""
        from agentrl.evaluation import eval_record

        # as eval.json keeps the final eval: a bandit's diagnostics and the per-episode values that pair
        # the start with the trained model seed by seed
        before = eval_record(*self.run("eval before training"))
        if dist.is_main():
            write_json(self.before_path, before)
        self.before = before
        log.info("Before training: success %.3f return %.3f", before["success_rate"], before["mean_return"])
