"""`algo=` schemas: the LLM algorithms on the shared engine (MS-GRPO, POAD/NTPO/TWOSOME, RLFT), SFT warm-ups
and DQN."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl.config.base import Schema, setting

# trl GRPOConfig.loss_type (trl 1.16)
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
# transformers SchedulerType values (transformers 5)
LR_SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
)
LLM_ALGOS = ("msgrpo", "poad", "ntpo", "twosome", "rlft")


@dataclass
class AAWConfig(Schema):
    """`algo.aaw`: absolute-advantage-weighted episode sampling (docs/algorithms.md)."""

    enabled: bool = setting(True, "false: the uniform-sampling ablation (same number of episodes)", "paper")
    fraction: float | None = setting(0.5, "share of the informative episodes kept for the update", gt=0, le=1)
    count: int | None = setting(None, "a fixed number of episodes instead (overrides fraction)", ge=0)
    eps: float = setting(1.0e-3, "p_i ∝ |A_i| + eps", ge=0)


@dataclass
class CurriculumConfig(Schema):
    """`algo.curriculum`: training-only curriculum and reward shaping (evaluation always runs the
    standard task with its standard reward)."""

    random_start: float = setting(
        0.0,
        "probability that a training episode starts part-way (FrozenLake: on a random safe cell; kitchen: "
        "after the first k moves of an optimal play)",
        ge=0,
        le=1,
    )
    count_start_moves: bool = setting(
        False,
        "kitchen: a part-way start's moves count against algo.max_steps, so every start leaves the same "
        "slack over the optimal play (needs random_start > 0)",
    )
    approach_reward: float = setting(
        0.0,
        "Snake: training-only reward per cell a move brings the head nearer the nearest apple (env.approach_reward)",
        ge=0,
    )


@dataclass
class LLMAlgoConfig(Schema):
    """The keys every LLM algorithm shares (rollouts, optimisation, evaluation, checkpoints): the one
    engine in agentrl/trainers/ (grpo_trainer.py) reads them; each algorithm's schema adds its credit keys."""

    PREFIX: ClassVar[str | None] = "algo"

    name: str = setting("msgrpo", "algorithm name (selects the credit assignment)", choices=LLM_ALGOS)
    iterations: int = setting(100, "rollout/update cycles (one optimizer step each, or ppo_epochs)", ge=1)
    time_limit_minutes: float | None = setting(
        None,
        "stop after the iteration that crosses this training wall-clock, counted over every resumed part"
        " (null: no limit)",
        gt=0,
    )
    group_size: int = setting(16, "episodes per group; a group shares one env seed", ge=1)
    groups_per_iteration: int = setting(
        2,
        "B: groups per iteration; episodes per iteration = B x group_size (the MS-GRPO code: 2 x 16)",
        "code",
        ge=1,
    )
    min_informative_groups: int = setting(
        1,
        "roll out more groups while fewer than this many have non-zero return variance; still fewer after"
        " max_rollout_rounds: no update this iteration",
        ge=0,
    )
    max_rollout_rounds: int = setting(1, "rollout rounds per iteration at most (dynamic sampling)", ge=1)
    learning_rate: float = setting(1.0e-6, "learning rate (full fine-tune lr of the 3B runs)", "code", gt=0)
    lr_scheduler: str = setting("constant", "transformers scheduler type", choices=LR_SCHEDULERS)
    warmup_steps: int = setting(0, "linear warmup steps (with constant: constant_with_warmup)", ge=0)
    weight_decay: float = setting(0.0, "AdamW weight decay", ge=0)
    max_grad_norm: float = setting(1.0, "gradient clipping norm", gt=0)
    adam_beta1: float = setting(0.9, "AdamW beta1", ge=0, lt=1)
    adam_beta2: float = setting(0.999, "AdamW beta2", ge=0, lt=1)
    beta: float = setting(
        0.0, "KL coefficient to the reference policy (0 on FrozenLake, 0.1 on Snake)", "code", ge=0
    )
    epsilon: float = setting(0.2, "PPO clip", "code", gt=0)
    epsilon_high: float | None = setting(None, "upper clip (null: symmetric, = epsilon)", gt=0)
    loss_type: str = setting(
        "dapo", "TRL GRPO loss; dapo: token-level mean over the iteration", choices=LOSS_TYPES
    )
    gradient_accumulation_steps: int = setting(
        4, "micro-batches per iteration (step samples split evenly)", ge=1
    )
    max_batch_tokens: Any = setting(
        "auto",
        "memory bound: a micro-batch above this many padded tokens (rows x prompt+completion width) runs as "
        "several forward/backward passes with the same gradient; auto: as many LM-head positions (rows x "
        "completion width) as a fifth of the free memory holds logits for (fp32, with their gradients), "
        "and tokens run with gradients (the shared-prefix kernel's distinct prompts and completions on a "
        "CPU; padded tokens elsewhere) whose activations fill 30% of it; null: no bound",
    )
    memory_share: float = setting(
        1.0,
        "share of the free memory at the start that max_batch_tokens=auto plans for (runs side by side on "
        "one machine: 1/N each)",
        gt=0,
        le=1,
    )
    entropy_coef: float = setting(0.0, "TRL entropy bonus (0: off)")
    gradient_checkpointing: bool = setting(False, "recompute activations in the backward pass (saves memory)")
    precision: str = setting(
        "auto",
        "fp32 | bf16-mixed (fp32 master weights, bf16 autocast) | bf16-pure (bf16 weights: updates smaller than "
        "bf16's resolution are lost) | auto: bf16-mixed on CUDA; on a CPU bf16-mixed where it has bf16 matrix "
        "instructions (AVX512-BF16, AMX) and bf16 times faster at the model's layer sizes, else fp32",
        choices=("auto", "fp32", "bf16-mixed", "bf16-pure"),
    )
    rollout_dtype: str | None = setting(
        None,
        "null: the trained weights generate the rollouts; bfloat16 | float16: a copy in that dtype does, "
        "re-synced before every rollout, and the update corrects for its numerics with TRL's importance "
        "ratio (bf16 generation is several times faster on GPUs and on CPUs with AVX512-BF16 or AMX; "
        "model.backend=hf)",
        choices=(None, "bfloat16", "float16"),
    )
    ref_dtype: str | None = setting(
        None,
        "beta > 0 under full fine-tuning: dtype of TRL's frozen reference model; null: the policy's (fp32 "
        "master weights under bf16-mixed: 4 bytes/parameter, 12.4 GB at 3B); bfloat16 halves that (its "
        "log-probs then carry bf16 rounding, like the bf16-autocast forward of the policy)",
        choices=(None, "bfloat16", "float32"),
    )
    shared_prefix: bool = setting(
        True, "run each distinct prompt once per batch (rollouts; the update's log-probs on a CPU; exact)"
    )
    rollout_graph: bool = setting(
        True,
        "one-token answers on a CPU: the rollout's forward keeps its autograd graph and the update's "
        "backward runs through it instead of a second forward over the same prompts (the same gradient); "
        "where the trained policy generates, one micro-batch, no PPO epochs, no checkpointing, no dropout; "
        "a rollout past the update's token budget turns it off",
    )
    trainable_layers: int | None = setting(
        None, "full FT of only the top N decoder layers (+ final norm); null or 0: all", ge=0
    )
    temperature: float = setting(1.25, "rollout temperature (1.25 on FrozenLake, 1.5 on Snake)", "code", gt=0)
    top_k: int = setting(0, "rollout top-k (0: off; 3 on Snake in the authors' code)", ge=0)
    top_p: float = setting(1.0, "rollout nucleus mass (1: off)", gt=0, le=1)
    max_new_tokens: int | None = setting(
        None, "null: the agent's own setting (agent.sampling.max_new_tokens)", ge=1
    )
    max_steps: int | None = setting(None, "training episode cap (null: env.max_steps)", ge=1)
    invalid_penalty: float | None = setting(
        None, "training rollouts only: override agent.invalid_penalty (null: the agent's)"
    )
    curriculum: CurriculumConfig = setting(factory=CurriculumConfig, help="training-only curriculum")
    eval_every: int = setting(10, "iterations between held-out evals (0: only before/after)", ge=0)
    periodic_eval_episodes: int | None = setting(
        4, "episodes of the periodic evals (null: eval.episodes)", ge=1
    )
    eval_temperature: float = setting(
        0.0, "evaluation temperature; 0 = greedy (the authors' code: 0.5)", ge=0
    )
    stop_at_success: float | None = setting(
        None,
        "stop after the periodic eval (algo.eval_every) whose success rate reaches this; the final eval"
        " follows (null: train on)",
        gt=0,
        le=1,
    )
    eval_before: bool = setting(True, "evaluate the base policy before training (eval.json before)")
    checkpoint_every: int = setting(
        25,
        "iterations between checkpoint-<iteration>/, and the last iteration (0: only on a stop signal)",
        ge=0,
    )
    keep_checkpoints: int = setting(
        2, "newest checkpoints kept (optimizer state makes them ~3x the model)", ge=1
    )
    save_optimizer: bool = setting(
        True, "checkpoints hold optimizer, scheduler, RNG state (exact resume); false: model only"
    )
    save_final: bool = setting(True, "write the trained model (or LoRA adapter) to final/")
    torch_threads: int | None = setting(
        None, "torch.set_num_threads on CPU (null: the free cores, unless $OMP_NUM_THREADS is set)", ge=1
    )

    def check(self, prefix: str) -> None:
        value = self.max_batch_tokens
        number = isinstance(value, int) and not isinstance(value, bool)
        if not (value is None or value == "auto" or (number and value >= 1)):
            self.fail(prefix, "max_batch_tokens", "expected auto, null or an integer >= 1")


@dataclass
class MSGRPOConfig(LLMAlgoConfig):
    """MS-GRPO: multi-step GRPO with AAW episode sampling (conf/algo/msgrpo.yaml; docs/algorithms.md)."""

    name: str = setting("msgrpo", "algorithm name (selects the credit assignment)", choices=("msgrpo",))
    group_size: int = setting(16, "G: episodes per group; a group shares one env seed", "code", ge=2)
    normalize_std: bool = setting(
        True, "A_i = (R_i - mean) / (std + eps); false: R_i - mean (Dr. GRPO)", "paper"
    )
    eps: float = setting(1.0e-6, "eps of the advantage's std normalisation", gt=0)
    aaw: AAWConfig = setting(
        factory=AAWConfig, help="absolute-advantage-weighted episode sampling", source="paper"
    )


@dataclass
class POADConfig(LLMAlgoConfig):
    """POAD, NTPO and TWOSOME: PPO with a critic. POAD/NTPO: token-level credit by BAD (decompose=true) or
    naive per-token discounting (false); TWOSOME: action-level credit for a scoring agent
    (conf/algo/poad.yaml, ntpo.yaml, twosome.yaml; docs/algorithms.md#poad)."""

    name: str = setting(
        "poad",
        "algorithm name (poad | ntpo | twosome: action-level PPO of a scoring agent)",
        choices=("poad", "ntpo", "twosome"),
    )
    group_size: int = setting(8, "episodes per group (a group shares one env seed)", ge=1)
    min_informative_groups: int = setting(
        0, "roll out more groups while fewer than this many have non-zero return variance", ge=0
    )
    decompose: bool = setting(
        True,
        "BAD: no discount between the tokens of one action (POAD); false: NTPO (twosome: unused)",
        "paper",
    )
    gamma: float = setting(0.95, "discount between actions (0.99 on Overcooked)", "code", ge=0, le=1)
    lam: float = setting(0.95, "GAE lambda", "code", ge=0, le=1)
    normalize_advantages: bool = setting(True, "normalise token advantages over the batch", "code")
    advantage_std_floor: float = setting(
        0.0,
        "the normalisation divides by max(std, this) (reward units): a batch whose advantages hardly"
        " differ (every episode ended alike: only the critic's error is left) is not scaled up to"
        " full-size updates; 0: the authors' plain standardisation",
        ge=0,
    )
    critic_learning_rate: float = setting(5.0e-5, "value head learning rate (Adam, eps 1e-5)", "code", gt=0)
    value_coef: float = setting(0.5, "value loss coefficient", "code", ge=0)
    value_clip: float | None = setting(0.2, "clip of the value change (null: unclipped MSE)", "code", gt=0)
    ppo_epochs: int = setting(
        1, "optimisation passes over one iteration's rows (1 by default, 5 on Overcooked)", "code", ge=1
    )
    target_kl: float | None = setting(
        0.02,
        "skip an epoch's actor step when its approximate KL to the rollout policy exceeds this",
        "code",
        gt=0,
    )
    learning_rate: float = setting(1.0e-6, "actor learning rate", "code", gt=0)
    max_grad_norm: float = setting(0.5, "gradient clipping norm (actor and value head each)", "code", gt=0)
    entropy_coef: float = setting(0.01, "entropy bonus", "code")


@dataclass
class RLFTConfig(LLMAlgoConfig):
    """RLFT: clipped surrogate plus KL on self-generated rationales and actions, with a return-to-go
    (baseline) or GAE (critic) advantage per step (conf/algo/rlft.yaml; docs/algorithms.md#rlft). The
    paper's agent settings (cot, history, invalid_rule=random, penalty -5) are agent keys: presets set them."""

    name: str = setting("rlft", "algorithm name (selects the credit assignment)", choices=("rlft",))
    group_size: int = setting(
        4, "episodes per group (a group shares one env seed; the group_step baseline)", ge=1
    )
    min_informative_groups: int = setting(
        0, "roll out more groups while fewer than this many have non-zero return variance", ge=0
    )
    advantage: str = setting(
        "return_to_go",
        "return_to_go: G_t - b_t (fixed-length tasks); gae: with a value head (variable-length tasks)",
        "paper",
        choices=("return_to_go", "gae"),
    )
    baseline: str = setting(
        "group_step",
        "return_to_go: b_t = mean G_t of the group at step t | mean over the batch's steps | none (the"
        " paper's baseline is not specified: open)",
        choices=("group_step", "batch", "none"),
    )
    normalize_advantages: bool = setting(
        True, "return_to_go: divide A by its batch std; gae: standardise A over the batch"
    )
    advantage_std_floor: float = setting(
        0.0,
        "the normalisation divides by max(std, this) (reward units): a batch whose advantages hardly"
        " differ (with gae: every episode ended alike, only the critic's error is left) is not scaled up"
        " to full-size updates; 0: plain normalisation",
        ge=0,
    )
    gamma: float = setting(1.0, "discount of the return (1.0 for bandits: every press counts)", ge=0, le=1)
    lam: float = setting(0.95, "GAE lambda (advantage=gae)", ge=0, le=1)
    exploration_bonus: float = setting(
        0.0,
        "training reward added to a valid step whose action the episode has not tried yet (the paper's"
        " exploration-bonus experiment; its value is open); 0: off",
    )
    critic_learning_rate: float = setting(
        5.0e-5, "advantage=gae: value head learning rate (Adam, eps 1e-5; POAD's)", gt=0
    )
    value_coef: float = setting(0.5, "advantage=gae: value loss coefficient (POAD's)", ge=0)
    value_clip: float | None = setting(
        0.2, "advantage=gae: clip of the value change (null: unclipped MSE; POAD's)", gt=0
    )
    ppo_epochs: int = setting(1, "optimisation passes over one iteration's rows", ge=1)
    target_kl: float | None = setting(
        None, "skip an epoch's actor step when its approximate KL to the rollout policy exceeds this", gt=0
    )
    beta: float = setting(
        0.05,
        "KL coefficient to the reference policy (the paper has a KL term; its coefficient is open)",
        ge=0,
    )
    temperature: float = setting(1.0, "rollout temperature", gt=0)


@dataclass
class SFTConfig(Schema):
    """Supervised fine-tuning on demonstrations with TRL's SFTTrainer: behaviour cloning of the planner or
    a format warm-up on random valid actions, written through the LLM agent's own prompt and answer
    format (conf/algo/sft.yaml; agentrl/trainers/sft.py; docs/algorithms.md#sft)."""

    PREFIX: ClassVar[str | None] = "algo"

    name: str = setting("sft", "algorithm name (selects the trainer)", choices=("sft",))
    demonstrations: str = setting(
        "planner",
        "who plays the demonstrations: planner (expert play: behaviour cloning, the RLFT paper's baseline) | "
        "random (uniformly random valid actions: teaches the answer format, leaves the policy to RL) | "
        "scored (the model's own choices by TWOSOME's scores over the valid actions, sampled at temperature "
        "1: teaches the answer format and keeps the model's preferences)",
        "paper",
        choices=("planner", "random", "scored"),
    )
    episodes: int = setting(
        64, "demonstration episodes, on training seeds (never the held-out eval seeds)", ge=1
    )
    state_facts: bool = setting(
        False,
        "with agent.cot=true the templated rationale also states what the state shows that bears on the "
        "choice, before it (a bandit: the buttons not pressed yet, the best average so far; tic-tac-toe: "
        "the cells that win and those that block); envs that state no facts keep the plain template",
    )
    epochs: float = setting(3.0, "passes over the demonstrations", gt=0)
    max_updates: int | None = setting(None, "optimizer steps at most (null: epochs decide)", ge=1)
    batch_size: int = setting(8, "demonstration steps per micro-batch", ge=1)
    gradient_accumulation_steps: int = setting(1, "micro-batches per optimizer step", ge=1)
    learning_rate: float = setting(5.0e-5, "AdamW learning rate", gt=0)
    lr_scheduler: str = setting("constant", "transformers scheduler type", choices=LR_SCHEDULERS)
    warmup_steps: int = setting(0, "linear warmup steps", ge=0)
    weight_decay: float = setting(0.0, "AdamW weight decay", ge=0)
    max_grad_norm: float = setting(1.0, "gradient clipping norm", gt=0)
    precision: str = setting(
        "auto",
        "fp32 | bf16-mixed (fp32 master weights, bf16 autocast) | bf16-pure | auto: bf16-mixed on CUDA, fp32 on CPU",
        choices=("auto", "fp32", "bf16-mixed", "bf16-pure"),
    )
    max_new_tokens: int | None = setting(
        None, "evaluation answer budget (null: the agent's own setting)", ge=1
    )
    eval_temperature: float = setting(0.0, "evaluation temperature; 0 = greedy", ge=0)
    eval_before: bool = setting(True, "evaluate the base policy before training (eval.json before)")
    save_final: bool = setting(True, "write the trained model (or LoRA adapter) to final/")
    torch_threads: int | None = setting(
        None, "torch.set_num_threads on CPU (null: the free cores, unless $OMP_NUM_THREADS is set)", ge=1
    )


@dataclass
class DQNConfig(Schema):
    """DQN baseline: Stable-Baselines3 `DQN` with an MLP Q-network (conf/algo/dqn.yaml). The SB3 keys
    keep SB3's parameter names and go to `stable_baselines3.DQN(...)` unchanged."""

    PREFIX: ClassVar[str | None] = "algo"

    name: str = setting("dqn", "algorithm name (selects the trainer)", choices=("dqn",))
    total_timesteps: int = setting(100000, "env steps of training", ge=1)
    learning_rate: float = setting(0.0005, "Adam learning rate", gt=0)
    buffer_size: int = setting(100000, "replay buffer size (transitions)", ge=1)
    learning_starts: int = setting(2000, "env steps collected before learning starts", ge=0)
    batch_size: int = setting(64, "minibatch size per gradient step", ge=1)
    gamma: float = setting(0.99, "discount factor", ge=0, le=1)
    train_freq: int = setting(4, "env steps between gradient updates (SB3 default 4)", ge=1)
    gradient_steps: int = setting(1, "gradient steps per update (-1: as many as env steps)", ge=-1)
    target_update_interval: int = setting(2000, "env steps between hard target-network copies", ge=1)
    exploration_fraction: float = setting(
        0.3, "share of training over which epsilon decays linearly", ge=0, le=1
    )
    exploration_initial_eps: float = setting(1.0, "epsilon at the start", ge=0, le=1)
    exploration_final_eps: float = setting(0.02, "epsilon after the decay", ge=0, le=1)
    max_grad_norm: float = setting(10.0, "gradient clipping norm", gt=0)
    net_arch: list[int] = setting(factory=lambda: [256, 256], help="MLP hidden layers of the Q-network")
    log_every: int = setting(2000, "env steps between metrics.jsonl rows", ge=1)
    checkpoint_every: int = setting(20000, "env steps between checkpoint-<steps>.zip (0: none)", ge=0)
    save_replay_buffer: bool = setting(
        True, "also save the newest replay buffer, so --resume continues exactly"
    )
    device: str = setting("cpu", "torch device (a small MLP runs fastest on the CPU)")
    torch_threads: int | None = setting(1, "torch.set_num_threads for training; null: torch's default", ge=1)
    eval_before: bool = setting(True, "evaluate the untrained Q-network first (eval.json before)")

    def check(self, prefix: str) -> None:
        if self.gradient_steps == 0:
            self.fail(prefix, "gradient_steps", "must be >= 1, or -1")
        if any(width < 1 for width in self.net_arch):
            self.fail(prefix, "net_arch", "every layer width must be >= 1")
