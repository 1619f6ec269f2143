"""The critic's side of the engine: its value loss, and the value head's own optimizer, schedule and files.

An algorithm with a critic (POAD, NTPO, TWOSOME; RLFT with `algo.advantage=gae`) trains the value head
(trainers/critic.py) beside the policy. The head has its own AdamW (its learning rate, eps 1e-5 as in the
POAD authors' code) and schedule, outside the model's optimizer: FSDP's and DeepSpeed's optimizer wrappers
hold only the module's own parameters, and the head lives outside the module on every process. It steps in
the trainer's pre-optimizer-step hook; checkpoints carry its weights (`Critic.save`) and, unless they are
model-only, its optimizer and schedule (`HEAD_OPTIMIZER_FILE`).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import torch

from agentrl import distributed as dist
from agentrl.trainers.critic import Critic, clipped_value_loss

#: the value head's optimizer and scheduler state in a checkpoint (the model's are the Trainer's files)
HEAD_OPTIMIZER_FILE = "value_head_optimizer.pt"


@dataclasses.dataclass
class ActorCritic:
    """What the engine needs for an algorithm with a critic (POAD): the critic, the value head's learning
    rate (its own optimizer, Adam eps 1e-5 as in the authors' code), and the value loss's coefficient
    and clip."""

    critic: Critic
    learning_rate: float
    value_coef: float = 0.5
    value_clip: float | None = 0.2

    def value_loss(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The clipped value loss of a packed micro-batch, summed over its tokens with value targets."""
        values = self.critic.head(inputs["critic_features"])
        return clipped_value_loss(
            values, inputs["old_values"], inputs["returns"], inputs["value_mask"], self.value_clip
        )


def head_optimizer(actor_critic: ActorCritic | None, args: Any) -> tuple[Any, Any]:
    """The value head's AdamW and its learning-rate schedule (the policy's schedule, the head's rate), from
    the Trainer's `args`; (None, None) without a critic."""
    if actor_critic is None:
        return None, None
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(
        actor_critic.critic.head.parameters(),
        lr=actor_critic.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=1e-5,
        weight_decay=0.0,
    )
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.get_warmup_steps(args.max_steps),
        num_training_steps=args.max_steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    return optimizer, scheduler


def step_value_head(actor_critic: ActorCritic, optimizer: Any, empty: bool, max_grad_norm: float) -> None:
    """One optimizer step of the value head, with its own gradient clipping (the Trainer clips only the
    policy); an `empty` iteration (no process had a row) leaves the head as it is."""
    head = list(actor_critic.critic.head.parameters())
    # the head is outside DDP: each process's gradient is its rows' share of the global mean
    dist.sum_gradients(head)
    if empty:
        for param in head:
            param.grad = None
    elif max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(head, max_grad_norm)
    optimizer.step()  # a head without gradients (an empty iteration) stays as it is
    optimizer.zero_grad(set_to_none=True)


def save_value_head(
    actor_critic: ActorCritic, optimizer: Any, scheduler: Any, directory: Path, with_optimizer: bool
) -> None:
    """The head's weights into a checkpoint `directory`, and with `with_optimizer` its optimizer and
    schedule (`HEAD_OPTIMIZER_FILE`)."""
    actor_critic.critic.save(directory)
    if with_optimizer:
        head_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        torch.save(head_state, directory / HEAD_OPTIMIZER_FILE)


def load_head_optimizer(optimizer: Any, scheduler: Any, checkpoint: str, iteration: int) -> None:
    """The value head's optimizer and schedule from a checkpoint that has them; without (a model-only
    checkpoint) the head's Adam restarts and its schedule continues from the checkpoint's `iteration`."""
    path = Path(checkpoint, HEAD_OPTIMIZER_FILE)
    if path.is_file():
        # saved from process 0's device: loaded on the CPU, the optimizer moves it to the head's
        state = torch.load(path, map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(iteration):
            scheduler.step()
