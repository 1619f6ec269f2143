"""Rollout throughput: one episode at a time vs lockstep, same model, episodes and seeds, side by side.

(a) `rollout(..., lockstep=False)`: episodes played one after another, one generate call per env step;
(b) `rollout(..., lockstep=True)`: all episodes advance together, one batched generate call per step.

    .venv/bin/python benchmarks/rollout_throughput.py                      # embedded SmolLM2-135M
    .venv/bin/python benchmarks/rollout_throughput.py --model tiny-random  # quick check
    # a training rollout's decode (prompt sharing, rationales, sampled) and where its time goes
    .venv/bin/python benchmarks/rollout_throughput.py --env tictactoe --cot --share-prompts \
        --temperature 1 --max-new-tokens 64 --episodes 8 --threads 1 --profile

Prints env-steps/s of both and their ratio (the issue's target: >= 4x at 16 episodes on 2 CPU cores).
`--profile` then plays the lockstep rollout once more under torch.profiler and prints the operators
that took the most CPU time. The engine is the `agentrl` on the path: `PYTHONPATH=<another tree>` runs
this script on that tree's engine (before/after comparisons).
"""

from __future__ import annotations

import argparse
import time

import torch

from agentrl.agents.backends import HFBackend, SamplingConfig
from agentrl.agents.llm import LLMAgent, TextInterface
from agentrl.envs import make_env
from agentrl.models import load_model


def _parse_options(items: list[str]) -> dict:
    options = {}
    for item in items:
        key, _, value = item.partition("=")
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                continue
        options[key] = value
    return options


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="smollm2-135m", help="builtin model name (smollm2-135m, tiny-random)"
    )
    parser.add_argument("--env", default="frozenlake")
    parser.add_argument(
        "--env-option", action="append", default=[], help="constructor option, e.g. map=random"
    )
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the eval default)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--cot", action="store_true", help="a rationale before each answer (RLFT's format)")
    parser.add_argument(
        "--share-prompts", action="store_true", help="the training rollouts' backend (prompt sharing)"
    )
    parser.add_argument("--profile", action="store_true", help="profile the lockstep rollout once more")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    from agentrl.rollout import rollout

    model, tokenizer = load_model({"name": args.model, "name_or_path": f"builtin:{args.model}"})
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    backend = HFBackend(model, tokenizer, share_prompts=args.share_prompts)
    agent = LLMAgent(TextInterface(cot=args.cot), backend, sampling)
    options = _parse_options(args.env_option)
    make = lambda: make_env(args.env, **options)  # noqa: E731
    seeds = list(range(args.episodes))

    rollout(make, agent, seeds[:1], lockstep=True)  # warm-up: first-call kernel/allocator setup
    rows = []
    episodes_by_mode = {}
    for label, lockstep in (("one at a time", False), ("lockstep", True)):
        start = time.perf_counter()
        episodes = rollout(make, agent, seeds, lockstep=lockstep)
        seconds = time.perf_counter() - start
        steps = sum(ep.length for ep in episodes)
        tokens = sum(len(s.completion_ids) for ep in episodes for s in ep.steps)
        rows.append((label, steps, tokens, seconds, steps / seconds))
        episodes_by_mode[label] = [ep.summary()["actions"] for ep in episodes]

    print(
        f"model={args.model} env={args.env} {options or ''} episodes={args.episodes} "
        f"max_new_tokens={args.max_new_tokens} temperature={args.temperature} threads={args.threads}"
    )
    print(f"{'mode':<14} {'env steps':>9} {'gen tokens':>10} {'seconds':>8} {'steps/s':>8}")
    for label, steps, tokens, seconds, rate in rows:
        print(f"{label:<14} {steps:>9} {tokens:>10} {seconds:>8.1f} {rate:>8.2f}")
    print(f"lockstep / one-at-a-time: {rows[1][4] / rows[0][4]:.2f}x")
    if args.temperature == 0:
        same = episodes_by_mode["one at a time"] == episodes_by_mode["lockstep"]
        print(f"greedy actions identical in both modes: {same}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            rollout(make, agent, seeds, lockstep=True)
            seconds = time.perf_counter() - start
        print(f"profiled lockstep rollout: {seconds:.1f} s")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
