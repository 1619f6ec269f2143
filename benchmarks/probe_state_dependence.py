"""Can fine-tuning make the embedded model's move depend on the FrozenLake cell? A supervised probe.

The MS-GRPO runs with only the top 8 of SmolLM2-135M's 30 layers trainable collapsed to one move on
every cell. This probe asks whether that is a capacity limit of the trainable part rather than an RL
problem: it trains, with plain cross-entropy, the first answer token of the `frozenlake_learn` prompt
(after the prefill "I move") towards the planner's move on each of the 11 safe cells of the 4x4 map,
for a few full-batch Adam steps, and reports accuracy (argmax over the four move words) and how much
the move distribution differs between cells (mean total variation from the cells' average).

    .venv/bin/python benchmarks/probe_state_dependence.py                 # top 8 layers vs all layers
    .venv/bin/python benchmarks/probe_state_dependence.py --layers 4 8 16 0 --steps 30
"""

from __future__ import annotations

import argparse
import time

import torch


def measure(
    model, prompts: list[list[int]], moves: list[int], target: torch.Tensor
) -> tuple[float, float, float]:  # noqa: ANN001
    """(accuracy of the argmax move, mean total variation between the cells' move distributions and their
    average, mean first-token probability mass on the move words)."""
    from agentrl.kernels.kvcache import prefill_shared

    with torch.no_grad():
        logits = prefill_shared(model, prompts, 0)[1].float()
    mass = torch.softmax(logits, -1)[:, moves].sum(-1).mean().item()
    probs = torch.softmax(logits[:, moves], -1)
    accuracy = (probs.argmax(-1) == target).float().mean().item()
    tv = 0.5 * (probs - probs.mean(0, keepdim=True)).abs().sum(-1).mean().item()
    return accuracy, tv, mass


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 0], help="trainable top layers (0: all)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from learn_frozenlake import cell_contexts  # this script's directory is on sys.path

    from agentrl.agents.llm import build_llm_agent
    from agentrl.agents.planning_grid import frozenlake_action
    from agentrl.config import compose_config
    from agentrl.kernels.kvcache import prefill_shared
    from agentrl.models import freeze_layers, load_model

    cfg = compose_config(["task=train", "algo=msgrpo", "experiment=frozenlake_learn"])
    cells, contexts = cell_contexts(cfg)
    print(
        f"{len(cells)} cells; planner moves: "
        + " ".join(
            f"{cell}:{ctx.env.action_names[frozenlake_action(ctx)]}"
            for cell, ctx in zip(cells, contexts, strict=True)
        )
    )
    print("| trainable layers | accuracy by step (every 3) | final accuracy | final mean TV | s/step |")
    print("|---|---|---|---|---|")
    for layers in args.layers:
        torch.manual_seed(0)
        model, tokenizer = load_model(cfg.model, for_training=True)
        freeze_layers(model, layers or None)
        agent = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
        prompts = agent.prompt_ids(
            [agent.interface.render(agent.interface.messages(c), tokenizer) for c in contexts]
        )
        moves = [
            tokenizer(" " + name, add_special_tokens=False).input_ids[0]
            for name in contexts[0].env.action_names
        ]
        target = torch.tensor([frozenlake_action(ctx) for ctx in contexts])
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)

        accuracy, tv, mass = measure(model, prompts, moves, target)
        if layers == args.layers[0]:
            print(
                f"base model: accuracy {accuracy:.2f}, mean TV {tv:.3f}, first-token mass on the moves {mass:.2f}"
            )
        history = []
        start = time.perf_counter()
        for step in range(1, args.steps + 1):
            logits = prefill_shared(model, prompts, 0)[1].float()
            loss = torch.nn.functional.cross_entropy(logits, torch.tensor(moves)[target])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            if step % 3 == 0 or step == args.steps:
                history.append(measure(model, prompts, moves, target)[0])
        seconds = (time.perf_counter() - start) / args.steps
        accuracy, tv, _ = measure(model, prompts, moves, target)
        print(
            f"| {layers or 'all'} | {' '.join(f'{a:.2f}' for a in history)} | {accuracy:.2f} | {tv:.3f} | {seconds:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
