"""`env=` schemas: one per environment, keys = the env constructor's arguments (agentrl/envs/*.py,
docs/envs.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentrl.config.base import Schema, setting

# Choices of the env constructors and consumers; tests/test_config.py checks they match the modules, so
# composing a config stays free of torch, trl and the env modules.
FROZENLAKE_MAPS = ("4x4", "8x8", "random")
FROZENLAKE_VIEWS = ("board", "board+neighbours")
BANDIT_REWARDS = ("bernoulli", "gaussian")
BANDIT_MAX_ARMS = 24  # colour names available for the buttons (envs/bandit.py COLOURS)
CONTEXTUAL_MAX_FEATURES = 12  # context feature names (envs/contextual_bandit.py FEATURE_NAMES)
TICTACTOE_MARKS = ("X", "O")
TICTACTOE_OPPONENTS = ("random", "mcts", "perfect")
DATASCICODING_DATASETS = ("breast_cancer", "wine", "iris", "digits", "random")
KITCHEN_TASKS = ("tomato_salad", "tomato_lettuce_salad", "tomato_lettuce_onion_salad")


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
        "random",
        "random (a new size x size map per reset seed: held-out eval seeds play unseen maps) or 4x4 / 8x8 "
        "(gymnasium's fixed maps)",
        "code",
        choices=FROZENLAKE_MAPS,
    )
    size: int = setting(4, "side of the board for map=random (ignored for the fixed maps)", ge=2)
    p: float = setting(0.8, "map=random: probability a tile is frozen (generate_random_map)", gt=0, le=1)
    slippery: bool = setting(False, "slippery ice: intended move 1/3, each perpendicular move 1/3", "paper")
    max_steps: int | None = setting(
        None,
        "move cap (truncation); null: 2 x the side (the paper's 8 on 4x4), 25 x the side when slippery. "
        "Random maps are drawn solvable within it; a cap no route fits is refused",
        "paper",
        ge=1,
    )
    view: str = setting(
        "board",
        "observation text: the board with coordinates, or also what each move runs into (edge, ice, hole, "
        "goal)",
        choices=FROZENLAKE_VIEWS,
    )


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


@dataclass
class OpenEnvConfig(EnvSchema):
    """Any OpenEnv server as an env (conf/env/openenv.yaml; agentrl/envs/openenv.py)."""

    name: str = setting("openenv", "env registry name", choices=("openenv",))
    url: str | None = setting(
        None, "the OpenEnv server, e.g. http://127.0.0.1:8000 (agentrl serve env=<name> --port 8000)"
    )
    app: str | None = setting(
        None,
        "instead of url: module:attribute of an OpenEnv server app (e.g. echo_env.server.app:app) or of "
        "an Environment class typed with its action and observation, run on a loopback port in this process",
    )
    max_steps: int = setting(
        100, "move cap (truncation); an agentrl server's own cap applies when it is smaller", ge=1
    )
    text_key: str | None = setting(
        None, "the observation field holding the text; null: text or prompt, else every field as key: value"
    )
    actions_key: str | None = setting(
        None,
        "the observation field listing the valid actions; null: valid_actions, legal_actions, legal_moves, "
        "available_actions or actions, else the action schema's enum, else free text",
    )
    action_key: str | None = setting(
        None, "the action field the answer is sent in; null: action, else the schema's one required field"
    )
    instructions: str | None = setting(
        None, "the task text shown as the system message; null: the server's, else its metadata description"
    )
    success_key: str = setting(
        "success", "the observation field that says an episode succeeded; without it: a positive last reward"
    )
    connect_timeout_s: float = setting(10.0, "seconds to open a session", gt=0)
    message_timeout_s: float = setting(60.0, "seconds to wait for a reset or step answer", gt=0)
