"""Frozen Lake in the paper's answer format: MS-GRPO after a format warm-up, the embedded SmolLM2-135M, CPU.

Issue 24's first learning target: greedy success >= 0.9 on the fixed 4x4 map within 60 minutes (the
warm-up counts), every answer `<action>NAME</action>` with no prefill and strict parsing
(untagged_rate <= 0.05); on 100 held-out random 4x4 maps the trained policy against the base model and
random. Steps, each through the runner itself (`python -m agentrl.cli`), into `--out`:

1. `warmup/`: `agentrl train experiment=frozenlake_tagged_warmup` (TRL's SFTTrainer on uniformly random
   valid moves written in the format; eval.json has the base model's before and the warmed-up after);
2. `msgrpo/`: `agentrl train experiment=frozenlake_tagged init_from=<out>/warmup
   algo.time_limit_minutes=<what is left of --minutes>`;
3. with `--steps ... maps`: `agentrl eval` of the trained run, the base model and the random agent on
   `--maps` random 4x4 maps (held-out seeds), as `maps_trained/`, `maps_base/`, `maps_random/`.

Run again into the same `--out`, a step whose run is complete is kept, and a training step that was killed
continues from its newest checkpoint (`agentrl train --resume`); its minutes are then those of the rerun.

It prints one table (success, return, invalid_rate, untagged_rate per row) and writes `summary.json` and
`summary.md` into `--out`. Extra arguments are Hydra overrides for both training steps (put them before
`--steps`, which takes the rest of the line). Training on a new random 4x4 map per seed, as the paper does,
instead of the fixed map: `env.map=random env.size=4 env.p=0.8` (the runs' own evals are then on held-out
random maps too).

    .venv/bin/python benchmarks/learn_frozenlake_tagged.py --out outputs/bench/frozenlake_tagged
    .venv/bin/python benchmarks/learn_frozenlake_tagged.py --steps warmup --out /tmp/x   # the warm-up only
    .venv/bin/python benchmarks/learn_frozenlake_tagged.py --steps --out /tmp/x          # only the summary
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rlft_bandit import BenchmarkError, complete, run_step  # noqa: E402 - the shared step runner

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("warmup", "msgrpo", "maps")
KEYS = ("success_rate", "mean_return", "invalid_rate", "untagged_rate", "episodes")


def run(name: str, args: list[str], out: Path, threads: int) -> tuple[Path, float | None]:
    """The shared step runner (rlft_bandit.run_step: `agentrl` in a subprocess, log <out>/<name>.log, a
    complete run kept, an unfinished training run resumed); (run, minutes, None for a kept run)."""
    kept = complete(out / name)
    start = time.perf_counter()
    try:
        run_dir = run_step(name, args, out, threads)
    except BenchmarkError as exc:
        sys.exit(str(exc))
    return run_dir, None if kept else (time.perf_counter() - start) / 60


def row(metrics: dict) -> dict:
    return {k: metrics.get(k) for k in KEYS}


def curve(run_dir: Path, where: str = "the fixed map") -> list[str]:
    """Markdown lines: greedy success on `where` at the periodic evals of the MS-GRPO run (minutes since it
    started) and the last iteration that took an optimizer step."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    metrics = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    evals = [m for m in metrics if m.get("eval/success_rate") is not None]
    stepped = [m["iteration"] for m in metrics if m.get("samples", 0) > 0]
    lines = [
        "",
        f"Greedy success on {where} at the periodic evals of the MS-GRPO run:",
        "",
        "| iteration | " + " | ".join(str(m["iteration"]) for m in evals) + " |",
        "|---|" + "---|" * len(evals),
        "| greedy success | " + " | ".join(f"{m['eval/success_rate']:g}" for m in evals) + " |",
        "| minutes since the run started | " + " | ".join(f"{m['time_s'] / 60:.1f}" for m in evals) + " |",
        "",
        f"{len(metrics)} iterations; {len(stepped)} took an optimizer step"
        + (f", the last at iteration {stepped[-1]}" if stepped else "")
        + " (an iteration with fewer than `algo.min_informative_groups` groups of unequal returns takes none).",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/bench/frozenlake_tagged"))
    parser.add_argument("--minutes", type=float, default=60.0, help="budget of warm-up plus MS-GRPO")
    parser.add_argument("--steps", nargs="*", default=["warmup", "msgrpo"], choices=STEPS)
    parser.add_argument("--maps", type=int, default=100, help="random 4x4 maps of the maps step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args, overrides = parser.parse_known_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = [f"seed={args.seed}", *overrides]
    rows: dict[str, dict] = {}
    previous = out / "summary.json"  # the minutes of steps run earlier into this --out
    minutes: dict[str, float] = json.loads(previous.read_text())["minutes"] if previous.is_file() else {}

    warmup = out / "warmup"
    if "warmup" in args.steps:
        _, took = run("warmup", ["train", "experiment=frozenlake_tagged_warmup", *common], out, args.threads)
        minutes["warmup"] = minutes.get("warmup", 0.0) if took is None else took
    if (warmup / "eval.json").is_file():
        saved = json.loads((warmup / "eval.json").read_text())
        rows["base model"], rows["after the warm-up"] = row(saved.get("before", {})), row(saved)
    if "msgrpo" in args.steps:
        left = max(args.minutes - minutes.get("warmup", 0.0), 1.0)
        train = [
            "train",
            "experiment=frozenlake_tagged",
            f"init_from={warmup}",
            f"algo.time_limit_minutes={left:.1f}",
        ]
        _, took = run("msgrpo", [*train, *common], out, args.threads)
        minutes["msgrpo"] = minutes.get("msgrpo", 0.0) if took is None else took
    trained = out / "msgrpo"
    if (trained / "eval.json").is_file():
        rows["after MS-GRPO"] = row(json.loads((trained / "eval.json").read_text()))
    if "maps" in args.steps:
        # the paper's evaluation: a new random 4x4 map per held-out seed, 8 moves, no slipping
        maps = ["env.map=random", "env.size=4", "env.p=0.8", "env.slippery=false", "env.max_steps=8"]
        maps += [f"eval.episodes={args.maps}", f"seed={args.seed}"]
        agents = {
            "maps_trained": ["eval", f"from_run={trained}", *maps],
            "maps_base": ["eval", "agent.prefill=''", "agent.sampling.max_new_tokens=8", *maps],
            "maps_random": ["eval", "agent=random", *maps],
        }
        for name, cmd in agents.items():
            run_dir, _ = run(name, cmd, out, args.threads)
            rows[f"random maps: {name.split('_')[1]}"] = row(json.loads((run_dir / "eval.json").read_text()))

    lines = [
        "| row | success | return | invalid_rate | untagged_rate | episodes |",
        "|---|---|---|---|---|---|",
        *(
            f"| {name} | {r['success_rate']} | {r['mean_return']} | {r['invalid_rate']} | {r['untagged_rate']} "
            f"| {r['episodes']} |"
            for name, r in rows.items()
        ),
        "",
        f"minutes: {json.dumps({k: round(v, 1) for k, v in minutes.items()})}",
        *curve(trained, "held-out random maps" if "env.map=random" in overrides else "the fixed map"),
    ]
    (out / "summary.json").write_text(json.dumps({"rows": rows, "minutes": minutes}, indent=2) + "\n")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
