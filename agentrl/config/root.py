"""The root config's schema: the command's task, seed, run name and the held-out evaluation (`eval.*`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentrl.config.base import Schema, setting

TASKS = ("eval", "train")


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
    report_to: Any = setting(
        "tensorboard",
        "train: the experiment trackers metrics go to besides metrics.jsonl: tensorboard (run_dir/tb/), "
        "wandb, mlflow, trackio, a list of them ([wandb,tensorboard]) or none",
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
        from agentrl.runs.trackers import selected

        selected(self.report_to)  # an unknown tracker: one line naming the valid choices
        # the name ends the run directory's name: a separator would nest it, `..` would leave outputs/
        if "/" in self.name or "\\" in self.name or self.name in ("", ".", ".."):
            self.fail(prefix, "name", "names one directory: use no / or \\ (e.g. name=a_b)")
