"""Training rollouts from the fp32 trained weights vs from a bf16 copy (`algo.rollout_dtype=bfloat16`),
side by side: same model, preset, episodes, seeds and sampling, the two runs alternating `--repeats` times.

(a) fp32: `HFBackend` on the fp32 model, as the trainer generates with `algo.rollout_dtype=null`;
(b) bf16 copy: `HFCopyBackend`, synced from the same fp32 model (the sync's time is counted).

For (b)'s completions it also reports how far the copy's log-probs are from the fp32 weights' (what
TRL's importance-sampling ratio corrects): the mean per-token |log p_fp32 - log p_bf16| and the share of
rows whose sequence ratio exp(sum of the differences) falls outside [1/3, 3] (masked by the trainer's
default `sequence_mask` correction).

    .venv/bin/python benchmarks/rollout_dtype.py                          # experiment=rlft_bandit, 8 episodes
    .venv/bin/python benchmarks/rollout_dtype.py --episodes 8 --horizon 5 --repeats 1   # a quick look
    .venv/bin/python benchmarks/rollout_dtype.py --model tiny-random --horizon 2        # smoke test

A bf16 forward is fast only where the hardware has bf16 matrix units (CUDA; on a CPU, AMX or
AVX512-BF16: `grep -o 'amx_bf16\\|avx512_bf16' /proc/cpuinfo`); elsewhere (b) can be slower than (a).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from agentrl.agents.backends import HFBackend, HFCopyBackend
from agentrl.agents.llm import build_llm_agent
from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.models import load_model
from agentrl.rollout import rollout


def train_logps(model, prompt_ids: list[int], completion_ids: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of the completion tokens under `model` (the trainer's old log-probs)."""
    ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    targets = torch.tensor(completion_ids, device=model.device)[:, None]
    return torch.log_softmax(logits, -1).gather(1, targets).squeeze(1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiment", default="rlft_bandit", help="the preset whose env and agent play")
    parser.add_argument(
        "--model", default=None, help="model config (default: the preset's, the embedded 135M)"
    )
    parser.add_argument(
        "--episodes", type=int, default=8, help="episodes per rollout (rlft_bandit: 2 groups of 4)"
    )
    parser.add_argument("--horizon", type=int, default=None, help="env.horizon override (bandits)")
    parser.add_argument("--temperature", type=float, default=1.0, help="rollout temperature (the preset's)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where the model runs"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    # fp32 weights, as the trainer holds them under fp32 and bf16-mixed (model.dtype's "auto" is bf16 on CUDA)
    overrides = [
        f"experiment={args.experiment}",
        f"agent.sampling.temperature={args.temperature}",
        "model.dtype=float32",
    ]
    if args.model:
        overrides.append(f"model={args.model}")
    if args.horizon:
        overrides.append(f"env.horizon={args.horizon}")
    cfg = compose_config(overrides)
    model, tokenizer = load_model(cfg.model, device=args.device)
    fp32 = build_llm_agent(cfg, model=model, tokenizer=tokenizer, share_prompts=True)
    copy_backend = HFCopyBackend(model, tokenizer, torch.bfloat16, share_prompts=True)
    bf16 = fp32.with_backend(copy_backend)
    make_env = env_factory(cfg.env)
    seeds = list(range(args.episodes))

    times: dict[str, list[float]] = {"fp32": [], "bf16_copy": []}
    steps: dict[str, int] = {}
    bf16_episodes = []
    for repeat in range(args.repeats):
        for name in ("fp32", "bf16_copy"):
            if isinstance(fp32.backend, HFBackend):
                fp32.backend.weights_changed()  # no prefix states kept from the previous repeat
            start = time.perf_counter()
            if name == "bf16_copy":
                copy_backend.sync_weights()
            episodes = rollout(make_env, fp32 if name == "fp32" else bf16, seeds, agent_seed=repeat)
            times[name].append(time.perf_counter() - start)
            steps[name] = sum(len(e.steps) for e in episodes)
            if name == "bf16_copy":
                bf16_episodes = episodes
            print(f"repeat {repeat} {name}: {times[name][-1]:.1f} s ({steps[name]} steps)", flush=True)

    diffs, outside, rows = [], 0, 0
    for episode in bf16_episodes:
        for step in episode.steps:
            if not step.completion_ids or step.logprobs is None:
                continue
            exact = train_logps(model, list(step.prompt_ids), list(step.completion_ids), args.temperature)
            delta = [a - b for a, b in zip(exact, step.logprobs, strict=True)]
            diffs.extend(abs(d) for d in delta)
            rows += 1
            ratio = float(torch.exp(torch.tensor(sum(delta))))
            outside += not (1 / 3 <= ratio <= 3)
    fp32_s, bf16_s = statistics.median(times["fp32"]), statistics.median(times["bf16_copy"])
    result = {
        "experiment": args.experiment,
        "model": cfg.model.name,
        "episodes": args.episodes,
        "steps_per_rollout": steps,
        "threads": args.threads,
        "device": args.device,
        "seconds": times,
        "median_s": {"fp32": fp32_s, "bf16_copy": bf16_s},
        "speedup": fp32_s / bf16_s,
        "mean_abs_logp_difference": statistics.fmean(diffs) if diffs else 0.0,
        "rows": rows,
        "rows_outside_ratio_bounds": outside,
    }
    print(
        f"fp32 {fp32_s:.1f} s, bf16 copy {bf16_s:.1f} s per rollout (medians of {args.repeats}): "
        f"{result['speedup']:.2f}x; mean |dlogp| {result['mean_abs_logp_difference']:.4f} over {len(diffs)} "
        f"tokens; {outside}/{rows} rows outside the ratio bounds [1/3, 3]"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
