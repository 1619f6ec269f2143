"""One iteration's rows: its training seeds, its rollouts, the algorithm's credit, and its metrics.

`Collector(iteration)` is the trainer's generation step before packing: it rolls out the iteration's
groups of episodes with the training view of the policy (rollout.collect_groups: lockstep, dynamic
sampling), hands them to the algorithm's credit assignment (agentrl/algos/<name>.py, with the critic's
values when there is one) and returns the rows with advantages and the iteration's rollout metrics.
Seeds are a hash of (run seed, iteration, group), so a resumed run replays an uninterrupted one's; with
several processes each plays its own groups, and `merge_process_metrics` makes one row of their metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agentrl.kernels.syncforward import synced_forwards
from agentrl.rollout import collect_groups, informative_group_count
from agentrl.trainers.critic import Critic
from agentrl.types import Episode, StepSample

log = logging.getLogger(__name__)

TRAIN_SEED_LIMIT = 1_000_000  # training env seeds stay below eval.seed_offset's default

#: one iteration's rows and its metrics, built by `collect(iteration)`
Collect = Callable[[int], tuple[list[StepSample], dict[str, float]]]


def training_seed(seed: int, iteration: int, group: int, limit: int = TRAIN_SEED_LIMIT) -> int:
    """Deterministic env seed of one group: a hash of (global seed, iteration, group index), below
    `limit`, so a resumed run replays exactly the seeds an uninterrupted run would have used."""
    digest = hashlib.blake2b(f"{seed}:{iteration}:{group}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % limit


def global_group(round_: int, group: int, groups: int, rank: int = 0, world: int = 1) -> int:
    """Index of process `rank`'s group `group` (of `groups` per process) in rollout round `round_`,
    numbered over all `world` processes: one process with 2B groups plays exactly the groups two
    processes with B groups each play, and no two processes play the same one."""
    return (round_ * world + rank) * groups + group


def rollout_metrics(episodes: list[Episode], advantages: list[float]) -> dict[str, float]:
    """Per-iteration statistics of the training rollouts (what the agent did with sampling on)."""
    n = max(len(episodes), 1)
    steps = sum(e.length for e in episodes)
    adv = np.asarray(advantages, dtype=np.float64) if advantages else np.zeros(1)
    groups = len({e.group_id for e in episodes})
    judged = [s.rationale for e in episodes for s in e.steps if s.rationale is not None]
    rationale = {"train/rationale_rate": sum(judged) / len(judged)} if judged else {}  # agent.cot only
    return {
        **rationale,
        "train/success_rate": sum(e.success for e in episodes) / n,
        "train/mean_return": sum(e.episode_return for e in episodes) / n,
        "train/mean_length": steps / n,
        "train/invalid_rate": sum(e.invalid_count for e in episodes) / max(steps, 1),
        "train/untagged_rate": sum(e.untagged_count for e in episodes) / max(steps, 1),
        "train/episodes": len(episodes),
        "advantage/mean": float(adv.mean()),
        "advantage/std": float(adv.std()),
        "advantage/abs_mean": float(np.abs(adv).mean()),
        "groups": groups,
        "zero_variance_groups": groups - informative_group_count(episodes),
    }


#: per-process metrics that add up over processes; those in MAX_METRICS take the slowest process's
#: value; the rest (rates, means) are weighted by the process's episodes
SUM_METRICS = frozenset(
    {
        "train/episodes",
        "groups",
        "zero_variance_groups",
        "samples",
        "train_tokens",
        "generated_tokens",
        "episodes_kept",
        "rollout_tokens_per_s",
        "update_tokens_per_s",
        "sampling/uncorrected_tokens",
        "sampling/masked_rows",
    }
)
MAX_METRICS = frozenset(
    {"rollout_rounds", "rollout_s", "credit_s", "prepare_s", "update_s", "iteration_s", "update_skipped"}
)


def merge_process_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """One iteration's metrics from every process's own (rank order) -> the run's: counts and throughputs
    add up, times are the slowest process's, rates and means are weighted by episodes."""
    if len(rows) == 1:
        return rows[0]
    weights = [max(float(r.get("train/episodes", 1)), 1e-9) for r in rows]
    merged: dict[str, float] = {}
    for key in rows[0]:
        values = [r[key] for r in rows if key in r]
        if key in SUM_METRICS:
            merged[key] = sum(values)
        elif key in MAX_METRICS:
            merged[key] = max(values)
        else:
            pairs = [(r[key], w) for r, w in zip(rows, weights, strict=True) if key in r]
            merged[key] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
    return merged


@dataclasses.dataclass
class Collector:
    """The `collect(iteration)` of `MultiStepTrainer`: this process's groups of episodes rolled out with
    `agent` on `env()` (seeds from `seed`, below `seed_limit`), and the rows `spec`'s credit assignment
    makes of them. `backend` is the rollout backend the trainer syncs with the trained weights before every
    rollout (TRL's vLLM engine or a copy of the policy; None: the policy itself generates)."""

    spec: Any  # agentrl.algos.AlgorithmSpec
    algo: Any  # its typed config
    env: Callable[[], Any]
    agent: Any
    model: Any  # the trained policy: a sharded one makes every process run as many forwards
    seed: int
    seed_limit: int = TRAIN_SEED_LIMIT
    critic: Critic | None = None
    pad_id: int = 0
    reset_options: dict[str, Any] | None = None
    rank: int = 0
    world: int = 1
    backend: Any = None
    # the rollout records its forward for the update (trainers/multistep.py `rollout_graph_reason`), at
    # most `graph_budget` tokens (None: no bound); off for the rest of the run once a rollout overflows it
    record_graphs: bool = False
    graph_budget: int | None = None

    def __call__(self, iteration: int) -> tuple[list[StepSample], dict[str, float]]:
        start = time.perf_counter()
        episodes, rounds = self.rollout(iteration)
        rollout_s = time.perf_counter() - start
        return self.credit(iteration, episodes, rounds, rollout_s)

    def rollout(self, iteration: int) -> tuple[list[Episode], int]:
        """The iteration's groups of episodes and the rollout rounds they took (dynamic sampling)."""
        if self.backend is not None:
            # the engine gets the trained weights before every rollout (also the first: a resumed run's
            # engine loaded the base weights from disk)
            self.backend.sync_weights(step=iteration)
        # the policy generating under bf16 autocast casts its weights once for the whole rollout
        policy = getattr(self.agent, "backend", None)
        kept = getattr(policy, "weight_casts_kept", contextlib.nullcontext)
        if self.record_graphs:
            kept = functools.partial(policy.recording_graphs, self.graph_budget)
        # a sharded model: every process makes as many forward calls
        with synced_forwards(self.model), kept():
            episodes, rounds = collect_groups(
                self.env,
                self.agent,
                group_seeds=lambda r: self.group_seeds(iteration, r),
                group_size=self.algo.group_size,
                agent_seed=lambda r: training_seed(self.seed, iteration, 10_000 + r * self.world + self.rank),
                min_informative=self.algo.min_informative_groups,
                max_rounds=self.algo.max_rollout_rounds,
                reset_options=self.reset_options,
            )
        if self.record_graphs and policy.graphs is not None and policy.graphs.overflowed:
            self.record_graphs = False
            log.info(
                "The update runs its own forward from now on: this rollout ran more than %d tokens, the "
                "budget for keeping its forward's graph (algo.rollout_graph)",
                self.graph_budget,
            )
        if hasattr(self.backend, "end_rollout"):
            self.backend.end_rollout()  # vLLM sleep mode: the engine frees its memory for the update
        return episodes, rounds

    def group_seeds(self, iteration: int, round_: int) -> list[int]:
        """The env seeds of this process's groups in rollout round `round_` of `iteration`."""
        groups = self.algo.groups_per_iteration
        return [
            training_seed(
                self.seed, iteration, global_group(round_, g, groups, self.rank, self.world), self.seed_limit
            )
            for g in range(groups)
        ]

    def credit(
        self, iteration: int, episodes: list[Episode], rounds: int, rollout_s: float
    ) -> tuple[list[StepSample], dict[str, float]]:
        """The algorithm's rows with advantages, and the iteration's rollout metrics."""
        start = time.perf_counter()
        rng = np.random.default_rng([self.seed, iteration, 7])
        if self.critic is not None:
            values = self.critic.evaluate(episodes, self.pad_id)
            credit = self.spec.assign_credit(episodes, self.algo, rng, values=values)
        else:
            credit = self.spec.assign_credit(episodes, self.algo, rng)
        generated = sum(len(s.completion_ids) for e in episodes for s in e.steps)
        prompts = sum(len(s.prompt_ids) for e in episodes for s in e.steps)
        metrics = rollout_metrics(episodes, credit.advantages)
        metrics.update(
            rollout_rounds=rounds,
            episodes_kept=len(credit.kept),
            rollout_s=rollout_s,
            credit_s=time.perf_counter() - start,  # with a critic: its trunk's forward over every row
            rollout_tokens_per_s=(generated + prompts) / max(rollout_s, 1e-9),
            generated_tokens=generated,
            **credit.stats,
        )
        return credit.samples, metrics
