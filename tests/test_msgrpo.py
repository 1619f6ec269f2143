"""MS-GRPO advantage math and AAW sampling on hand-made episodes with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentrl.algos.msgrpo import (
    aaw_sample,
    group_advantages,
    step_samples,
    uniform_sample,
    zero_variance_groups,
)
from agentrl.errors import ConfigError
from agentrl.types import Episode, Generation, Step


def make_episode(rewards: list[float], group_id: int, with_generation: bool = True) -> Episode:
    steps = []
    for t, r in enumerate(rewards):
        gen = (
            Generation(f"p{t}", "a", prompt_ids=[1, 2, 3 + t], completion_ids=[7, 8], logprobs=[-0.5, -0.25])
            if with_generation
            else None
        )
        steps.append(Step(f"obs{t}", 0, "left", True, r, r, generation=gen))
    return Episode(seed=group_id, group_id=group_id, steps=steps)


def test_group_advantages_known_answer():
    # group 0 returns: 1, 0, 0, 1 -> mean 0.5, sample std sqrt(1/3) -> A = ±sqrt(3)/2
    # group 1 returns: 3 (=1+2), 1 -> mean 2, sample std sqrt(2) -> A = ±1/sqrt(2)
    episodes = [
        make_episode([0.0, 1.0], 0),
        make_episode([0.0], 0),
        make_episode([0.0, 0.0, 0.0], 0),
        make_episode([1.0], 0),
        make_episode([1.0, 2.0], 1),
        make_episode([1.0], 1),
    ]
    adv = group_advantages(episodes, eps=0.0)
    h, r = math.sqrt(3) / 2, 1 / math.sqrt(2)
    assert adv == pytest.approx([h, -h, -h, h, r, -r])
    # eps shrinks the scale slightly; without std normalisation only the mean is subtracted
    adv_eps = group_advantages(episodes, eps=0.5)
    assert adv_eps[0] == pytest.approx(0.5 / (math.sqrt(1 / 3) + 0.5))
    raw = group_advantages(episodes, normalize_std=False)
    assert raw == pytest.approx([0.5, -0.5, -0.5, 0.5, 1.0, -1.0])


def test_groups_are_independent_and_order_preserved():
    # interleaved groups: each episode is normalised only within its own group
    episodes = [
        make_episode([1.0], 0),
        make_episode([5.0], 1),
        make_episode([0.0], 0),
        make_episode([3.0], 1),
    ]
    adv = group_advantages(episodes, eps=0.0)
    r = 1 / math.sqrt(2)
    assert adv == pytest.approx([r, r, -r, -r])
    assert sum(adv) == pytest.approx(0.0)


def test_group_std_is_the_authors_sample_std():
    # the authors' compute_grpo_outcome_advantage divides by torch.std (ddof 1): returns [0, 1] give
    # ±0.707, not the population std's ±1
    episodes = [make_episode([0.0], 0), make_episode([1.0], 0)]
    assert group_advantages(episodes, eps=0.0) == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])
    torch = pytest.importorskip("torch")
    returns = torch.tensor([0.0, 1.0, 1.0, 3.0])
    expected = ((returns - returns.mean()) / (torch.std(returns) + 1e-6)).tolist()
    group = [make_episode([float(r)], 0) for r in returns]
    assert group_advantages(group) == pytest.approx(expected)
    # a group of one has no spread: advantage 0 (torch.std would give nan)
    assert group_advantages([make_episode([2.0], 3)]) == [0.0]


def test_all_equal_returns_give_zero_advantages_and_zero_variance_groups():
    episodes = [
        make_episode([1.0], 0),
        make_episode([1.0], 0),
        make_episode([0.0], 1),
        make_episode([1.0], 1),
    ]
    adv = group_advantages(episodes)
    assert adv[0] == 0.0 and adv[1] == 0.0
    assert all(math.isfinite(a) for a in adv)
    assert zero_variance_groups(episodes) == [0]
    all_equal = [make_episode([0.0], g) for g in (0, 0, 1, 1)]
    assert group_advantages(all_equal) == [0.0] * 4
    assert zero_variance_groups(all_equal) == [0, 1]
    assert aaw_sample(all_equal, group_advantages(all_equal), fraction=1.0) == []


def test_aaw_drops_zero_variance_groups_and_respects_count():
    episodes = [make_episode([1.0], 0), make_episode([1.0], 0)] + [
        make_episode([float(r)], 1) for r in (0, 1, 0, 1)
    ]
    adv = group_advantages(episodes)
    rng = np.random.default_rng(0)
    keep = aaw_sample(episodes, adv, count=3, rng=rng)
    assert len(keep) == 3 and len(set(keep)) == 3
    assert all(episodes[i].group_id == 1 for i in keep)
    # fraction of the candidates (4 episodes of group 1), capped at the number of candidates
    assert len(aaw_sample(episodes, adv, fraction=0.5, rng=rng)) == 2
    assert aaw_sample(episodes, adv, count=99, rng=rng) == [2, 3, 4, 5]
    # zero-variance groups can be kept on request (they then only add compute)
    assert len(aaw_sample(episodes, adv, count=6, rng=rng, skip_zero_variance=False)) == 6


def test_aaw_probability_proportional_to_abs_advantage():
    # one group with returns 0,0,0,4: mean 1, sample std 2, A = -0.5 x3 and +1.5 -> |A| weights 1,1,1,3
    episodes = [make_episode([r], 0) for r in (0.0, 0.0, 0.0, 4.0)]
    adv = group_advantages(episodes, eps=0.0)
    assert adv[3] == pytest.approx(1.5)
    rng = np.random.default_rng(1)
    draws = [aaw_sample(episodes, adv, count=1, rng=rng, eps=0.0)[0] for _ in range(6000)]
    share = draws.count(3) / len(draws)
    assert share == pytest.approx(0.5, abs=0.03)  # 3 / 6
    # the uniform ablation picks it 1/4 of the time
    uniform = [uniform_sample(episodes, count=1, rng=rng)[0] for _ in range(6000)]
    assert uniform.count(3) / len(uniform) == pytest.approx(0.25, abs=0.03)


def test_aaw_eps_zero_keeps_only_nonzero_advantages_and_takes_fewer():
    # the example: returns [1, 1, 0, 2, 1, 1] in one group, fraction 0.5 -> K = 3, but only two
    # episodes (returns 0 and 2) have A != 0; p ∝ |A| gives the others probability 0, so those two are
    # kept and no third is drawn (numpy's choice would raise "Fewer non-zero entries in p than size")
    episodes = [make_episode([r], 0) for r in (1.0, 1.0, 0.0, 2.0, 1.0, 1.0)]
    adv = group_advantages(episodes)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        assert aaw_sample(episodes, adv, fraction=0.5, rng=rng, eps=0.0) == [2, 3]
    # with the default eps the zero-advantage episodes can fill up K
    assert len(aaw_sample(episodes, adv, fraction=0.5, rng=np.random.default_rng(0), eps=1e-3)) == 3


def test_aaw_rejects_bad_settings():
    episodes = [make_episode([r], 0) for r in (0.0, 1.0)]
    with pytest.raises(ConfigError):
        aaw_sample(episodes, [0.0, 0.0], fraction=1.5)
    with pytest.raises(ValueError):
        aaw_sample(episodes, [0.0])


def test_step_samples_carry_episode_advantage_on_every_step():
    episodes = [
        make_episode([0.0, 0.0, 1.0], 0),
        make_episode([0.0], 0),
        make_episode([1.0], 1, with_generation=False),
    ]
    adv = [0.7, -0.7, 0.0]
    samples = step_samples(episodes, adv, keep=[0, 2])
    assert [(s.episode_index, s.step_index) for s in samples] == [(0, 0), (0, 1), (0, 2)]
    assert all(s.advantage == 0.7 for s in samples)
    assert samples[2].prompt_ids == [1, 2, 5] and samples[2].completion_ids == [7, 8]
    assert samples[0].old_logprobs == [-0.5, -0.25]


def test_assign_credit_samples_with_aaw_or_uniformly_as_configured():
    import numpy as np

    from agentrl.algos.msgrpo import assign_credit
    from agentrl.config import compose_config, typed

    episodes = [make_episode([r], 0) for r in (0.0, 1.0, 1.0, 5.0)] + [
        make_episode([2.0], 1) for _ in range(2)
    ]

    def kept(*overrides: str) -> list[int]:
        algo = typed(compose_config(["task=train", "algo=msgrpo", "algo.aaw.fraction=0.5", *overrides]).algo)
        credit = assign_credit(episodes, algo, np.random.default_rng(3))
        assert {s.episode_index for s in credit.samples} == set(credit.kept)
        return credit.kept

    advantages = group_advantages(episodes)
    assert kept() == aaw_sample(episodes, advantages, fraction=0.5, rng=np.random.default_rng(3), eps=1e-3)
    assert kept("algo.aaw.enabled=false") == uniform_sample(
        episodes, fraction=0.5, rng=np.random.default_rng(3)
    )
    assert all(i < 4 for i in kept())  # the zero-variance group is never trained on


def test_fewer_informative_groups_than_the_minimum_give_no_rows():
    """A single informative group among many equal-return groups would get a full optimizer step from a
    handful of episodes: below `algo.min_informative_groups` the iteration has no rows."""
    from agentrl.algos.msgrpo import assign_credit
    from agentrl.config import compose_config, typed

    one = [make_episode([r], 0) for r in (1.0, 1.0, 0.0, 1.0)]
    equal = [make_episode([1.0], g) for g in range(1, 4) for _ in range(4)]
    two = one + [make_episode([r], 9) for r in (0.0, 1.0, 1.0, 1.0)]

    def rows(episodes: list[Episode], minimum: int) -> int:
        algo = typed(
            compose_config(["task=train", "algo=msgrpo", f"algo.min_informative_groups={minimum}"]).algo
        )
        return len(assign_credit(episodes, algo, np.random.default_rng(0)).samples)

    assert rows(one + equal, 1) > 0
    assert rows(one + equal, 2) == 0
    assert rows(two + equal, 2) > 0
