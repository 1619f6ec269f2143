"""Typed schemas of every config option: one dataclass per YAML file under agentrl/conf/.

Each YAML file names its schema in its defaults list (`defaults: [<option>_schema, _self_]`), so Hydra
merges the file onto the dataclass: field names are the YAML keys, and OmegaConf rejects unknown keys
and values of the wrong type (e.g. `maybe` for a bool) while composing. Ranges and choices are declared
in each field's metadata and checked in `__post_init__`, which runs when a composed node is turned into
its dataclass (`agentrl.config.typed`, or `compose_config`, which does it for every group).

Every field carries `metadata={"help": ..., "source": ...}`: source is `paper` (the method's paper),
`code` (the paper authors' code) or `ours` (our choice); `agentrl config <group>=<option> --describe`
prints them. Method details: docs/algorithms.md; environments: docs/envs.md.
"""

from __future__ import annotations

import math
import re
import types
import typing
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

from agentrl.errors import ConfigError

SOURCES = ("paper", "code", "ours")

# Choices of the env constructors and consumers; tests/test_config.py checks they match the modules, so
# composing a config stays free of torch, trl and the env modules.
FROZENLAKE_MAPS = ("4x4", "8x8", "random")
BANDIT_REWARDS = ("bernoulli", "gaussian")
BANDIT_MAX_ARMS = 24  # colour names available for the buttons (envs/bandit.py COLOURS)
CONTEXTUAL_MAX_FEATURES = 12  # context feature names (envs/contextual_bandit.py FEATURE_NAMES)
TICTACTOE_MARKS = ("X", "O")
TICTACTOE_OPPONENTS = ("random", "mcts", "perfect")
DATASCICODING_DATASETS = ("breast_cancer", "wine", "iris", "digits", "random")
KITCHEN_TASKS = ("tomato_salad", "tomato_lettuce_salad", "tomato_lettuce_onion_salad")
INVALID_RULES = ("penalty_default", "penalty_end", "random")
BACKENDS = ("hf", "openai", "vllm")
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # models.resolve_dtype
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
TASKS = ("eval", "train")
LLM_ALGOS = ("msgrpo", "poad", "ntpo", "twosome", "rlft")
_TAG = re.compile(r"[A-Za-z_][\w-]*")


def setting(
    default: Any = MISSING,
    help: str = "",
    source: str = "ours",
    *,
    factory: Any = None,
    choices: tuple[Any, ...] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A schema field: default (or `factory`), one-line help, source, and the checks its value must pass."""
    if source not in SOURCES:
        raise ValueError(f"source {source!r} is not one of {SOURCES}")
    metadata: dict[str, Any] = {"help": help, "source": source}
    for name, value in (("choices", choices), ("ge", ge), ("gt", gt), ("le", le), ("lt", lt)):
        if value is not None:
            metadata[name] = value
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def show(value: Any) -> str:
    """A value as it is written on the command line (null, true, 1.5, text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def rule_text(meta: typing.Mapping[str, Any]) -> str:
    """The allowed values a field's metadata declares, e.g. `in (0, 1]`, `>= 1`, `one of: a, b`."""
    if "choices" in meta:
        return "one of: " + ", ".join(show(c) for c in meta["choices"])
    low = ("[", meta["ge"]) if "ge" in meta else ("(", meta["gt"]) if "gt" in meta else None
    high = ("]", meta["le"]) if "le" in meta else (")", meta["lt"]) if "lt" in meta else None
    if low and high:
        return f"in {low[0]}{show(low[1])}, {show(high[1])}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {show(low[1])}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {show(high[1])}"
    return ""


def _in_range(value: float, meta: typing.Mapping[str, Any]) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    return (
        ("ge" not in meta or value >= meta["ge"])
        and ("gt" not in meta or value > meta["gt"])
        and ("le" not in meta or value <= meta["le"])
        and ("lt" not in meta or value < meta["lt"])
    )


def type_name(annotation: Any) -> str:
    """`int`, `float | None`, `list[int]`, `any` ... for --describe."""
    if annotation is Any:
        return "any"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{origin.__name__}[{args}]" if args else origin.__name__
    return getattr(annotation, "__name__", str(annotation))


def _type_error(annotation: Any, value: Any) -> str | None:
    """What a value of the wrong type should have been, or None when it fits `annotation`."""
    if annotation is Any:
        return None
    args = typing.get_args(annotation)
    if type(None) in args:
        if value is None:
            return None
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else Any
        return _type_error(annotation, value)
    if value is None:
        return "must not be null"
    origin = typing.get_origin(annotation) or annotation
    if origin is bool:
        return None if isinstance(value, bool) else "expected a boolean (true or false)"
    if origin is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
    if origin is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else "expected a number"
    if origin is str:
        return None if isinstance(value, str) else "expected a string"
    if origin is list:
        if not isinstance(value, list):
            return "expected a list"
        (item,) = typing.get_args(annotation) or (Any,)
        bad = [v for v in value if _type_error(item, v)]
        return f"expected a list of {type_name(item)}" if bad else None
    if origin is dict:
        return None if isinstance(value, dict) else "expected a mapping"
    return None


@dataclass
class Schema:
    """Base of every schema: `__post_init__` checks types, choices and ranges of each field, then the
    cross-field rules of `check`. A group's schema sets PREFIX (its full key, e.g. "algo") and checks
    its nested schemas too; nested schemas (PREFIX None) are checked by the group that holds them."""

    PREFIX: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        if self.PREFIX is not None:
            self.validate(self.PREFIX)

    def validate(self, prefix: str) -> None:
        hints = _hints(type(self))
        for f in fields(self):
            key = f"{prefix}.{f.name}" if prefix else f.name
            value = getattr(self, f.name)
            if isinstance(value, Schema):
                value.validate(key)
                continue
            problem = _type_error(hints[f.name], value)
            if problem is None and value is not None:
                meta = f.metadata
                if "choices" in meta and value not in meta["choices"]:
                    problem = f"must be {rule_text(meta)}"
                elif any(k in meta for k in ("ge", "gt", "le", "lt")) and not _in_range(value, meta):
                    problem = f"must be {rule_text(meta)}"
            if problem:
                raise ConfigError(f"{key}={show(value)}: {problem}{self.context()}")
        self.check(prefix)

    def context(self) -> str:
        """Appended to error lines: which option's rules applied (an env's keys depend on the env)."""
        return ""

    def check(self, prefix: str) -> None:
        """Rules that involve more than one field (override in a schema)."""

    def fail(self, prefix: str, key: str, problem: str) -> None:
        """Raise the one-line error for `key` (relative to this node)."""
        value: Any = self
        for part in key.split("."):
            value = getattr(value, part)
        full = f"{prefix}.{key}" if prefix else key
        raise ConfigError(f"{full}={show(value)}: {problem}{self.context()}")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def field_rows(cls: type, values: Any = None, prefix: str = "") -> list[dict[str, Any]]:
    """One row per leaf field of a schema, nested fields dotted (aaw.fraction): key, type, value (from
    `values`, a mapping or object, else the dataclass default), help, source and the allowed values."""
    rows: list[dict[str, Any]] = []
    hints = _hints(cls)
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        value = _value_of(values, f)
        annotation = hints[f.name]
        if isinstance(annotation, type) and is_dataclass(annotation):
            rows.extend(field_rows(annotation, value, prefix=f"{key}."))
            continue
        rows.append(
            {
                "key": key,
                "type": type_name(annotation),
                "value": value,
                "help": f.metadata.get("help", ""),
                "source": f.metadata.get("source", ""),
                "allowed": rule_text(f.metadata),
            }
        )
    return rows


def _value_of(values: Any, f: Field) -> Any:
    if values is not None:
        if isinstance(values, typing.Mapping) or hasattr(values, "keys"):
            if f.name in values:
                return values[f.name]
        elif hasattr(values, f.name):
            return getattr(values, f.name)
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


# =====================================================================================================
# root
# =====================================================================================================
@dataclass
class EvalConfig(Schema):
    """`eval.*`: the held-out evaluation every command runs."""

    episodes: int = setting(20, "held-out episodes per evaluation", ge=1)
    seed_offset: int = setting(
        1000000, "eval env seeds = seed_offset + 1000*seed + k; training seeds stay below it", ge=0
    )
    lockstep: bool = setting(True, "advance all eval episodes together (one batched agent call per step)")
    transcripts: bool = setting(
        True, "LLM agents: write transcripts.jsonl (prompt, completion, action per step)"
    )


#: the largest seed: numpy's legacy seeding (SB3 and the sandbox call np.random.seed) takes 0..2**32-1
SEED_MAX = 2**32 - 1


@dataclass
class AgentRLConfig(Schema):
    """The root config (conf/config.yaml). The groups (env, agent, model, algo) are typed by their own
    option's schema, so here they are Any."""

    PREFIX: ClassVar[str | None] = ""

    task: str = setting("eval", "set by the command: eval | train", choices=TASKS)
    seed: int = setting(
        0,
        "global seed: agent randomness, training, and which held-out eval seeds are used",
        ge=0,
        le=SEED_MAX,
    )
    name: str = setting("${task}_${env.name}", "run-directory suffix")
    resume: str | None = setting(None, "train: a run directory to continue (`agentrl train resume=<dir>`)")
    from_run: str | None = setting(
        None,
        "eval: a training run directory (or its final/ or checkpoint-N) to evaluate with the run's own "
        "env, agent and interface settings",
    )
    init_from: str | None = setting(
        None,
        "train: start from another training run's weights (its final/, else its newest checkpoint, or a "
        "final/ or checkpoint-N inside it); the run must have trained the same base model",
    )
    from_run_env: str | None = setting(
        None,
        "eval from_run: evaluate the trained model on this env option instead of the run's own (zero-shot "
        "transfer); the run's model and agent settings stay, its env settings and preset are dropped",
    )
    eval: EvalConfig = setting(factory=EvalConfig, help="held-out evaluation settings")
    env: Any = setting(None, "the environment (env=<option>, conf/env/)")
    agent: Any = setting(None, "who acts in eval (agent=<option>, conf/agent/)")
    model: Any = setting(None, "the language model and its backend (model=<option>, conf/model/)")
    algo: Any = setting(None, "the training algorithm (algo=<option>, conf/algo/); null outside train")
    distributed: Any = setting(
        None, "train: several processes/GPUs (distributed=<option>, conf/distributed/)"
    )

    def check(self, prefix: str) -> None:
        # the name ends the run directory's name: a separator would nest it, `..` would leave outputs/
        if "/" in self.name or "\\" in self.name or self.name in ("", ".", ".."):
            self.fail(prefix, "name", "names one directory: use no / or \\ (e.g. name=a_b)")


# =====================================================================================================
# env: keys = the env constructor's arguments (agentrl/envs/*.py); docs/envs.md
# =====================================================================================================
@dataclass
class EnvSchema(Schema):
    """Base of the env schemas: errors name the env, whose constructor the keys belong to."""

    PREFIX: ClassVar[str | None] = "env"

    def context(self) -> str:
        return f" (env {getattr(self, 'name', '?')})"


@dataclass
class FrozenLakeConfig(EnvSchema):
    """Frozen Lake (conf/env/frozenlake.yaml): gymnasium's FrozenLake as a text game."""

    name: str = setting("frozenlake", "env registry name", choices=("frozenlake",))
    map: str = setting(
        "4x4",
        "4x4 or 8x8 (gymnasium's fixed maps) or random (a new size x size map per reset seed)",
        "paper",
        choices=FROZENLAKE_MAPS,
    )
    size: int = setting(4, "side of the board for map=random (ignored for the fixed maps)", ge=2)
    p: float = setting(0.8, "map=random: probability a tile is frozen (generate_random_map)", gt=0, le=1)
    slippery: bool = setting(False, "slippery ice: intended move 1/3, each perpendicular move 1/3", "paper")
    max_steps: int = setting(8, "move cap (truncation); the paper caps episodes at 8 moves", "paper", ge=1)


@dataclass
class SnakeConfig(EnvSchema):
    """Snake and its Poison Apple variant (conf/env/snake.yaml, snake_poison.yaml)."""

    name: str = setting("snake", "env registry name", choices=("snake", "snake_poison"))
    size: int = setting(10, "board side (10x10 in the paper)", "paper", ge=4)
    apples: int = setting(
        1, "apples on the board at once; an eaten apple respawns on a free cell", "code", ge=0
    )
    opponent: bool = setting(True, "a random-moving enemy snake that respawns when it dies", "code")
    max_steps: int = setting(100, "move cap (truncation)", "code", ge=1)
    step_penalty: float = setting(0.01, "subtracted every move the agent survives (also on moves that eat)")
    poison_apples: int = setting(0, "poison apples (X) on the board; eating one gives poison_reward", ge=0)
    poison_reward: float = setting(-1.0, "reward for eating a poison apple (stated in the instructions)")
    start_length: int = setting(1, "cells per snake at the start (1 = head only); at most size/2", ge=1)
    view: str = setting(
        "board",
        "observation text: the board with coordinates [paper], a summary of the apple's direction and "
        "what each move runs into [ours], or both",
        choices=("board", "summary", "board+summary"),
    )
    approach_reward: float = setting(
        0.0,
        "reward per cell a surviving, non-eating move brings the head nearer the apple nearest before it "
        "(minus per cell away); unstated in the instructions. A training aid: set it for training only "
        "with algo.curriculum.approach_reward",
        ge=0,
    )

    def check(self, prefix: str) -> None:
        if self.start_length > self.size // 2:
            self.fail(prefix, "start_length", f"must be <= size/2 = {self.size // 2}")


@dataclass
class BanditConfig(EnvSchema):
    """Multi-armed bandit in BanditBench's button framing (conf/env/bandit.yaml)."""

    name: str = setting("bandit", "env registry name", choices=("bandit",))
    arms: int = setting(
        5, "number of buttons K (the RLFT paper uses 5, 10, 20)", "paper", ge=2, le=BANDIT_MAX_ARMS
    )
    reward: str = setting(
        "bernoulli",
        "arm means ~ U(0,1) (bernoulli) or N(0,1) (gaussian) per seed",
        "paper",
        choices=BANDIT_REWARDS,
    )
    gaussian_sd: float = setting(1.0, "standard deviation of a Gaussian arm's reward around its mean", gt=0)
    horizon: int = setting(50, "button presses per episode (= max_steps)", "paper", ge=1)
    history: int = setting(50, "last transitions shown in the observation; 0 = none", ge=0)
    view: str = setting(
        "history",
        "observation text: the last `history` presses one per line [paper], or one line per button with its "
        "presses and average reward (BanditBench's summarised history) [ours]",
        choices=("history", "summary"),
    )


@dataclass
class ContextualBanditConfig(EnvSchema):
    """Contextual bandit: buttons whose rewards depend on a context shown each round
    (conf/env/contextual_bandit.yaml)."""

    name: str = setting("contextual_bandit", "env registry name", choices=("contextual_bandit",))
    arms: int = setting(5, "number of buttons K", ge=2, le=BANDIT_MAX_ARMS)
    features: int = setting(
        3, "context features d, each uniform in [-1, 1]", ge=1, le=CONTEXTUAL_MAX_FEATURES
    )
    reward: str = setting(
        "bernoulli",
        "bernoulli: P(1) = sigmoid(theta_a . (1, x)); gaussian: mean theta_a . (1, x)",
        choices=BANDIT_REWARDS,
    )
    gaussian_sd: float = setting(0.5, "standard deviation of a Gaussian reward around its mean", gt=0)
    scale: float = setting(1.5, "arm parameters theta_a ~ N(0, scale^2) per coordinate, drawn per seed", gt=0)
    horizon: int = setting(50, "button presses per episode (= max_steps)", ge=1)
    history: int = setting(20, "last presses (with their contexts) shown in the observation; 0 = none", ge=0)


@dataclass
class TicTacToeConfig(EnvSchema):
    """Tic-tac-toe against a fixed opponent (conf/env/tictactoe.yaml)."""

    name: str = setting("tictactoe", "env registry name", choices=("tictactoe",))
    agent_mark: str = setting("X", "the agent's mark; X moves first", choices=TICTACTOE_MARKS)
    opponent: str = setting(
        "random",
        "random | mcts (plain UCT) | perfect (minimax, random tie-break)",
        "paper",
        choices=TICTACTOE_OPPONENTS,
    )
    mcts_simulations: int = setting(100, "UCT simulations per opponent move (opponent=mcts)", ge=1)

    def __post_init__(self) -> None:
        if isinstance(self.agent_mark, str):  # the env reads the mark case-insensitively
            self.agent_mark = self.agent_mark.upper()
        super().__post_init__()


@dataclass
class DataSciCodingConfig(EnvSchema):
    """DataSciCoding: the model writes a scikit-learn build_model(X, y) (conf/env/datascicoding.yaml)."""

    name: str = setting("datascicoding", "env registry name", choices=("datascicoding",))
    dataset: str = setting(
        "random",
        "a bundled scikit-learn dataset, or random (one per reset seed)",
        choices=DATASCICODING_DATASETS,
    )
    splits: int = setting(
        5, "seeded stratified 75/25 train/test splits; reward = mean ROC-AUC over them", ge=1
    )
    timeout_s: float = setting(30.0, "sandbox wall clock for all splits together (imports included)", gt=0)
    memory_mb: int = setting(2048, "sandbox address-space limit (numpy + scikit-learn take ~500 MB)", ge=256)
    max_steps: int = setting(1, "attempts; > 1 shows the previous code and its score or error", ge=1)
    success_auc: float = setting(0.9, "success: a mean ROC-AUC of at least this", ge=0, le=1)
    sandbox: str = setting(
        "bwrap",
        "bwrap: model code runs in an OS sandbox (bubblewrap); unsafe-local: a plain process, no OS boundary",
        choices=("bwrap", "unsafe-local"),
    )


@dataclass
class KitchenConfig(EnvSchema):
    """Text kitchen with multi-word actions, POAD's Overcooked salad tasks (conf/env/kitchen.yaml)."""

    name: str = setting("kitchen", "env registry name", choices=("kitchen",))
    task: str = setting(
        "tomato_salad",
        "the recipe: tomato_salad (1 ingredient) | tomato_lettuce_salad (2) | tomato_lettuce_onion_salad (3)",
        "paper",
        choices=KITCHEN_TASKS,
    )
    max_steps: int = setting(20, "action cap (truncation); the 3-ingredient salad takes 10", ge=1)
    actions: str = setting(
        "all",
        "valid actions of a state: all (every action, always) | feasible (those that do something there)",
        choices=("all", "feasible"),
    )


# =====================================================================================================
# agent
# =====================================================================================================
@dataclass
class SamplingSchema(Schema):
    """`agent.sampling`: how an LLM agent's completions are sampled in evaluation."""

    temperature: float = setting(
        0.0, "0 = greedy (the evaluation default; training presets set their own)", ge=0
    )
    top_p: float = setting(1.0, "nucleus sampling mass (1 = off)", gt=0, le=1)
    top_k: int = setting(0, "top-k sampling (0 = off)", ge=0)
    max_new_tokens: int | None = setting(
        None, "null: 1 when agent.prefill=auto chose one-token answers, else 32 (256 with cot)", ge=1
    )
    stop: list[str] = setting(
        factory=list, help="extra stop strings (the closing answer tag comes from stop_at_answer)"
    )


@dataclass
class ExploreConfig(Schema):
    """`agent.explore`: the RLFT paper's exploration mechanisms, as agent wrappers (agents/exploration.py)."""

    try_all: bool = setting(
        False,
        "the first steps of an episode play each valid action not played yet, in the env's order",
        "paper",
    )
    epsilon: float = setting(
        0.0,
        "probability of executing a uniformly random valid action instead of the agent's",
        "paper",
        ge=0,
        le=1,
    )
    self_consistency: int = setting(
        1, "answers sampled per step; the majority action is played (1: off)", "paper", ge=1
    )


@dataclass
class LLMAgentConfig(Schema):
    """A language model plays (conf/agent/llm.yaml; the model is model=...)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("llm", "agent name", choices=("llm",))
    history: int = setting(0, "last k steps shown as 'action -> reward' lines (MS-GRPO: 0)", "code", ge=0)
    history_observations: bool = setting(False, "also show those steps' observations (longer prompts)")
    cot: bool = setting(False, "reason inside <think>...</think> before answering")
    answer_tag: str = setting("action", "the answer is read from <tag>NAME</tag>; a plain tag name")
    lenient: bool = setting(
        False,
        "true: an answer without a usable tag plays the last valid action it names (train logs a warning); "
        "false: it is invalid. Either way it counts in untagged_rate",
    )
    require_rationale: bool = setting(
        False,
        "with cot: an answer without a closed, non-empty <think>...</think> is invalid (false: it is valid "
        "and counts against rationale_rate)",
    )
    stop_at_answer: bool = setting(True, "stop generating after the closing answer tag")
    system_prompt: str | None = setting(
        None,
        "null: the env instructions are the system message; else this is, and they open the user message",
    )
    prefill: str = setting(
        "auto",
        "text the assistant turn starts with ('' none, e.g. 'I move'); auto: 'Move:' and one-token answers "
        "when every action name is one token after it (not with cot), else none",
    )
    invalid_rule: str = setting(
        "penalty_default",
        "invalid answer: env default action + penalty, the same then end, or a random legal action + penalty",
        "code",
        choices=INVALID_RULES,
    )
    invalid_penalty: float = setting(-1.0, "added to an invalid step's reward", "code")
    decision: str = setting(
        "generate",
        "generate: sample an answer and parse it; score: TWOSOME, sample a valid action from the softmax of "
        "their normalised log-likelihoods after <tag> (hf backend; never invalid; agents/scoring.py)",
        choices=("generate", "score"),
    )
    score_normalization: str = setting(
        "word",
        "decision=score: divide each action's log-likelihood by its word count (TWOSOME), token count, or 1",
        "paper",
        choices=("word", "token", "none"),
    )
    sampling: SamplingSchema = setting(factory=SamplingSchema, help="sampling settings of the completions")
    explore: ExploreConfig = setting(
        factory=ExploreConfig, help="exploration mechanisms (RLFT)", source="paper"
    )

    def check(self, prefix: str) -> None:
        if not _TAG.fullmatch(self.answer_tag):
            self.fail(prefix, "answer_tag", "must be a plain tag name like action (letters, digits, _ or -)")
        if self.decision == "score" and self.cot:
            self.fail(prefix, "cot", "decision=score scores the answer itself; it cannot reason first")
        if self.require_rationale and not self.cot:
            self.fail(
                prefix, "require_rationale", "needs agent.cot=true (no rationale is asked for without it)"
            )


@dataclass
class RandomAgentConfig(Schema):
    """Uniformly random legal action (conf/agent/random.yaml)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("random", "agent name", choices=("random",))
    explore: ExploreConfig = setting(
        factory=ExploreConfig, help="exploration mechanisms (RLFT)", source="paper"
    )


@dataclass
class PlannerAgentConfig(Schema):
    """The best classic policy per env (conf/agent/planner.yaml)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("planner", "agent name", choices=("planner",))
    ucb_c: float = setting(2.0, "bandit UCB1 exploration constant: mean + sqrt(c * ln t / n)", ge=0)
    linucb_alpha: float = setting(
        1.0, "contextual bandit LinUCB width: theta_a . x + alpha * sqrt(x^T A_a^-1 x)", "paper", ge=0
    )
    explore: ExploreConfig = setting(
        factory=ExploreConfig, help="exploration mechanisms (RLFT)", source="paper"
    )


@dataclass
class HumanAgentConfig(Schema):
    """A person at the terminal (conf/agent/human.yaml; `agentrl play`)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("human", "agent name", choices=("human",))


@dataclass
class DQNAgentConfig(Schema):
    """A trained DQN playing greedily (conf/agent/dqn.yaml)."""

    PREFIX: ClassVar[str | None] = "agent"

    name: str = setting("dqn", "agent name", choices=("dqn",))
    path: str | None = setting(None, "a DQN run directory or checkpoint zip (required to play)")
    device: str = setting("cpu", "torch device for the Q-network")
    explore: ExploreConfig = setting(
        factory=ExploreConfig, help="exploration mechanisms (RLFT)", source="paper"
    )


# =====================================================================================================
# model
# =====================================================================================================
@dataclass
class LoRAConfig(Schema):
    """`model.lora`: PEFT LoRA for training (r = 0: full fine-tuning)."""

    r: int = setting(0, "LoRA rank; > 0 enables LoRA (PEFT) for training", ge=0)
    alpha: int = setting(16, "LoRA alpha (scaling = alpha / r)", ge=1)
    dropout: float = setting(0.05, "dropout on the LoRA inputs", ge=0, lt=1)
    target_modules: Any = setting("all-linear", "modules that get adapters: all-linear or a list of names")

    def check(self, prefix: str) -> None:
        names = self.target_modules
        if not (
            isinstance(names, str) or (isinstance(names, list) and all(isinstance(n, str) for n in names))
        ):
            self.fail(prefix, "target_modules", "expected a module name or a list of names")


@dataclass
class ModelConfig(Schema):
    """Every conf/model/*.yaml: a Hugging Face model (backend hf or vllm) or an OpenAI-compatible endpoint
    (backend openai); keys a backend does not use are ignored by it."""

    PREFIX: ClassVar[str | None] = "model"

    name: str = setting("model", "short name in run names and reports; backend openai: the served model name")
    name_or_path: str | None = setting(
        None, "builtin:<name> | hub id | local dir (checkpoint or PEFT adapter); backend openai: unused"
    )
    backend: str = setting(
        "hf", "hf (batched generate) | openai (any compatible endpoint) | vllm", choices=BACKENDS
    )
    dtype: str = setting("auto", "auto: bf16 on CUDA, fp32 on CPU; or a dtype name", choices=DTYPES)
    device: str = setting("auto", "auto: cuda if visible, else cpu; or a torch device")
    device_map: Any = setting(None, "e.g. auto: shard across all visible GPUs (accelerate); overrides device")
    attn_implementation: str = setting(
        "sdpa",
        "hf backend: transformers attention kernel: sdpa (torch, any device) | eager | flash_attention_2"
        " (CUDA, needs pip install flash-attn)",
        choices=("sdpa", "eager", "flash_attention_2"),
    )
    trust_remote_code: bool = setting(False, "allow model code from the hub")
    hub_kernels: bool = setting(
        False,
        "transformers' Hub kernels (package kernels): true swaps layers for kernels downloaded from the"
        " Hub when the model is loaded or moved to a GPU (needs the Hub or its cache)",
    )
    prefix_cache: bool = setting(
        True, "hf backend: reuse the shared prompt head's KV states across rows and calls"
    )
    cache_dir: str | None = setting(None, "null: $AGENTRL_CACHE or ~/.cache/agentrl")
    base_url: str = setting("http://localhost:8000/v1", "backend openai: the endpoint's base URL")
    api_key_env: str | None = setting(
        "OPENAI_API_KEY", "backend openai: environment variable holding the API key (may be unset)"
    )
    tokenizer: str | None = setting(
        None, "backend openai: hub id / dir of a tokenizer, for completion token ids"
    )
    timeout: float = setting(120.0, "backend openai: seconds per HTTP request", gt=0)
    max_retries: int = setting(
        2, "backend openai: retries of a request after a connection error, timeout or HTTP 429/5xx", ge=0
    )
    max_concurrency: int = setting(16, "backend openai: parallel requests per batched step", ge=1)
    logprobs: bool = setting(True, "backend openai: ask the server for the sampled tokens' log-probs")
    return_token_ids: bool = setting(False, "backend openai: exact completion token ids (vLLM servers)")
    vllm: dict = setting(factory=dict, help="backend vllm: extra vllm.LLM(...) engine arguments")
    lora: LoRAConfig = setting(factory=LoRAConfig, help="LoRA adapters for training")

    def check(self, prefix: str) -> None:
        if self.backend in ("hf", "vllm") and not self.name_or_path:
            self.fail(
                prefix,
                "name_or_path",
                f"required with backend {self.backend} (a hub id, dir or builtin:<name>)",
            )
        if self.backend == "openai" and not _is_http_url(self.base_url):
            self.fail(prefix, "base_url", "must be an http(s) URL with a host, e.g. http://localhost:8000/v1")


def _is_http_url(url: str) -> bool:
    """An http:// or https:// URL with a host (and, if given, a numeric port)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


# =====================================================================================================
# algo
# =====================================================================================================
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
        None, "stop after the iteration that crosses this training wall-clock (null: no limit)", gt=0
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
    eval_before: bool = setting(True, "evaluate the base policy before training (eval.json before)")
    checkpoint_every: int = setting(
        25, "iterations between checkpoint-<iteration>/ (0: only on a stop signal)", ge=0
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


# =====================================================================================================
# distributed: several training processes (docs/distributed.md)
# =====================================================================================================
#: distributed option -> the accelerate config TRL ships for it (trl/accelerate_configs/<name>.yaml)
ACCELERATE_CONFIGS = {"ddp": "multi_gpu", "zero2": "zero2", "zero3": "zero3", "fsdp2": "fsdp2"}
DISTRIBUTED = ("none", *ACCELERATE_CONFIGS)


@dataclass
class DistributedConfig(Schema):
    """Every conf/distributed/*.yaml: how many training processes and which engine shares the model."""

    PREFIX: ClassVar[str | None] = "distributed"

    name: str = setting(
        "none",
        "none | ddp (a full copy per GPU) | zero2 | zero3 | fsdp2 (shard the model)",
        choices=DISTRIBUTED,
    )
    num_processes: int | None = setting(
        None, "processes (one per GPU); null: every visible GPU (none: 1)", ge=1
    )
    main_process_port: int | None = setting(
        None,
        "rendezvous port of the launcher; null: the launcher's default (set it to run two jobs on one node)",
    )
    num_machines: int = setting(1, "nodes (multi-node: also machine_rank and main_process_ip)", ge=1)
    machine_rank: int = setting(0, "this node's index among num_machines", ge=0)
    main_process_ip: str | None = setting(None, "multi-node: the address of node 0")

    def check(self, prefix: str) -> None:
        if self.name == "none" and (self.num_processes or 1) > 1:
            self.fail(prefix, "num_processes", "needs a distributed engine, e.g. distributed=ddp")
        if self.num_machines > 1 and not self.main_process_ip:
            self.fail(prefix, "main_process_ip", "required with num_machines > 1 (the address of node 0)")


# =====================================================================================================
# registry: which schema each group option uses
# =====================================================================================================
#: group -> option -> schema. A model option always uses ModelConfig.
SCHEMAS: dict[str, dict[str, type[Schema]]] = {
    "env": {
        "frozenlake": FrozenLakeConfig,
        "snake": SnakeConfig,
        "snake_poison": SnakeConfig,
        "bandit": BanditConfig,
        "contextual_bandit": ContextualBanditConfig,
        "tictactoe": TicTacToeConfig,
        "datascicoding": DataSciCodingConfig,
        "kitchen": KitchenConfig,
    },
    "agent": {
        "llm": LLMAgentConfig,
        "random": RandomAgentConfig,
        "planner": PlannerAgentConfig,
        "human": HumanAgentConfig,
        "dqn": DQNAgentConfig,
    },
    "algo": {
        "msgrpo": MSGRPOConfig,
        "poad": POADConfig,
        "ntpo": POADConfig,
        "twosome": POADConfig,
        "rlft": RLFTConfig,
        "sft": SFTConfig,
        "dqn": DQNConfig,
    },
    "distributed": {name: DistributedConfig for name in DISTRIBUTED},
}
ROOT_SCHEMA_NAME = "agentrl_schema"


def schema_name(cls: type[Schema]) -> str:
    """The ConfigStore name a YAML file puts in its defaults list, e.g. `msgrpo_schema`."""
    names = {
        ModelConfig: "model",
        SnakeConfig: "snake",
        FrozenLakeConfig: "frozenlake",
        BanditConfig: "bandit",
        ContextualBanditConfig: "contextual_bandit",
        TicTacToeConfig: "tictactoe",
        DataSciCodingConfig: "datascicoding",
        KitchenConfig: "kitchen",
        LLMAgentConfig: "llm",
        RandomAgentConfig: "random",
        PlannerAgentConfig: "planner",
        HumanAgentConfig: "human",
        DQNAgentConfig: "dqn",
        MSGRPOConfig: "msgrpo",
        POADConfig: "poad",
        RLFTConfig: "rlft",
        SFTConfig: "sft",
        DQNConfig: "dqn",
        DistributedConfig: "distributed",
    }
    return f"{names[cls]}_schema"


def schema_for(group: str, option: str | None = None) -> type[Schema] | None:
    """The schema of a group option (by option name or the node's `name`), or None if there is none."""
    if group == "model":
        return ModelConfig
    return SCHEMAS.get(group, {}).get(str(option)) if option is not None else None
