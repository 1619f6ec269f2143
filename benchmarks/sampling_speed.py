"""Seconds per sampled token batch: `torch.multinomial` over the warped softmax (transformers' warpers, how
the rollout sampled before) against `agents/backends/sampling.py::sample_tokens` (one uniform number a row
through the kept tokens' cumulative distribution), at a lockstep rollout's shapes: rows x SmolLM2's
vocabulary of 49,152, with and without top-k. Both sides also take the sampled token's log-prob
(log_softmax at the temperature), as `HFBackend._sample` does.

    .venv/bin/python benchmarks/sampling_speed.py --threads 2
    .venv/bin/python benchmarks/sampling_speed.py --rows 256 16 --top-k 5 0 --out outputs/bench/sampling

Results: a table on stdout, and `--out` (.json and .md) when given.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch


def multinomial_sample(scores: torch.Tensor, top_k: int, generator: torch.Generator) -> torch.Tensor:
    """The rollout's sampler before: transformers' warpers, then torch.multinomial (an exponential variable
    for every vocabulary entry of every row)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

    warpers = LogitsProcessorList([TemperatureLogitsWarper(1.0)])
    if top_k > 0:
        warpers.append(TopKLogitsWarper(top_k))
    torch.log_softmax(scores, dim=-1)
    warped = warpers(None, scores)
    return torch.multinomial(torch.softmax(warped, -1), 1, generator=generator).squeeze(1)


def cumulative_sample(scores: torch.Tensor, top_k: int, generator: torch.Generator) -> torch.Tensor:
    from agentrl.agents.backends.sampling import sample_tokens

    torch.logsumexp(scores, -1)
    return sample_tokens(scores, top_k, 1.0, generator)


def seconds(fn: Any, scores: torch.Tensor, top_k: int, repeats: int) -> float:
    """Median seconds of `repeats` calls after a warm-up."""
    generator = torch.Generator().manual_seed(0)
    fn(scores, top_k, generator)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(scores, top_k, generator)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[256, 16])
    parser.add_argument("--top-k", type=int, nargs="+", default=[5, 0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for rows in args.rows:
        scores = torch.randn(rows, args.vocab, generator=torch.Generator().manual_seed(rows)) * 3
        for top_k in args.top_k:
            # alternate the two samplers so the machine's load hits both alike
            before = seconds(multinomial_sample, scores, top_k, args.repeats)
            after = seconds(cumulative_sample, scores, top_k, args.repeats)
            results.append(
                {
                    "rows": rows,
                    "top_k": top_k,
                    "multinomial_ms": round(1000 * before, 2),
                    "cumulative_ms": round(1000 * after, 2),
                    "speedup": round(before / after, 2),
                }
            )
    command = "python benchmarks/sampling_speed.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items()
        if v is not None and k != "out"
    )
    lines = [
        "# Sampling one token a row (`benchmarks/sampling_speed.py`)",
        "",
        f"`{command}`",
        "",
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} threads, "
        f"vocabulary {args.vocab}; median of {args.repeats} calls.",
        "",
        "| rows | top-k | torch.multinomial ms | sample_tokens ms | speedup |",
        "|---|---|---|---|---|",
        *(
            f"| {r['rows']} | {r['top_k'] or 'off'} | {r['multinomial_ms']} | {r['cumulative_ms']} | "
            f"{r['speedup']}x |"
            for r in results
        ),
    ]
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sampling_speed.json").write_text(
            json.dumps({"command": command, "results": results}, indent=1)
        )
        (args.out / "sampling_speed.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
