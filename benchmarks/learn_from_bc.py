"""RL from a behaviour-cloning start, measured against that start map by map, with the baselines beside it.

The embedded SmolLM2-135M on a CPU. One command per learning row whose start already reads the state:

- `--preset frozenlake_maps` (default): unseen random 4x4 Frozen Lake maps in the `<action>` format, BC
  on the planner (`frozenlake_maps_bc`) then MS-GRPO. Target (issue 52): greedy success >= 0.8 on 100
  held-out maps, untagged 0.00, RL's paired gain over its start >= +0.1; random and the base model near 0;
- `--preset snake_summary`: Snake in words, BC on the planner (`snake_summary_bc`) then MS-GRPO. Target:
  RL's paired gain over its start above 2 standard errors (run it for `--seed 0`, `1` and `2`).
- `--preset rlft_bandit`: the 5-button bandit with rationales, BC on UCB1 (`rlft_bandit_bc`) then RLFT.
  Target: final action coverage up and cumulative regret down, each by more than 2 standard errors of
  the paired difference, with at most 5% invalid answers (20 held-out episodes: a greedy eval with
  64-token rationales takes ~5-8 min at one thread here).

Steps, each through the runner (`python -m agentrl.cli`), into `--out`:

1. `random/`, `planner/`: `agentrl eval agent=random|planner` on the preset's env and held-out seeds;
2. `base/`: `agentrl eval` of the base model asked in the preset's format on the same instances;
3. `bc/`: `agentrl train experiment=<bc preset>` (SFT on the planner's moves, training seeds only);
4. `rl/`: `agentrl train experiment=<preset> init_from=<out>/bc`;
5. with `--steps ... uniform`: `uniform/`, the same with `algo.aaw.enabled=false` (AAW against uniform
   episode sampling from the same start); with `--steps ... dqn`: `dqn/`, `agentrl train algo=dqn` on the
   same env and held-out seeds.

Every step evaluates on the same held-out seeds (`seed`, `eval.episodes`); a training run's eval.json
`before` is its start on them, so `agentrl report <out> --table learning` (written to `<out>/report/`) shows
random, planner, base model, the start, the trained model and RL's paired gain in one row. `summary.md`
adds the target's verdict. A complete step is kept when the command runs again into the same `--out`; a
killed training step resumes from its newest checkpoint. `--keep NAME` copies the runs' results without
weights into benchmarks/results/learning/NAME_<step>/ (kept_runs.py), from which `agentrl report
benchmarks/results/learning --table learning` rebuilds docs/results.md's table.

    .venv/bin/python benchmarks/learn_from_bc.py --out outputs/bench/fl_maps --threads 1
    .venv/bin/python benchmarks/learn_from_bc.py --steps --out outputs/bench/fl_maps        # summary only
    .venv/bin/python benchmarks/learn_from_bc.py --steps uniform --out outputs/bench/fl_maps
    .venv/bin/python benchmarks/learn_from_bc.py --preset snake_summary --seed 1 --out outputs/bench/snake1

Extra arguments are Hydra overrides for the RL steps (e.g. `algo.iterations=10`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kept_runs import LEARNING, keep_run  # noqa: E402
from rlft_bandit import ROOT, BenchmarkError, run_step  # noqa: E402 - the shared step runner

STEPS = ("random", "planner", "base", "bc", "rl", "uniform", "dqn")
DEFAULT_STEPS = ("random", "planner", "base", "bc", "rl")
#: agent keys that set how the model is asked (the base model is evaluated with the preset's)
INTERFACE = ("prefill", "cot", "answer_tag", "lenient", "history", "invalid_rule", "invalid_penalty")
INTERFACE += ("sampling.max_new_tokens",)
#: preset -> (its behaviour-cloning preset, held-out episodes, the target: metric, minimum after training
#: or None, minimum paired gain over the start or None for "above 2 standard errors")
PRESETS: dict[str, tuple[str, int, str, float | None, float | None]] = {
    "frozenlake_maps": ("frozenlake_maps_bc", 100, "success_rate", 0.8, 0.1),
    "snake_summary": ("snake_summary_bc", 50, "mean_return", None, None),
    "rlft_bandit": ("rlft_bandit_bc", 20, "coverage", None, None),
}
#: most invalid answers a bandit row may have for its coverage to count: an invalid answer presses a random
#: button, which raises coverage whatever the model does
MAX_INVALID = 0.05


def preset_block(preset: str, group: str) -> list[str]:
    """`<group>.<key>=<value>` for every key the preset sets in its `<group>:` block (nested keys dotted),
    and `<group>=<option>` first where its defaults list overrides the group."""
    from omegaconf import OmegaConf

    path = ROOT / "agentrl" / "conf" / "experiment" / f"{preset}.yaml"
    if not path.is_file():
        raise BenchmarkError(f"preset {path} not found")
    cfg = OmegaConf.load(path)
    option = [
        f"{group}={value}"
        for entry in cfg.get("defaults", [])
        for key, value in dict(entry).items()
        if key == f"override /{group}"
    ]

    def flat(node: Any, prefix: str) -> list[str]:
        if isinstance(node, dict):
            return [o for k, v in node.items() for o in flat(v, f"{prefix}.{k}")]
        if node is None:
            return [f"{prefix}=null"]
        if isinstance(node, bool):
            return [f"{prefix}={str(node).lower()}"]
        return [f"{prefix}={node if node != '' else repr('')}"]

    return option + flat(OmegaConf.to_container(cfg.get(group) or {}), group)


def eval_json(run: Path) -> dict[str, Any]:
    path = run / "eval.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def verdict(out: Path, preset: str = "frozenlake_maps") -> list[str]:
    """Markdown lines: the target's verdict for each RL step that finished."""
    from agentrl.report.learning import METRICS, paired_gain

    _, _, metric, least, least_gain = PRESETS[preset]
    lines = []
    base, rand = eval_json(out / "base"), eval_json(out / "random")
    for name in ("rl", "uniform"):
        trained = eval_json(out / name)
        if not trained:
            continue
        before = trained.get("before", {})
        after, untagged = METRICS[metric](trained)[0], trained.get("untagged_rate")
        gain, err, n = paired_gain(before, trained, metric)
        bar = 2 * err if least_gain is None else least_gain
        checks = {f"untagged {untagged:.2f} == 0": untagged == 0}
        if least is not None:
            checks[f"{metric} {after:.3f} >= {least}"] = after >= least
        wanted = "2 SE" if least_gain is None else f"+{least_gain}"
        checks[f"gain over the start {gain:+.3f} ± {err:.3f} (n={n}) > {wanted}"] = not math.isnan(gain) and (
            gain > bar
        )
        if metric == "coverage":  # a bandit: regret must fall too, and the presses be the model's own
            fall, fall_err, pairs = paired_gain(before, trained, "regret")
            checks[f"regret change {fall:+.3f} ± {fall_err:.3f} (n={pairs}) < -2 SE"] = fall < -2 * fall_err
            invalid = trained.get("invalid_rate", math.nan)
            checks[f"invalid {invalid:.3f} <= {MAX_INVALID}"] = invalid <= MAX_INVALID
        met = all(checks.values())
        lines += [
            f"- `{name}`: **{'met' if met else 'not met'}**: "
            + "; ".join(f"{text} ({'yes' if ok else 'no'})" for text, ok in checks.items())
            + f"; start {_value(before, metric)}, random {_value(rand, metric)}, base model "
            f"{_value(base, metric)} "
            f"(invalid {_share(base.get('invalid_rate'))}); {trained.get('iterations')} iterations in "
            f"{trained.get('train_time_s', 0) / 60:.1f} min",
        ]
    return lines


def _share(value: Any) -> str:
    """A rate from an eval.json, rounded to 2 places; "-" where it is not recorded."""
    return "-" if value is None else f"{float(value):.2f}"


def _value(data: dict[str, Any], metric: str) -> str:
    """`metric` of an eval.json dict (or its `before` block), rounded; "-" where it is not recorded."""
    from agentrl.report.learning import METRICS

    value = METRICS[metric](data)[0] if data else math.nan
    return "-" if math.isnan(value) else f"{value:.3f}"


def commands(args: argparse.Namespace, out: Path, overrides: list[str]) -> dict[str, list[str]]:
    """The runner's arguments of every step."""
    bc_preset, episodes, *_ = PRESETS[args.preset]
    held_out = [f"seed={args.seed}", f"eval.episodes={args.episodes or episodes}"]
    env = preset_block(args.preset, "env")
    keys = [o.split("=")[0] for o in preset_block(args.preset, "agent")]
    interface = [
        o for o, k in zip(preset_block(args.preset, "agent"), keys, strict=True) if k[6:] in INTERFACE
    ]
    rl = ["train", f"experiment={args.preset}", f"init_from={out / 'bc'}", *held_out, *overrides]
    return {
        "random": ["eval", "agent=random", *env, *held_out],
        "planner": ["eval", "agent=planner", *env, *held_out],
        "base": ["eval", *env, *interface, *held_out],
        "bc": ["train", f"experiment={bc_preset}", *held_out],
        "rl": rl,
        "uniform": [*rl, "algo.aaw.enabled=false"],
        "dqn": ["train", "algo=dqn", *env, *held_out, "algo.torch_threads=1"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="frozenlake_maps", choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, default=None, help="default: outputs/bench/<preset>_seed<seed>")
    parser.add_argument("--steps", nargs="*", default=list(DEFAULT_STEPS), choices=STEPS)
    parser.add_argument(
        "--episodes", type=int, default=None, help="held-out episodes (default: the preset's)"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep", default=None, help="copy results to benchmarks/results/learning/KEEP_<step>"
    )
    args, overrides = parser.parse_known_args()
    out = (args.out or Path(f"outputs/bench/{args.preset}_seed{args.seed}")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    steps = commands(args, out, overrides)
    try:
        for name in STEPS:
            if name in args.steps:
                run_step(name, steps[name], out, args.threads)
    except BenchmarkError as exc:
        sys.exit(str(exc))
    from agentrl.console import console
    from agentrl.report.learning import build_learning_report

    lines = [f"# RL from behaviour cloning: `{args.preset}`, seed {args.seed}", ""]
    try:
        report = build_learning_report([out], out / "report", console=console)
        lines += (report.out_dir / "learning.md").read_text().splitlines()[2:]
    except Exception as exc:  # noqa: BLE001 - no training run finished yet: the verdict stays empty
        lines.append(f"(no learning table: {exc})")
    lines += ["", "Target (issue 52): " + target_text(args.preset), ""]
    lines += verdict(out, args.preset) or ["- no RL step has finished"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-3:]))
    if args.keep:
        for name in STEPS:
            if eval_json(out / name):
                print(f"kept {keep_run(out / name, LEARNING / f'{args.keep}_{name}')}")


def target_text(preset: str) -> str:
    _, _, metric, least, least_gain = PRESETS[preset]
    parts = ["untagged 0.00"]
    if least is not None:
        parts.append(f"{metric} >= {least}")
    parts.append(
        "RL's paired gain over the start " + ("> 2 SE" if least_gain is None else f">= +{least_gain}")
    )
    if metric == "coverage":
        parts.append(f"regret's paired change < -2 SE, invalid <= {MAX_INVALID}")
    return ", ".join(parts) + "."


if __name__ == "__main__":
    main()
