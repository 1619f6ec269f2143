"""The collector: groups share an env seed, and dynamic sampling rolls out more rounds only while too few
groups carry a learning signal."""

from __future__ import annotations

from agentrl.agents.baselines import RandomAgent
from agentrl.envs import make_env
from agentrl.rollout import collect_groups, informative_group_count
from agentrl.types import Decision, Episode, Step, StepContext


class AlwaysFirst:
    """Plays the first valid action: every episode of a group is the same, so no group is informative."""

    name = "first"

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        return [Decision(action=ctx.env.action_index(ctx.info["valid_actions"][0])) for ctx in contexts]


def make_frozenlake():
    return make_env("frozenlake", map="random")


def seeds_of(round_: int) -> list[int]:
    return [100 * round_ + g for g in range(3)]


def test_groups_share_a_seed_and_ids_number_groups_over_rounds():
    episodes, rounds = collect_groups(
        make_frozenlake,
        AlwaysFirst(),
        group_seeds=seeds_of,
        group_size=2,
        agent_seed=lambda r: r,
        max_rounds=2,
        min_informative=1,
    )
    assert rounds == 2 and len(episodes) == 12
    assert [e.group_id for e in episodes] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert [e.seed for e in episodes] == [0, 0, 1, 1, 2, 2, 100, 100, 101, 101, 102, 102]


def test_dynamic_sampling_stops_once_enough_groups_are_informative():
    common = dict(group_seeds=seeds_of, group_size=8, agent_seed=lambda r: r, max_rounds=3)
    _, rounds = collect_groups(make_frozenlake, AlwaysFirst(), min_informative=1, **common)
    assert rounds == 3  # never informative: every round is played
    _, rounds = collect_groups(make_frozenlake, AlwaysFirst(), min_informative=0, **common)
    assert rounds == 1  # nothing asked for
    episodes, rounds = collect_groups(lambda: make_env("bandit"), RandomAgent(), min_informative=1, **common)
    assert rounds == 1 and informative_group_count(episodes) >= 1  # random bandit returns vary


def test_informative_group_count():
    def episode(group: int, reward: float) -> Episode:
        return Episode(seed=0, group_id=group, steps=[Step("o", 0, "a", True, reward, reward)])

    assert informative_group_count([episode(0, 1.0), episode(0, 1.0), episode(1, 0.0), episode(1, 1.0)]) == 1
