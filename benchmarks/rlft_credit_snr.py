"""How clearly RLFT's credit on the bandit tells "press a button not yet pressed" from "press the same
one again", for a discount and an exploration bonus: simulated episodes through the preset's own credit
code (agentrl/algos/rlft.py `return_to_go_advantages`), no model.

The policy simulated is the one the strict RLFT bandit runs train (docs/presets.md#rlft_bandit): each
episode picks a favourite button and presses it, except that with probability `--explore` a valid answer
presses a uniformly random button and with probability `--invalid` the answer is invalid (a random
button is pressed and the step costs the preset's -5). Groups as `experiment=rlft_bandit`: 2 env seeds x
4 episodes per batch, 5 Bernoulli arms with means ~ U(0, 1) per seed, 20 presses.

For each (gamma, bonus) it reports, over the valid steps of many batches, the advantage's mean on
presses of a new button minus its mean on repeated presses (`gap`), that gap over the advantage's
standard deviation (`gap / std`: the per-row signal of the exploration decision against the noise
every row adds to the policy gradient), and the same for invalid vs valid answers (the format signal)::

    python benchmarks/rlft_credit_snr.py                   # writes benchmarks/results/rlft_credit_snr.{md,json}
    python benchmarks/rlft_credit_snr.py --batches 200 --results none
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.algos.rlft import new_actions, return_to_go_advantages  # noqa: E402
from agentrl.types import Episode, Step  # noqa: E402

ARMS, HORIZON, GROUPS, GROUP_SIZE, PENALTY = 5, 20, 2, 4, -5.0


def episode(
    rng: np.random.Generator, means: np.ndarray, group: int, explore: float, invalid: float
) -> Episode:
    favourite = int(rng.integers(ARMS))
    steps = []
    for _ in range(HORIZON):
        valid = rng.random() >= invalid
        if not valid or rng.random() < explore:
            action = int(rng.integers(ARMS))
        else:
            action = favourite
        reward = float(rng.random() < means[action])
        steps.append(
            Step(
                observation="",
                action=action,
                action_name=str(action),
                valid=valid,
                reward=reward + (0.0 if valid else PENALTY),
                env_reward=reward,
            )
        )
    return Episode(seed=group, group_id=group, steps=steps)


def measure(
    rng: np.random.Generator, batches: int, gamma: float, bonus: float, explore: float, invalid: float
) -> dict[str, Any]:
    adv, new, valid = [], [], []
    for _ in range(batches):
        episodes = []
        for group in range(GROUPS):
            means = rng.uniform(0.0, 1.0, size=ARMS)
            episodes += [episode(rng, means, group, explore, invalid) for _ in range(GROUP_SIZE)]
        advantages, _ = return_to_go_advantages(
            episodes, gamma=gamma, baseline="group_step", exploration_bonus=bonus
        )
        for e, a in zip(episodes, advantages, strict=True):
            adv += a
            new += new_actions(e)
            valid += [s.valid for s in e.steps]
    adv_, new_, valid_ = np.asarray(adv), np.asarray(new), np.asarray(valid)
    std = float(adv_.std())
    repeat = valid_ & ~new_
    gap = float(adv_[new_].mean() - adv_[repeat].mean())
    format_gap = float(adv_[valid_].mean() - adv_[~valid_].mean()) if (~valid_).any() else float("nan")
    return {
        "gamma": gamma,
        "bonus": bonus,
        "rows": int(adv_.size),
        "new_share_of_valid": float(new_[valid_].mean()),
        "gap": gap,
        "std": std,
        "gap_over_std": gap / std,
        "format_gap_over_std": format_gap / std,
    }


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# RLFT bandit credit: the exploration signal by discount and bonus (simulated)",
        "",
        f"Command: `python benchmarks/rlft_credit_snr.py --batches {args.batches} --explore {args.explore} "
        f"--invalid {args.invalid} --seed {args.seed}`. {args.batches} batches of {GROUPS} seeds x {GROUP_SIZE} "
        f"episodes x {HORIZON} presses, {ARMS} Bernoulli arms; the policy presses a favourite button, a random "
        f"one with probability {args.explore}, and answers invalidly with probability {args.invalid} (-5). "
        "Advantages: `return_to_go_advantages` (baseline group_step), unnormalised. `gap`: mean advantage of "
        "valid presses of a new button minus that of valid repeated presses; `/ std`: over the advantage's "
        "standard deviation; `format / std`: valid minus invalid answers, over the same std.",
        "",
        "| gamma | bonus | new presses / valid | gap | std | gap / std | format / std |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['gamma']} | {r['bonus']} | {r['new_share_of_valid']:.3f} | {r['gap']:+.3f} | {r['std']:.3f} |"
            f" {r['gap_over_std']:+.3f} | {r['format_gap_over_std']:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--explore", type=float, default=0.1, help="chance a valid answer is a random button")
    parser.add_argument("--invalid", type=float, default=0.2, help="chance an answer is invalid")
    parser.add_argument("--gammas", type=float, nargs="+", default=[1.0, 0.9, 0.5, 0.0])
    parser.add_argument("--bonuses", type=float, nargs="+", default=[0.0, 1.0, 3.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results"), help="directory or 'none'")
    args = parser.parse_args(argv)
    rows = []
    for gamma in args.gammas:
        for bonus in args.bonuses:
            rng = np.random.default_rng(args.seed)  # the same episodes for every setting
            rows.append(measure(rng, args.batches, gamma, bonus, args.explore, args.invalid))
    md = markdown(rows, args)
    print(md)
    if args.results != "none":
        out = Path(args.results)
        out.mkdir(parents=True, exist_ok=True)
        (out / "rlft_credit_snr.md").write_text(md)
        (out / "rlft_credit_snr.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
