"""`train_llm`: a training run of any LLM algorithm, from the composed config to the evaluation after it.

The run builds the policy (precision, weights, the critic when the algorithm has one), its two views
(training rollouts with the training sampling settings, greedy-ish evaluation), the environments and the
trainer; evaluates before training (once, kept across resumes); trains; saves the final model; and
evaluates after. One iteration of training (docs/architecture.md#one-training-iteration):

    rollout      groups of episodes with the current policy (trainers/iteration.py `Collector`: lockstep,
                 dynamic sampling), through the training view of the policy
    credit       the algorithm's pure credit assignment (agentrl/algos/<name>.py) -> rows with advantages
    pack         rows -> TRL's tensors (trainers/packing.py): prompt = that step's observation prompt,
                 completion = what the policy generated there, advantages, old log-probs, reference
                 log-probs when beta > 0, and with a critic its hidden states, old values and value targets
    update       TRL's clipped token-level surrogate, KL, the value loss, optimizer step, scheduler,
                 accumulation (trainers/grpo_trainer.py `MultiStepTrainer`); `algo.ppo_epochs` passes
                 with a KL gate on the policy's step
    callbacks    rollout-cache reset, time limit, periodic eval, checkpoints, metrics (callbacks.py)

Several processes (docs/distributed.md): each rolls out its own groups (the rank is in their seeds) and
plays every world-th evaluation seed; process 0 alone writes metrics and eval results. With
`model.backend=vllm` (or `algo.rollout_dtype`) the rollouts come from another engine, synced before each
(trainers/rollout_backends.py).

SIGTERM, SIGINT and SIGUSR1 during training (signals.py) save the last finished iteration's checkpoint,
then raise `TrainingInterrupted` (the run exits with 128 + the signal number).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from agentrl import distributed as dist
from agentrl.algos import LLM_ALGORITHMS
from agentrl.console import set_torch_threads
from agentrl.errors import ConfigError, TrainingIncomplete
from agentrl.kernels import features
from agentrl.kernels.features import fast_path
from agentrl.runs.rundir import metrics_rows, metrics_time_at, shell_override
from agentrl.runs.runlog import MetricsLog, newest_valid_checkpoint, progress
from agentrl.trainers.actor_critic import ActorCritic
from agentrl.trainers.callbacks import (
    BeforeTraining,
    CheckpointEvery,
    EndOnLoad,
    MetricsWriter,
    PeriodicEval,
    RolloutCacheReset,
    SignalSafePoints,
    TimeLimit,
    TrainingEnded,
)
from agentrl.trainers.checkpoints import trainer_step
from agentrl.trainers.critic import Critic, plain_lm_head
from agentrl.trainers.grpo_trainer import MultiStepTrainer, _unused_reward
from agentrl.trainers.iteration import Collector
from agentrl.trainers.logps import kernel_applies
from agentrl.trainers.rollout_backends import copy_rollouts, vllm_rollouts
from agentrl.trainers.run_evals import Evaluations
from agentrl.trainers.settings import activation_budget, cpu_precision_shapes, grpo_config, resolve_precision
from agentrl.trainers.signals import StopSignals, TrainingInterrupted, signal_name
from agentrl.types import EnvFactory, TrainResult

log = logging.getLogger(__name__)

# TRL's metric names -> ours (the rest keep TRL's names: entropy, kl, clip_ratio/...)
METRIC_RENAMES = {"clip_ratio/region_mean": "clip_fraction"}


def train_llm(cfg: DictConfig, run_dir: Path, env_factory: EnvFactory, resume: bool = False) -> TrainResult:
    """Train the LLM policy with the algorithm `cfg.algo.name` on the envs `env_factory` builds; write
    metrics.jsonl, checkpoints and final/ into `run_dir` (eval.json is the runner's). With `resume`,
    continue from the newest checkpoint in `run_dir`."""
    from agentrl.config import typed

    dist.ensure_process_group()  # before the model loads: each process on its own device
    if not dist.is_main():
        os.environ["AGENTRL_NO_PROGRESS"] = "1"  # one progress display: the main process's
    spec = LLM_ALGORITHMS[cfg.algo.name]
    algo = typed(cfg.algo)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    set_torch_threads(algo.torch_threads)
    checkpoint = _checkpoint_to_resume(run_dir, resume)

    loaded = _load_policy(cfg, algo, run_dir)
    critic = _build_critic(spec, algo, loaded, checkpoint, int(cfg.seed))
    policy, train_agent, eval_agent = _build_agents(cfg, spec, algo, loaded)
    evals = Evaluations.for_run(cfg, eval_agent, loaded.model, run_dir, env_factory)
    train_env, reset_options = _train_env(cfg, algo, env_factory)
    collector = Collector(
        spec,
        algo,
        train_env,
        train_agent,
        loaded.model,
        seed=int(cfg.seed),
        seed_limit=int(cfg.eval.seed_offset),
        critic=critic,
        pad_id=loaded.tokenizer.pad_token_id,
        reset_options=reset_options,
        rank=dist.rank(),
        world=dist.world_size(),
    )
    trainer = _build_trainer(algo, loaded, collector, critic)
    _share_reference(trainer, critic)
    collector.agent = _rollout_agent(trainer, train_agent, algo, loaded)
    collector.backend = trainer.rollout_backend
    _keep_rollout_graph(algo, spec, trainer, collector)

    wants_before = evals.before is None and algo.eval_before and checkpoint is None
    train_time = _train(trainer, cfg, algo, run_dir, resume, checkpoint, evals, policy, wants_before)

    if algo.save_final:
        _save_final(trainer, run_dir, loaded.tokenizer, critic)
    final, episodes = evals.run("eval after training")
    log.info("After training: success %.3f return %.3f", final["success_rate"], final["mean_return"])
    # the iterations trained: fewer than algo.iterations after a time limit or algo.stop_at_success
    done = int(trainer.state.global_step)
    extra: dict[str, Any] = {"iterations": done, "train_time_s": round(train_time, 3)}
    if evals.before is not None:
        extra["before"] = evals.before
    return TrainResult(final, episodes, extra)


def _checkpoint_to_resume(run_dir: Path, resume: bool) -> Path | None:
    """The newest complete checkpoint in `run_dir` when resuming (None: start from the beginning)."""
    checkpoint = newest_valid_checkpoint(run_dir, kind="dir") if resume else None
    if checkpoint is not None:
        log.info("Resuming from %s", checkpoint)
    elif resume:
        log.warning("No usable checkpoint in %s: starting from the beginning", run_dir)
    return checkpoint


@dataclasses.dataclass
class LoadedPolicy:
    """The policy as loaded for training, with TRL's config and the weights' dtype."""

    model: Any
    tokenizer: Any
    args: Any  # trl.GRPOConfig
    dtype: str
    model_cfg: Any  # agentrl.config.ModelConfig


def _load_policy(cfg: DictConfig, algo: Any, run_dir: Path) -> LoadedPolicy:
    """The policy's weights in the run's precision (`algo.precision`), with its layers frozen as
    `algo.trainable_layers` says, and TRL's config for the run."""
    from agentrl.models import freeze_layers, load_model, model_config, resolve_device

    model_cfg = model_config(cfg.model)
    device = resolve_device(model_cfg.device)
    precision = resolve_precision(
        algo.precision, device, cpu_precision_shapes(cfg.model, algo, device, dist.world_size())
    )
    if precision == "bf16-pure":
        log.warning(
            "algo.precision=bf16-pure: updates smaller than bf16's resolution are lost (use bf16-mixed)"
        )
    # the trainable weights are fp32 unless bf16-pure; under LoRA only the adapters train (PEFT keeps them
    # fp32), so the frozen base can stay bf16 with mixed precision
    lora_base = precision == "bf16-mixed" and model_cfg.lora.r > 0
    dtype = "bfloat16" if precision == "bf16-pure" or lora_base else "float32"
    # TRL's config first: under ZeRO-3 (and FSDP's RAM-efficient loading) building it tells transformers
    # to load the weights already sharded, instead of a full copy per process
    args = grpo_config(algo, run_dir, device, int(cfg.seed), precision, model_cfg.hub_kernels)
    model, tokenizer = load_model(dataclasses.replace(model_cfg, dtype=dtype), for_training=True)
    log.info("Precision: %s (weights %s)", precision, dtype)
    log.info("Trainable parameters: %d", freeze_layers(model, algo.trainable_layers))
    return LoadedPolicy(model, tokenizer, args, dtype, model_cfg)


def _build_critic(
    spec: Any, algo: Any, loaded: LoadedPolicy, checkpoint: Path | None, seed: int
) -> Critic | None:
    """The critic, when the algorithm has one (RLFT only for its GAE advantage: algo.advantage=gae)."""
    if not (spec.critic or getattr(algo, "advantage", "") == "gae"):
        return None
    # the critic's trunk is the initial policy: a frozen copy taken now, before any update (a resume loads
    # its weights later), or TRL's reference model of the same weights (`_share_reference`); the value head
    # on this process's device: under ZeRO-3/FSDP the model is not placed there until the Trainer prepares it
    critic = Critic(
        loaded.model, device=loaded.args.device, reference_trunk=_shares_reference(algo, loaded), seed=seed
    )
    if checkpoint is not None and not critic.load(checkpoint):
        log.warning("%s has no value head: the critic starts untrained", checkpoint.name)
    dist.broadcast_parameters(critic.head)  # outside DDP: every process starts from process 0's head
    log.info("Critic: value head on the frozen %s", "LoRA base" if critic.lora else "initial weights")
    return critic


def _shares_reference(algo: Any, loaded: LoadedPolicy) -> bool:
    """Whether the critic's trunk is TRL's reference model (`Critic.use_reference`): both are frozen models
    of the initial weights when there is a KL term under full fine-tuning. Kept apart where the reference
    differs or cannot serve: another dtype (`algo.ref_dtype`), logits that are not the plain LM head on
    the hidden state, LoRA (the trunk is the policy with its adapter off), several processes (a sharded or
    wrapped reference runs collectives)."""
    return (
        float(getattr(algo, "beta", 0.0)) != 0.0
        and not getattr(algo, "ref_dtype", None)
        and not hasattr(loaded.model, "peft_config")
        and plain_lm_head(loaded.model)
        and dist.world_size() == 1
    )


def _share_reference(trainer: MultiStepTrainer, critic: Critic | None) -> None:
    """Hand TRL's reference model to a critic built to take it as its trunk."""
    if critic is None or critic.trunk is not None:
        return
    if trainer.ref_model is None:
        raise RuntimeError("the critic waits for the reference model as its trunk, and TRL built none")
    critic.use_reference(trainer.ref_model, trainer.temperature)
    log.info(
        "Critic: its trunk is the reference model (one frozen copy; reference log-probs from its forward)"
    )


def _build_agents(cfg: DictConfig, spec: Any, algo: Any, loaded: LoadedPolicy) -> tuple[Any, Any, Any]:
    """The policy as an LLM agent, and its two views: training rollouts (the algorithm's sampling settings
    and invalid-answer penalty) and evaluation."""
    from agentrl.agents.llm import build_llm_agent, warn_if_lenient

    warn_if_lenient(cfg)
    if spec.name == "rlft" and not cfg.agent.get("cot", False):
        log.warning(
            "algo=rlft trains rationales: agent.cot=false asks for none, so only the answer trains "
            "(agent.cot=true is its default)"
        )
    if spec.decision != cfg.agent.get("decision", "generate"):
        # the algorithm decides how its policy acts (TWOSOME's scores every valid action)
        cfg = OmegaConf.merge(cfg, {"agent": {"decision": spec.decision}})
        log.info("agent.decision=%s (algo=%s)", spec.decision, spec.name)
    # model.backend=vllm trains with rollouts from TRL's vLLM engine (built after the trainer:
    # `_rollout_agent`); the policy's own view (evaluation, the critic) is the HF model
    vllm = loaded.model_cfg.backend == "vllm"
    policy_cfg = OmegaConf.merge(cfg, {"model": {"backend": "hf"}}) if vllm else cfg
    policy = build_llm_agent(
        policy_cfg, model=loaded.model, tokenizer=loaded.tokenizer, share_prompts=algo.shared_prefix
    )
    max_new = algo.max_new_tokens or policy.sampling.max_new_tokens
    train_agent = policy.configured(
        sampling=dataclasses.replace(
            policy.sampling,
            temperature=algo.temperature,
            top_k=algo.top_k,
            top_p=algo.top_p,
            max_new_tokens=max_new,
        ),
        invalid_penalty=algo.invalid_penalty,
    )
    eval_agent = policy.configured(
        sampling=dataclasses.replace(
            policy.sampling, temperature=algo.eval_temperature, max_new_tokens=max_new
        )
    )
    return policy, train_agent, eval_agent


def _truncated(make_env: Any, cap: int) -> Any:
    """`make_env`'s env with its episodes cut at `cap` moves: the same task and instances (a Frozen Lake
    map is drawn solvable within the env's own cap), shorter training episodes."""

    def make() -> Any:
        env = make_env()
        env.max_steps = cap
        return env

    return make


def _train_env(cfg: DictConfig, algo: Any, env_factory: EnvFactory) -> tuple[Any, dict[str, Any] | None]:
    """The training env's factory (`algo.max_steps` may shorten its episodes, `algo.curriculum` may add a
    shaping reward) and its reset options (`algo.curriculum`); evaluation is always the standard task."""
    train_env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    if algo.max_steps is not None and "max_steps" not in train_env_cfg:
        raise ConfigError(
            f"algo.max_steps needs an env with a move cap (env.max_steps); {cfg.env.name} has none"
        )
    if algo.curriculum.approach_reward:
        if "approach_reward" not in train_env_cfg:
            raise ConfigError(
                f"algo.curriculum.approach_reward needs an env with an approach reward (snake); "
                f"{cfg.env.name} has none"
            )
        train_env_cfg["approach_reward"] = algo.curriculum.approach_reward
    train_env = env_factory(train_env_cfg)
    if algo.max_steps is not None:
        train_env = _truncated(train_env, int(algo.max_steps))
    count = algo.curriculum.count_start_moves
    if algo.curriculum.random_start <= 0:
        if count:
            raise ConfigError("algo.curriculum.count_start_moves=true needs algo.curriculum.random_start > 0")
        return train_env, None
    probe = train_env()
    names = probe.reset_option_names
    probe.close()
    if "random_start" not in names:
        raise ConfigError(
            f"algo.curriculum.random_start needs an env with a random start; {cfg.env.name} has none"
        )
    if count and "count_start_moves" not in names:
        raise ConfigError(
            f"algo.curriculum.count_start_moves needs an env whose part-way starts are moves (kitchen); "
            f"{cfg.env.name} has none"
        )
    options: dict[str, Any] = {"random_start": algo.curriculum.random_start}
    if count:
        options["count_start_moves"] = True
    return train_env, options


def _build_trainer(
    algo: Any, loaded: LoadedPolicy, collector: Collector, critic: Critic | None
) -> MultiStepTrainer:
    """TRL's side of the run: `MultiStepTrainer` on the policy, its iterations built by `collector`."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer = MultiStepTrainer(
        model=loaded.model,
        reward_funcs=[_unused_reward],
        args=loaded.args,
        processing_class=loaded.tokenizer,
        collect=collector,
        shared_prefix=algo.shared_prefix,
        keep_checkpoints=algo.keep_checkpoints,
        actor_critic=None
        if critic is None
        else ActorCritic(critic, algo.critic_learning_rate, algo.value_coef, algo.value_clip),
        ppo_epochs=getattr(algo, "ppo_epochs", 1),
        target_kl=getattr(algo, "target_kl", None),
        max_batch_tokens=algo.max_batch_tokens,
        memory_share=algo.memory_share,
    )
    trainer.remove_callback(PrinterCallback)  # the progress bar and metrics.jsonl replace its prints
    trainer.remove_callback(ProgressCallback)
    return trainer


def _rollout_agent(trainer: MultiStepTrainer, agent: Any, algo: Any, loaded: LoadedPolicy) -> Any:
    """The training view `agent`, generating through TRL's vLLM engine (`model.backend=vllm`) or a copy
    in `algo.rollout_dtype` where the run asks for one (which becomes `trainer.rollout_backend`)."""
    if loaded.model_cfg.backend == "vllm":
        return vllm_rollouts(trainer, agent, algo, loaded.model_cfg, loaded.tokenizer)
    if algo.rollout_dtype:
        return copy_rollouts(trainer, agent, loaded.model, algo, loaded.dtype)
    return agent


def rollout_graph_reason(spec: Any, trainer: MultiStepTrainer, agent: Any) -> str | None:
    """Why the update cannot backpropagate through the rollout's forward (None: it can). The rollout's
    logits serve the loss only if they are the update's own forward run earlier: the trained policy
    generated them (not a copy or vLLM), answers are one token (the logits at the prompt's end are all
    the loss reads), the update's kernel runs (a CPU, one process), and it is a single backward with the
    rollout's weights and train-mode numerics (one micro-batch, no PPO epochs, no activation checkpointing,
    no dropout: the rollout runs in eval mode)."""
    backend = getattr(agent, "backend", None)
    if trainer.rollout_backend is not None or not hasattr(backend, "recording_graphs"):
        return "another engine generates the rollouts"
    if not backend.share_prompts:
        return "algo.shared_prefix=false"
    if agent.sampling.max_new_tokens != 1 or spec.decision != "generate":
        return "answers are not one generated token"
    if not kernel_applies(trainer.args.device.type, trainer.accelerator.num_processes):
        return "the update's log-probs are TRL's (not a CPU with one process)"
    if trainer.args.steps_per_generation != 1 or trainer.ppo_epochs != 1 or trainer.num_iterations != 1:
        return "the update runs more than one micro-batch or epoch"
    if trainer.args.gradient_checkpointing:
        return "algo.gradient_checkpointing=true"
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in trainer.model.modules()):
        return "the model has dropout"
    return None


def _keep_rollout_graph(algo: Any, spec: Any, trainer: MultiStepTrainer, collector: Collector) -> None:
    """`algo.rollout_graph`: the rollout records its forward and the update takes it, where that applies
    (and `AGENTRL_CPU_FEATURES` does not switch it off: no-rollout-graph)."""
    if not algo.rollout_graph:
        return
    if not fast_path("rollout-graph"):
        log.info("algo.rollout_graph: off (%s=%s)", features.ENV, os.environ.get(features.ENV))
        return
    reason = rollout_graph_reason(spec, trainer, collector.agent)
    if reason is not None:
        log.debug("algo.rollout_graph does not apply: %s", reason)
        return
    # as many tokens with gradients as one update pass may run: auto's activation budget, or the padded
    # tokens of an explicit max_batch_tokens; with none (null), the activations that fill auto's share of
    # the free memory, since a rollout may run many more prompts than its update keeps
    budget = trainer.prompt_budget or (None if trainer.budget_completions_only else trainer.max_batch_tokens)
    if budget is None:
        budget = activation_budget(trainer.model, str(trainer.args.device), algo.memory_share)
    collector.record_graphs, collector.graph_budget = True, budget
    trainer.recorded_logits = collector.agent.backend.recorded_logits
    log.info(
        "The update backpropagates through the rollout's forward (algo.rollout_graph; at most %d tokens)",
        budget,
    )


def _train(
    trainer: MultiStepTrainer,
    cfg: DictConfig,
    algo: Any,
    run_dir: Path,
    resume: bool,
    checkpoint: Path | None,
    evals: Evaluations,
    policy: Any,
    wants_before: bool,
) -> float:
    """`trainer.train` with the run's callbacks (eval before training, rollout-cache reset, time limit,
    periodic eval and its stop at a target, checkpoints, metrics.jsonl, signals); a stopping signal saves
    and raises, and so does training that ends short of `algo.iterations` with neither its time limit nor
    its target reached (`TrainingIncomplete`). Returns the seconds training took."""
    main = dist.is_main()
    pending: dict[str, Any] = {}
    minutes = algo.time_limit_minutes
    metrics_log = MetricsLog(run_dir, resume=resume) if main else None
    done_before = trainer_step(checkpoint)
    # several processes stop together: a signal only marks the stop, and every iteration's start asks all
    stop = StopSignals(collective=dist.world_size() > 1)

    def periodic_eval(step: int) -> dict[str, Any]:
        if dist.any_true(stop.stopping):  # a signal held during this iteration: the checkpoint comes first
            return {}
        return evals.run(f"eval @ {step}", algo.periodic_eval_episodes)[0]

    # the run's training clock goes on from the checkpoint's iteration, so the limit is the whole run's
    limit = TimeLimit(
        minutes * 60 if minutes else None, metrics_time_at(run_dir, done_before) if checkpoint else 0
    )
    target = PeriodicEval(algo.eval_every, periodic_eval, pending, algo.stop_at_success)
    finished = _stopped_at_target(run_dir, checkpoint, algo)
    if finished is not None:
        log.info(
            "checkpoint-%d is where this run stopped at algo.stop_at_success=%g (eval success %.3f): "
            "no more training; its final model and eval follow",
            done_before,
            algo.stop_at_success,
            finished,
        )
    elif limit.spent:
        log.info(
            "checkpoint-%d is where this run's training clock (%.1f min) crossed algo.time_limit_minutes=%g: "
            "no more training; its final model and eval follow (a larger limit trains on)",
            done_before,
            limit.used / 60,
            minutes,
        )
    # every process ends here or none does (each read metrics.jsonl for itself)
    ends_on_load = dist.any_true(finished is not None or limit.spent)
    start = time.perf_counter()
    with stop:
        try:
            with progress(cfg.algo.name, total=algo.iterations) as bar:
                if done_before:
                    bar.advance(n=done_before)
                for callback in (
                    EndOnLoad() if ends_on_load else None,
                    BeforeTraining(evals.before_training) if wants_before else None,
                    RolloutCacheReset(policy.backend, trainer.rollout_backend),
                    limit,
                    target,
                    CheckpointEvery(algo.checkpoint_every),
                    MetricsWriter(metrics_log, bar, pending, METRIC_RENAMES, limit.seconds_left, limit.clock)
                    if main
                    else None,
                    SignalSafePoints(stop),  # after MetricsWriter: a held signal waits for the row
                ):
                    if callback is not None:
                        trainer.add_callback(callback)
                trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        except TrainingEnded:
            pass
        except (TrainingInterrupted, KeyboardInterrupt) as exc:
            signum = exc.signum if isinstance(exc, TrainingInterrupted) else int(signal.SIGINT)
            raise _save_on_stop(trainer, run_dir, signum, done_before) from None
        finally:
            if metrics_log is not None:
                metrics_log.close()
    stopped = limit.reached or target.reached or ends_on_load
    _check_complete(trainer.state.global_step, algo.iterations, done_before, stopped)
    return time.perf_counter() - start


def _stopped_at_target(run_dir: Path, checkpoint: Path | None, algo: Any) -> float | None:
    """The eval success at which the run stopped for algo.stop_at_success at `checkpoint`'s iteration
    (its metrics.jsonl row), where this resume asks for no more iterations than the run did (the
    checkpoint's trainer_state.json): a run killed after that stop, in its final save or eval, then
    finishes without training on. None otherwise; a raised algo.iterations trains on from there."""
    state_file = checkpoint / "trainer_state.json" if checkpoint is not None else None
    if state_file is None or algo.stop_at_success is None or not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    if int(algo.iterations) > int(state.get("max_steps") or 0):
        return None
    step = trainer_step(checkpoint)
    for row in metrics_rows(run_dir):
        success = row.get("eval/success_rate")
        if row.get("iteration") == step and success is not None and success >= algo.stop_at_success:
            return float(success)
    return None


def _check_complete(done: int, asked: int, done_before: int, stopped: bool) -> None:
    """Raise `TrainingIncomplete` where the Trainer returned with fewer iterations than asked and nothing
    meant to stop it (`stopped`: the time limit or algo.stop_at_success): an iteration whose update was
    skipped (no informative group) still counts, so a shortfall means iterations that never ran (e.g. an
    epoch of TRL's sampler without a batch)."""
    if done >= asked or stopped:
        return
    raise TrainingIncomplete(
        f"training ended after iteration {done} of algo.iterations={asked} ({done - done_before} this "
        "run) without a stop signal, time limit or target success; the model is not saved or evaluated"
    )


def _save_final(trainer: MultiStepTrainer, run_dir: Path, tokenizer: Any, critic: Critic | None) -> None:
    """The trained model (adapters under LoRA), its tokenizer and the value head in `run_dir/final`."""
    with dist.shared_atomic_dir(run_dir / "final") as tmp:
        trainer.save_model(str(tmp))  # every process: ZeRO-3/FSDP gather the weights
        if dist.is_main():
            tokenizer.save_pretrained(str(tmp))
            if critic is not None:
                critic.save(tmp)


def _save_on_stop(
    trainer: MultiStepTrainer, run_dir: Path, signum: int, done_before: int
) -> TrainingInterrupted:
    """Save the last finished iteration (unless this run already saved it), and say so in the exception
    the run exits with. The iteration in progress is lost: its rollouts are redone on resume."""
    step = trainer.state.global_step
    name = signal_name(signum)
    if step > done_before and trainer.last_saved_step != step:
        log.warning("%s: saving checkpoint-%d (the last finished iteration) before exiting", name, step)
        trainer._save_checkpoint(trainer.model, None)
    if step == 0:
        return TrainingInterrupted(signum, f"stopped by {name} before the first iteration finished")
    return TrainingInterrupted(
        signum,
        f"stopped by {name} after iteration {step}: checkpoint-{step} is saved;"
        f" continue with: agentrl train {shell_override('resume', run_dir)}",
    )
