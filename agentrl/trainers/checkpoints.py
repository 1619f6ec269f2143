"""Checkpoints of the LLM trainer: written atomically with a manifest, pruned, and read back on resume.

`CheckpointsMixin` holds `MultiStepTrainer`'s overrides of the Trainer's checkpoint methods: a save writes
`checkpoint-<iteration>/` into a staging directory that becomes the checkpoint in one rename, with the
value head's files (trainers/actor_critic.py) and a manifest of its files written last (resume checks
it), then prunes old checkpoints; a load restores the value head's optimizer (and does not call a tied LM
head missing), and a model-only checkpoint (`algo.save_optimizer=false`) resumes with a fresh optimizer
and the schedule at the checkpoint's iteration.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from agentrl import distributed as dist
from agentrl.runs.runlog import manifest_path, prune_checkpoints, write_manifest
from agentrl.trainers.actor_critic import load_head_optimizer, save_value_head

log = logging.getLogger(__name__)


def has_optimizer_state(checkpoint: Path) -> bool:
    """Whether a checkpoint holds the optimizer's state, as its manifest says (written with
    `algo.save_optimizer`): the files differ by engine (`optimizer.pt`; FSDP's `optimizer.bin` or
    `optimizer_0/`; DeepSpeed's `global_step*/`), and the Trainer's own loader finds each."""
    manifest = manifest_path(checkpoint)
    if manifest.is_file():
        return bool(json.loads(manifest.read_text()).get("optimizer", True))
    names = ("optimizer.pt", "optimizer.bin", "optimizer_*", "global_step*")
    return any(any(checkpoint.glob(name)) for name in names)


def shared_parameters(model: Any) -> list[set[str]]:
    """The names of each parameter registered under several names (a tied LM head and its embedding)."""
    names: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), set()).add(name)
    return [group for group in names.values() if len(group) > 1]


def trainer_step(checkpoint: Path | None) -> int:
    """The iteration a checkpoint was saved at (0 without one)."""
    return int(checkpoint.name.split("-")[1]) if checkpoint else 0


class CheckpointsMixin:
    """`MultiStepTrainer`'s checkpoint overrides: a mixin listed before `GRPOTrainer`, reading the Trainer's
    attributes and the trainer's own ones annotated here."""

    args: Any
    state: Any
    actor_critic: Any
    head_optimizer: Any
    head_scheduler: Any
    keep_checkpoints: int
    last_saved_step: int | None
    lr_scheduler: Any

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        root = Path(self.args.output_dir)
        name = f"checkpoint-{self.state.global_step}"
        # every process writes its part (its RNG state; its shards under ZeRO/FSDP), process 0 the rest
        with dist.shared_atomic_dir(root / name) as staging:
            self.args.output_dir = str(staging)
            try:
                super()._save_checkpoint(model, trial)  # writes staging/<name>/
            finally:
                self.args.output_dir = str(root)
            dist.barrier()
            if dist.is_main():
                for child in (staging / name).iterdir():
                    os.replace(child, staging / child.name)
                (staging / name).rmdir()
                if self.actor_critic is not None:
                    save_value_head(
                        self.actor_critic,
                        self.head_optimizer,
                        self.head_scheduler,
                        staging,
                        with_optimizer=not self.args.save_only_model,
                    )
                write_manifest(staging, step=self.state.global_step, optimizer=not self.args.save_only_model)
        self.last_saved_step = self.state.global_step
        if not dist.is_main():
            return
        prune_checkpoints(root, self.keep_checkpoints, current=self.state.global_step)
        log.info("Saved %s%s", root / name, " (model only)" if self.args.save_only_model else "")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        self._load_head_optimizer(checkpoint)
        if checkpoint is None or has_optimizer_state(Path(checkpoint)):
            return super()._load_optimizer_and_scheduler(checkpoint)
        # A model-only checkpoint: Adam's moments restart from zero; the learning-rate schedule continues
        # from the checkpoint's iteration.
        log.warning(
            "%s has no optimizer state (saved with algo.save_optimizer=false): resuming with a fresh optimizer",
            Path(checkpoint).name,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
            for _ in range(self.state.global_step):
                self.lr_scheduler.step()

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        # A tied LM head is the embedding's tensor: the checkpoint stores it once, under the embedding's
        # name, and loading that name restores both; the Trainer would warn that the head is missing.
        missing = set(load_result.missing_keys)
        loaded = {name for names in shared_parameters(self.model) if not names <= missing for name in names}
        kept = [name for name in load_result.missing_keys if name not in loaded]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=kept))  # type: ignore[misc]

    def _load_head_optimizer(self, checkpoint: str | None) -> None:
        """The value head's optimizer and schedule from a checkpoint that has them; without (a model-only
        checkpoint) the head's Adam restarts and its schedule continues from the checkpoint's iteration."""
        if checkpoint is None or self.head_optimizer is None:
            return
        load_head_optimizer(self.head_optimizer, self.head_scheduler, checkpoint, self.state.global_step)
