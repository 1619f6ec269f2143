"""MS-GRPO credit assignment and AAW episode sampling (Dilkes et al., arXiv 2508.10839;
docs/algorithms.md#ms-grpo).

Pure functions over `Episode`s: no model, no torch. The trainer (agentrl/trainers/grpo_trainer.py) turns
their output into the tensors TRL's clipped surrogate expects.

- Episode return        R_i = sum_t r_{i,t}                       ("the entire cumulative episode reward")
- Group advantage       A_i = (R_i - mean_g(R)) / (std_g(R) + eps)  (GRPO over episode returns; g = the
                        group of G episodes that share an env seed; std is the sample std, ddof 1, as
                        the authors' `torch.std`)
- Credit                every step t of episode i carries A_i on all its completion tokens
- AAW                   train on K episodes drawn without replacement with p_i ∝ |A_i| + eps (the paper
                        leaves the exact form open; docs/algorithms.md#aaw); with eps = 0 only episodes
                        with A_i != 0 can be drawn, so fewer than K may be kept
- Update minimum        fewer than `min_informative_groups` groups with unequal returns (after dynamic
                        sampling's rounds): no rows, the iteration takes no step [ours]. Each group's
                        advantages have unit std whatever its size, so one group alone gets a full
                        Adam step from a handful of episodes; on a converged policy that one step
                        can undo it (docs/algorithms.md#ms-grpo)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentrl.errors import ConfigError
from agentrl.types import Episode, StepSample


def _groups(episodes: Sequence[Episode]) -> dict[int, list[int]]:
    """group id -> indices of its episodes, in order."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        groups[ep.group_id].append(i)
    return dict(groups)


def _std(values: Sequence[float]) -> float:
    # The sample std (ddof 1): the authors' compute_grpo_outcome_advantage calls torch.std, whose default
    # is unbiased. A group of one has no spread (torch.std would give nan); its advantage is 0 anyway.
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def group_advantages(
    episodes: Sequence[Episode], normalize_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """A_i = (R_i - mean_g R) / (std_g R + eps), or R_i - mean_g R with `normalize_std=False` (Dr. GRPO's
    variant). Groups are `Episode.group_id`; the result is in the order of `episodes`."""
    advantages = [0.0] * len(episodes)
    for members in _groups(episodes).values():
        returns = [episodes[i].episode_return for i in members]
        mean = sum(returns) / len(returns)
        scale = (_std(returns) + eps) if normalize_std else 1.0
        for i, r in zip(members, returns, strict=True):
            advantages[i] = (r - mean) / scale
    return advantages


def zero_variance_groups(episodes: Sequence[Episode], tol: float = 1e-9) -> list[int]:
    """Group ids whose episodes all have the same return: every advantage there is 0, so they carry
    no policy gradient (the "echo trap" symptom when all groups end up here)."""
    zero = []
    for group_id, members in _groups(episodes).items():
        returns = [episodes[i].episode_return for i in members]
        if max(returns) - min(returns) <= tol:
            zero.append(group_id)
    return zero


def aaw_sample(
    episodes: Sequence[Episode],
    advantages: Sequence[float],
    *,
    fraction: float | None = None,
    count: int | None = None,
    rng: np.random.Generator | None = None,
    eps: float = 1e-6,
    skip_zero_variance: bool = True,
) -> list[int]:
    """Absolute-advantage-weighted episode sampling (AAW, the paper's §"AAW"): indices of the episodes to
    train on, drawn without replacement with p_i ∝ |A_i| + eps, sorted.

    K = `count`, else round(`fraction` * number of candidate episodes), else all candidates. Candidates
    are the episodes of groups with non-zero return variance (`skip_zero_variance`): the others have
    A_i = 0 and would add only compute. K is capped at the number of candidates, and, with `eps` = 0 (the
    paper's literal p ∝ |A|), at the number of candidates with a non-zero weight: an episode of
    probability 0 is never drawn, so fewer than K are kept rather than filling up with zero-weight ones.
    """
    if len(advantages) != len(episodes):
        raise ValueError("advantages and episodes differ in length")
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise ConfigError(f"aaw fraction must be in (0, 1], got {fraction}")
    if count is not None and count < 0:
        raise ConfigError(f"aaw count must be >= 0, got {count}")
    zero = set(zero_variance_groups(episodes)) if skip_zero_variance else set()
    candidates = [i for i, ep in enumerate(episodes) if ep.group_id not in zero]
    if count is not None:
        k = count
    elif fraction is not None:
        k = int(round(fraction * len(candidates)))
    else:
        k = len(candidates)
    weights = np.array([abs(advantages[i]) + eps for i in candidates], dtype=np.float64)
    k = min(k, len(candidates), int(np.count_nonzero(weights)))
    if k == 0:
        return []
    if k == len(candidates):
        return candidates
    rng = rng if rng is not None else np.random.default_rng()
    chosen = rng.choice(len(candidates), size=k, replace=False, p=weights / weights.sum())
    return sorted(candidates[j] for j in chosen)


def uniform_sample(
    episodes: Sequence[Episode],
    *,
    fraction: float | None = None,
    count: int | None = None,
    rng: np.random.Generator | None = None,
    skip_zero_variance: bool = True,
) -> list[int]:
    """The AAW ablation: the same number of episodes drawn uniformly (p_i equal)."""
    flat = [1.0] * len(episodes)
    return aaw_sample(
        episodes,
        flat,
        fraction=fraction,
        count=count,
        rng=rng,
        eps=0.0,
        skip_zero_variance=skip_zero_variance,
    )


def step_samples(
    episodes: Sequence[Episode], advantages: Sequence[float], keep: Sequence[int]
) -> list[StepSample]:
    """Every step of every kept episode becomes one sample carrying its episode's advantage (MS-GRPO's
    credit assignment: the whole return is attributed to each step). Steps without a generation (a
    classic agent) or with an empty completion are skipped: there is nothing to train on."""
    samples = []
    for i in keep:
        for t, step in enumerate(episodes[i].steps):
            if step.generation is None or not step.completion_ids:
                continue
            samples.append(
                StepSample(
                    prompt_ids=list(step.prompt_ids),
                    completion_ids=list(step.completion_ids),
                    old_logprobs=list(step.logprobs) if step.logprobs is not None else None,
                    advantage=float(advantages[i]),
                    episode_index=i,
                    step_index=t,
                )
            )
    return samples


@dataclass
class Credit:
    """An algorithm's credit assignment for one iteration: the training rows, and per episode its
    advantage and whether it was kept for the update."""

    samples: list[StepSample]
    advantages: list[float]
    kept: list[int]
    stats: dict[str, float] = field(default_factory=dict)


def assign_credit(episodes: Sequence[Episode], algo: Any, rng: np.random.Generator) -> Credit:
    """MS-GRPO for one iteration: group advantages over episode returns, AAW (or, with
    `algo.aaw.enabled=false`, uniform) episode sampling, then every step of a kept episode becomes a row
    carrying its episode's advantage; no rows when fewer than `algo.min_informative_groups` groups have
    unequal returns. `algo` is the typed `algo` config (MSGRPOConfig)."""
    advantages = group_advantages(episodes, normalize_std=algo.normalize_std, eps=algo.eps)
    informative = len(_groups(episodes)) - len(zero_variance_groups(episodes))
    if informative < algo.min_informative_groups:
        return Credit([], advantages, [])
    aaw = algo.aaw
    if aaw.enabled:
        keep = aaw_sample(episodes, advantages, fraction=aaw.fraction, count=aaw.count, rng=rng, eps=aaw.eps)
    else:
        keep = uniform_sample(episodes, fraction=aaw.fraction, count=aaw.count, rng=rng)
    return Credit(step_samples(episodes, advantages, keep), advantages, keep)


__all__ = [
    "Credit",
    "StepSample",
    "aaw_sample",
    "assign_credit",
    "group_advantages",
    "step_samples",
    "uniform_sample",
    "zero_variance_groups",
]
