"""`algo=sft`: supervised fine-tuning on demonstrations with TRL's `SFTTrainer` (docs/algorithms.md#sft).

    demonstrations  a classic agent (`algo.demonstrations`: the planner, or uniformly random valid
                    actions), or the model itself choosing by its scores of the valid actions (`scored`),
                    plays `algo.episodes` episodes on training seeds (`iteration.training_seed`, below
                    `eval.seed_offset`: never a held-out eval seed)
    rows            every step -> one prompt-completion pair written through the LLM agent's own interface:
                    the prompt is exactly the text the agent renders there (chat template, history,
                    prefill), the completion the answer the strict parser reads as the demonstrated
                    action (`agents/llm.py demonstration_answer`). Both are tokenised as the agent does
                    (separately, no special tokens added), so the model learns the token boundary it
                    generates at; the closing answer tag is followed by the end-of-turn token
    update          TRL's SFTTrainer on the tokenised rows: the loss is on the completion tokens only
                    (`completion_only_loss`), TRL's collator, optimizer, scheduler and logging. On a CPU
                    with one process the loss's forward is the update's shared-prefix kernel
                    (`trainers/logps.py`): the batch's common prompt prefix (the instructions) runs once
                    and only the answer tokens reach the LM head; same loss, same gradients
    run             as every training run: eval before/after on the held-out seeds (eval.json),
                    metrics.jsonl (the loss, answer entropy, learning rate, ...), `final/`

`check_sft` (the pre-launch checks) imports neither torch nor TRL; `init_from=` is the runner's (runs/launch.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from agentrl.agents.base import Agent
from agentrl.errors import ConfigError
from agentrl.types import Decision, EnvFactory, Episode, Generation, StepContext, TrainResult

log = logging.getLogger(__name__)

#: demonstration rows whose answer log-likelihood is measured before and after training (eval.json)
NLL_ROWS = 8


def check_sft(cfg: DictConfig) -> None:
    """Pre-launch checks of algo=sft: an env with action names, and one the planner plays."""
    from agentrl.agents.llm import env_free_text

    if env_free_text(cfg):
        raise ConfigError(
            f"algo=sft: {cfg.env.name}'s answers are free text; demonstrations need action names"
        )
    if cfg.algo.demonstrations == "planner":
        teacher(cfg)  # an env without a planner fails here, in one line


def teacher(cfg: DictConfig, policy: Any = None) -> Agent:
    """The agent that plays the demonstrations (`algo.demonstrations`). `scored` is `policy` (the LLM agent
    of the model being trained) deciding as TWOSOME does: every valid action scored, one sampled from the
    normalised scores at temperature 1. Its demonstrations are the model's own choices written in the
    answer format, so the warm-up teaches the format without the frequency bias of `random` (an action
    listed in every state, as the kitchen's delivery, is the most common random answer, and a model that
    does not yet read the list learns it as the most likely one everywhere)."""
    from agentrl.agents.baselines import PlannerAgent, RandomAgent

    if cfg.algo.demonstrations == "random":
        return RandomAgent()
    if cfg.algo.demonstrations == "scored":
        from agentrl.agents.backends import SamplingConfig

        if policy is None:
            raise ConfigError("algo.demonstrations=scored needs the model being trained (its LLM agent)")
        return policy.configured(sampling=SamplingConfig(temperature=1.0), decision="score")
    from agentrl.config.agent import PlannerAgentConfig

    # the planner's own defaults (agent=planner's ucb_c, linucb_alpha), as `agentrl eval agent=planner` plays
    fields = dataclasses.fields(PlannerAgentConfig)
    options = {f.name: f.default for f in fields if f.name not in ("name", "explore")}
    return PlannerAgent(cfg.env.name, **options)


class Demonstrator(Agent):
    """`teacher`'s decisions, each with the generation the LLM agent would have made to take it: the
    agent's prompt, and the answer in its format (the demonstration text)."""

    name = "demonstrator"

    def __init__(self, teacher: Agent, interface: Any, tokenizer: Any, state_facts: bool = False):
        self.teacher, self.interface, self.tokenizer = teacher, interface, tokenizer
        self.state_facts = state_facts
        self._tag_end = f"</{interface.answer_tag}>"
        self._end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]

    def act(self, contexts: list[StepContext]) -> list[Decision]:
        from agentrl.agents.llm import demonstration_answer

        decisions = self.teacher.act(contexts)
        for ctx, decision in zip(contexts, decisions, strict=True):
            valid = ctx.info.get("valid_actions") or ctx.env.valid_actions()
            action = ctx.env.action_names[decision.action]
            prompt = self.interface.render(self.interface.messages(ctx), self.tokenizer)
            facts = ctx.env.facts() if self.state_facts else None
            answer = demonstration_answer(self.interface, action, list(valid), facts)
            ids = self._ids(answer)
            decision.generation = Generation(prompt, answer, self._ids(prompt), ids + self._turn_end(answer))
        return decisions

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _turn_end(self, answer: str) -> list[int]:
        # an answer that closes its tag ends the assistant's turn; a bare one-token answer after a
        # prefill is all the agent generates, so nothing follows it
        return self._end if answer.endswith(self._tag_end) else []


def demonstration_seeds(cfg: DictConfig, episodes: int) -> list[int]:
    """Training seeds of the demonstration episodes: iteration 0's groups of `iteration.training_seed`,
    below `eval.seed_offset`, so they never meet the held-out eval seeds."""
    from agentrl.trainers.iteration import training_seed

    return [training_seed(int(cfg.seed), 0, k, int(cfg.eval.seed_offset)) for k in range(episodes)]


def demonstrations(
    cfg: DictConfig, env_factory: EnvFactory, interface: Any, tokenizer: Any, policy: Any = None
) -> list[Episode]:
    """`algo.episodes` episodes of the teacher on training seeds of the env `env_factory` builds; every
    step carries its demonstration. `policy`: the LLM agent of the model being trained (the `scored`
    teacher)."""
    from agentrl.rollout import rollout

    seeds = demonstration_seeds(cfg, int(cfg.algo.episodes))
    agent = Demonstrator(teacher(cfg, policy), interface, tokenizer, state_facts=bool(cfg.algo.state_facts))
    return rollout(env_factory(cfg.env), agent, seeds, list(range(len(seeds))), agent_seed=int(cfg.seed))


def demonstration_rows(episodes: list[Episode]) -> list[dict[str, list[int]]]:
    """One tokenised SFT row per step: prompt + completion ids and the mask of the completion tokens."""
    rows = []
    for episode in episodes:
        for step in episode.steps:
            generation = step.generation
            prompt, completion = list(generation.prompt_ids), list(generation.completion_ids)
            rows.append(
                {
                    "input_ids": prompt + completion,
                    "completion_mask": [0] * len(prompt) + [1] * len(completion),
                }
            )
    return rows


def answer_nll(model: Any, rows: list[dict[str, list[int]]]) -> float:
    """Mean negative log-likelihood per completion token of `rows` under `model` (no gradient). The
    completion ends each row, so only the logits of its last positions are computed."""
    import torch

    device = next(model.parameters()).device
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]], device=device)
            n = sum(row["completion_mask"])
            logits = model(ids, logits_to_keep=n + 1).logits[0, :-1].float()  # predict the n answer tokens
            picked = torch.log_softmax(logits, -1).gather(1, ids[0, -n:, None])
            total -= float(picked.sum())
            count += n
    model.train(was_training)
    return total / max(count, 1)


def sft_config(algo: Any, run_dir: Path, device: str, seed: int, precision: str) -> Any:
    """TRL's SFTConfig from the typed algo config: completion-only loss, no TRL-side saving or logging."""
    from trl import SFTConfig

    scheduler = algo.lr_scheduler
    if scheduler == "constant" and algo.warmup_steps > 0:
        scheduler = "constant_with_warmup"  # transformers' "constant" ignores warmup_steps silently
    return SFTConfig(
        output_dir=str(run_dir),
        num_train_epochs=algo.epochs,
        max_steps=algo.max_updates or -1,
        per_device_train_batch_size=algo.batch_size,
        gradient_accumulation_steps=algo.gradient_accumulation_steps,
        learning_rate=algo.learning_rate,
        lr_scheduler_type=scheduler,
        warmup_steps=algo.warmup_steps,
        weight_decay=algo.weight_decay,
        max_grad_norm=algo.max_grad_norm,
        completion_only_loss=True,  # the rows are tokenised already (their completion_mask)
        max_length=None,  # a demonstration is never cut: its answer is at the end
        bf16=precision == "bf16-mixed",
        use_cpu=not device.startswith("cuda"),
        # TRL turns gradient checkpointing on by default; these rows are short and it costs a second forward
        activation_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
    )


def train_sft(cfg: DictConfig, run_dir: Path, env_factory: EnvFactory, resume: bool = False) -> TrainResult:
    """Train on demonstrations played on the env `env_factory` builds; write metrics.jsonl,
    eval_before.json and final/ into `run_dir` (eval.json is the runner's). `resume`: SFT keeps no checkpoints, so it trains again from the start."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from agentrl import distributed as dist
    from agentrl.agents.llm import build_llm_agent, warn_if_lenient
    from agentrl.config import typed
    from agentrl.console import set_torch_threads
    from agentrl.evaluation import eval_record, eval_seeds, evaluate
    from agentrl.models import load_model, model_config, resolve_device
    from agentrl.runs.runlog import MetricsLog, progress, write_json
    from agentrl.trainers.settings import resolve_precision

    if dist.world_size() > 1:
        raise ConfigError("algo=sft runs in one process: use distributed=none")
    algo = typed(cfg.algo)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    set_torch_threads(algo.torch_threads)
    warn_if_lenient(cfg)
    if resume:
        log.warning("algo=sft keeps no checkpoints: %s trains again from the start", run_dir)

    model_cfg = model_config(cfg.model)
    device = resolve_device(model_cfg.device)
    precision = resolve_precision(algo.precision, device)
    lora_base = precision == "bf16-mixed" and model_cfg.lora.r > 0
    dtype = "bfloat16" if precision == "bf16-pure" or lora_base else "float32"
    model, tokenizer = load_model(dataclasses.replace(model_cfg, dtype=dtype), for_training=True)
    policy = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    max_new = algo.max_new_tokens or policy.sampling.max_new_tokens
    eval_agent = policy.configured(
        sampling=dataclasses.replace(
            policy.sampling, temperature=algo.eval_temperature, max_new_tokens=max_new
        )
    )
    eval_env, seeds, seed = env_factory(cfg.env), eval_seeds(cfg), int(cfg.seed)

    def run_eval(description: str) -> tuple[dict[str, Any], list[Episode]]:
        return evaluate(
            eval_env, eval_agent, seeds, lockstep=cfg.eval.lockstep, description=description, agent_seed=seed
        )

    before = None
    if algo.eval_before:
        before = eval_record(*run_eval("eval before training"))
        write_json(run_dir / "eval_before.json", before)
        log.info(
            "Before training: success %.3f return %.3f invalid %.3f",
            before["success_rate"],
            before["mean_return"],
            before["invalid_rate"],
        )

    played = demonstrations(cfg, env_factory, policy.interface, tokenizer, policy)
    rows = demonstration_rows(played)
    demo = {
        "demonstrations": algo.demonstrations,
        "episodes": len(played),
        "steps": len(rows),
        "success_rate": sum(e.success for e in played) / max(len(played), 1),
        "mean_return": sum(e.episode_return for e in played) / max(len(played), 1),
        "seeds": [e.seed for e in played],
    }
    log.info("Demonstrations: %d episodes (%s), %d steps", len(played), algo.demonstrations, len(rows))
    if not rows:
        raise ConfigError("algo=sft: the demonstrations have no steps to train on")
    demo["answer_nll_before"] = answer_nll(model, rows[:NLL_ROWS])

    trainer = shared_prefix_sft_trainer()(
        model=model,
        args=sft_config(algo, run_dir, device, seed, precision),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    metrics_log = MetricsLog(run_dir)
    start = time.perf_counter()
    try:
        with progress("sft", total=None) as bar:
            trainer.add_callback(_metrics_rows(metrics_log, bar))
            trainer.train()
    finally:
        metrics_log.close()
    train_time = time.perf_counter() - start
    demo["answer_nll_after"] = answer_nll(model, rows[:NLL_ROWS])
    log.info(
        "Answer NLL on the demonstrations: %.4f -> %.4f", demo["answer_nll_before"], demo["answer_nll_after"]
    )

    if algo.save_final:
        with dist.shared_atomic_dir(run_dir / "final") as tmp:
            trainer.save_model(str(tmp))
            tokenizer.save_pretrained(str(tmp))
    final, episodes = run_eval("eval after training")
    log.info(
        "After training: success %.3f return %.3f invalid %.3f",
        final["success_rate"],
        final["mean_return"],
        final["invalid_rate"],
    )
    (run_dir / "demonstrations.json").write_text(json.dumps(demo, indent=2) + "\n")
    extra: dict[str, Any] = {
        "updates": trainer.state.global_step,
        "train_time_s": round(train_time, 3),
        "demonstrations": {k: v for k, v in demo.items() if k != "seeds"},
    }
    if before is not None:
        extra["before"] = before
    return TrainResult(final, episodes, extra)


def shared_prefix_sft_trainer() -> type:
    """TRL's SFTTrainer whose training loss runs through `shared_prefix_logps` on a CPU with one process:
    every row is a prompt followed by its answer (the completion tokens end it), so the rows are laid out
    as left-padded prompts and right-padded answers, the batch's common prompt prefix runs once and only
    the answer positions go through the LM head. The loss is TRL's: the answer tokens' negative
    log-likelihood summed over the batch, divided by `num_items_in_batch` (the answer tokens of the
    optimizer step). Elsewhere (CUDA's fused LM head, several processes, evaluation) it is TRL's own."""
    import torch
    from trl import SFTTrainer

    from agentrl.trainers.logps import kernel_applies, shared_prefix_logps

    class SharedPrefixSFTTrainer(SFTTrainer):
        def compute_loss(
            self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            ids = inputs["input_ids"]
            if (
                return_outputs
                or not model.training
                or not kernel_applies(ids.device.type, self.accelerator.num_processes)
                or "attention_mask" not in inputs
                or "labels" not in inputs
            ):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            batch, answer_mask = split_rows(ids, inputs["attention_mask"], inputs["labels"])
            logps, entropies = shared_prefix_logps(
                model, batch["input_ids"], batch["attention_mask"], answer_mask.size(1), compute_entropy=True
            )
            tokens = answer_mask.sum() if num_items_in_batch is None else num_items_in_batch
            loss = -(logps * answer_mask).sum() / torch.as_tensor(tokens).clamp(min=1)
            counted = answer_mask.sum()
            self._metrics["train"]["entropy"].append(
                float((entropies * answer_mask).sum() / counted) if counted > 0 else 0.0
            )
            self._total_train_tokens += int(inputs["attention_mask"].sum())
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
            return loss

    return SharedPrefixSFTTrainer


def split_rows(input_ids: Any, attention_mask: Any, labels: Any) -> tuple[dict[str, Any], Any]:
    """TRL's right-padded SFT rows (prompt, answer, padding; `labels` -100 outside the answer) ->
    ({input_ids, attention_mask} of left-padded prompts followed by right-padded answers, the answers'
    mask (B, A)), the layout `shared_prefix_logps` takes."""
    import torch

    prompts, answers = [], []
    for ids, mask, label in zip(input_ids.tolist(), attention_mask.tolist(), labels.tolist(), strict=True):
        length = sum(mask)
        answer = [i for i, lab in enumerate(label[:length]) if lab != -100]
        if not answer or answer != list(range(answer[0], length)):
            raise ValueError("an SFT row's answer tokens must end the row")
        if answer[0] == 0:
            raise ValueError("an SFT row needs at least one prompt token before its answer")
        prompts.append(ids[: answer[0]])
        answers.append(ids[answer[0] : length])
    width, answer_width = max(map(len, prompts)), max(map(len, answers))
    rows, masks, answer_mask = [], [], []
    for prompt, answer in zip(prompts, answers, strict=True):
        left, right = width - len(prompt), answer_width - len(answer)
        rows.append([0] * left + prompt + answer + [0] * right)
        masks.append([0] * left + [1] * (len(prompt) + len(answer)) + [0] * right)
        answer_mask.append([1] * len(answer) + [0] * right)
    device = input_ids.device
    batch = {
        "input_ids": torch.tensor(rows, device=device),
        "attention_mask": torch.tensor(masks, device=device),
    }
    return batch, torch.tensor(answer_mask, device=device, dtype=torch.float32)


def _metrics_rows(metrics_log: Any, bar: Any) -> Any:
    """A TRL callback: each logged step's numbers (loss, entropy, lr, ...) -> metrics.jsonl."""
    from transformers import TrainerCallback

    class MetricsRows(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if state.max_steps and state.max_steps > 0:  # the updates the trainer will run: count and ETA
                bar.set_total(state.max_steps)
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
            if logs and "train_runtime" not in logs:  # not the end-of-training summary
                metrics_log.log(state.global_step, dict(logs))
                bar.advance(f"loss {logs.get('loss', float('nan')):.4f}")
            return control

    return MetricsRows()


__all__ = [
    "Demonstrator",
    "answer_nll",
    "check_sft",
    "demonstration_rows",
    "demonstration_seeds",
    "demonstrations",
    "sft_config",
    "shared_prefix_sft_trainer",
    "split_rows",
    "teacher",
    "train_sft",
]
