"""The critic of POAD (docs/algorithms.md#poad): a value head on the frozen base model.

As in the authors' code (ADRL `models/critic.py`): the base language model runs under no_grad — with the
LoRA adapter disabled, or as a frozen copy of the initial weights under full fine-tuning — and a bias-free
MLP (hidden -> 1024 -> 512 -> 1, ReLU, fp32) maps its last hidden state at every position to a value.
V[t][j], the value before token j of step t's action, is read at the position that predicts token j.

The trunk is frozen, so each row's hidden states are computed once per iteration (`features`) and the
head trains on them for every PPO epoch; only the head's ~1.1M parameters (at hidden 576) learn.

With a KL term under full fine-tuning (RLFT's GAE: beta > 0), TRL's reference model is also a frozen
model of the initial weights. The critic then takes it as its trunk (`use_reference`): one frozen copy
instead of two, and the reference log-probs of the completion tokens come from the same forward (the LM
head on the hidden states already computed), so the update runs no reference forward of its own.

    value loss = value_coef * mean_tokens max((R - V)^2, (R - V_clip)^2) / 2,
    V_clip = V_old + clamp(V - V_old, -clip, clip)                     (PPO's clipped value loss)
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentrl.kernels.kvcache import cache_kwarg, prefill_shared
from agentrl.kernels.packed import PackedLinears
from agentrl.kernels.precision import autocast_wrapped
from agentrl.kernels.syncforward import is_sharded, synced_forwards
from agentrl.trainers.logps import completion_logps
from agentrl.types import Episode, StepSample

VALUE_HEAD_FILE = "value_head.pt"


class ValueHead(nn.Module):
    """hidden -> 1024 -> 512 -> 1 with ReLU, no biases, in fp32 (the authors' TPPOCritic head)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden_size, 1024, bias=False),
            nn.ReLU(),
            nn.Linear(1024, 512, bias=False),
            nn.ReLU(),
            nn.Linear(512, 1, bias=False),
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features.float()).squeeze(-1)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None,
) -> torch.Tensor:
    """Sum over masked tokens of max((R - V)^2, (R - V_clip)^2) / 2 (the caller normalises). `clip` None:
    the plain squared error."""
    unclipped = (returns - values) ** 2
    if clip is not None:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        unclipped = torch.max(unclipped, (returns - clipped_values) ** 2)
    return (unclipped * mask).sum() / 2


class Critic:
    """The value function: `ValueHead` over the frozen trunk's last hidden states.

    `model` is the policy being trained. Under LoRA (a PEFT model) the trunk is the same model with its
    adapter disabled; otherwise a frozen copy of `model` is taken now, before any update, unless
    `reference_trunk`: then the trunk is the trainer's reference model, handed over by `use_reference`
    once the trainer has built it (a copy taken after TRL patched the policy's forward would call the
    policy's own weights). `seed` draws the value head's initial weights."""

    def __init__(
        self, model: Any, device: Any = None, reference_trunk: bool = False, seed: int | None = None
    ):
        self.lora = hasattr(model, "disable_adapter") and hasattr(model, "peft_config")
        self.trunk: Any = None
        if self.lora:
            self.trunk = model
        elif not reference_trunk:
            self.trunk = copy.deepcopy(model).eval()
            for param in self.trunk.parameters():
                param.requires_grad_(False)
        hidden = _hidden_size(model)
        device = device if device is not None else next(model.parameters()).device
        # the head's initial weights come from `seed` (the run's), not from whatever the global generator
        # holds by now: the same seed gives the same run
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.head = ValueHead(hidden).to(device)
        self.device = device
        self._features: dict[tuple[int, int], torch.Tensor] = {}
        # with the reference model as trunk: the temperature its log-probs are taken at, and the
        # iteration's log-probs per (episode, step)
        self.reference_temperature: float | None = None
        self._reference: dict[tuple[int, int], torch.Tensor] = {}
        self._packs: PackedLinears | None = None  # the frozen trunk's linear weights, packed on a CPU

    def use_reference(self, reference: Any, temperature: float) -> None:
        """Take `reference` (a frozen model of the initial weights: TRL's reference policy) as the trunk;
        `evaluate` then also scores each row's completion under it, at `temperature` (`reference_logps`)."""
        if self.lora or self.trunk is not None:
            raise RuntimeError("the critic already has its trunk")
        self.trunk = reference.eval()
        self.reference_temperature = float(temperature)

    @property
    def scores_reference(self) -> bool:
        """Whether `evaluate` gives the reference log-probs too (the trunk is the reference model)."""
        return self.reference_temperature is not None

    # -- hidden states --------------------------------------------------------------------------------
    def _trunk_context(self) -> Any:
        return self.trunk.disable_adapter() if self.lora else contextlib.nullcontext()

    def _packed(self) -> Any:
        """A frozen trunk of its own (not LoRA's, which is the trained policy) on a CPU runs its linear
        layers on weights packed once for the run (kernels/packed.py; rebuilt if they ever change), in the
        dtype its forward computes in: bf16 where accelerate's autocast wraps it."""
        if self.lora or torch.device(self.device).type != "cpu" or is_sharded(self.trunk):
            return contextlib.nullcontext()
        key = sum(p._version for p in self.trunk.parameters())
        if self._packs is None or self._packs.key != key:
            self._packs = None
            dtype = torch.bfloat16 if autocast_wrapped(self.trunk) else None
            self._packs = PackedLinears.build(self.trunk, dtype, key)
        return self._packs.active() if self._packs is not None else contextlib.nullcontext()

    @torch.no_grad()
    def features(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        pad_id: int,
        rows: int = 16,
    ) -> list[torch.Tensor]:
        """For each (prompt, completion), the trunk's last hidden states at the positions that predict the
        completion's tokens: (max(L, 1), hidden), where an empty completion gets the state's position (the
        prompt's last token). Per chunk of `rows`, each distinct prompt runs once (their common head once
        more, kernels/kvcache.py) and only the completions run per row; the values equal a plain forward."""
        if self.trunk is None:
            raise RuntimeError("the critic has no trunk: use_reference was not called")
        out: list[torch.Tensor] = []
        # the dummies of synced_forwards run while the adapter is still off: the same modules on every process
        with self._trunk_context(), synced_forwards(self.trunk), self._packed():
            for start in range(0, len(prompts), rows):
                out.extend(
                    self._chunk_features(
                        prompts[start : start + rows], completions[start : start + rows], pad_id
                    )
                )
        return out

    def _chunk_features(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
    ) -> list[torch.Tensor]:
        keys: dict[tuple[int, ...], int] = {}
        inverse = torch.tensor([keys.setdefault(tuple(p), len(keys)) for p in prompts], device=self.device)
        cache, state_hidden, prompt_mask, last_position = prefill_shared(
            self.trunk, [list(k) for k in keys], pad_id, hidden=True
        )
        first = state_hidden[inverse].float()  # the position before each completion's first token
        width = max(len(c) for c in completions)
        if width <= 1:
            return [first[r : r + 1] for r in range(len(prompts))]
        # the positions before tokens 1..L-1 are the completion's own tokens 0..L-2
        lengths = [max(len(c), 1) for c in completions]
        ids = torch.tensor(
            [list(c[: n - 1]) + [pad_id] * (width - n) for c, n in zip(completions, lengths, strict=True)],
            device=self.device,
        )
        mask = torch.tensor([[1] * (n - 1) + [0] * (width - n) for n in lengths], device=self.device)
        cache.batch_select_indices(inverse)
        rest = (
            self.trunk(
                input_ids=ids,
                attention_mask=torch.cat([prompt_mask[inverse], mask], dim=1),
                position_ids=last_position[inverse][:, None] + torch.arange(1, width, device=self.device),
                use_cache=True,
                logits_to_keep=1,
                output_hidden_states=True,
                **{cache_kwarg(self.trunk): cache},
            )
            .hidden_states[-1]
            .float()
        )
        return [torch.cat([first[r : r + 1], rest[r, : n - 1]]) for r, n in enumerate(lengths)]

    @torch.no_grad()
    def values(self, features: Sequence[torch.Tensor]) -> list[list[float]]:
        """V at every position of every row (the head in inference)."""
        return [self.head(f).tolist() for f in features]

    def evaluate(self, episodes: Sequence[Episode], pad_id: int) -> list[list[list[float]]]:
        """The values V[episode][step][token] of an iteration's episodes. Each step's hidden states are kept
        (by episode and step index) for `batch_features`, which the update's micro-batches read."""
        keys, prompts, completions = [], [], []
        for i, episode in enumerate(episodes):
            for t, step in enumerate(episode.steps):
                keys.append((i, t))
                prompts.append(step.prompt_ids)
                completions.append(step.completion_ids)
        features = self.features(prompts, completions, pad_id) if keys else []
        self._features = dict(zip(keys, features, strict=True))
        if self.scores_reference:
            self._reference = dict(zip(keys, self._completion_logps(features, completions), strict=True))
        flat = iter(self.values(features))
        return [[next(flat) for _ in episode.steps] for episode in episodes]

    @torch.no_grad()
    def _completion_logps(
        self, features: Sequence[torch.Tensor], completions: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        """Each completion's token log-probs under the trunk: its LM head on the hidden states that predict
        the tokens (the last layer's, after the final norm: what the model's own logits are made from), in
        the precision of the trunk's own forward (under bf16 autocast where accelerate wraps it, as the
        trained policy's logits are: at the initial weights both then give the same log-probs)."""
        lm_head = self.trunk.get_output_embeddings()
        dtype, temperature = lm_head.weight.dtype, float(self.reference_temperature or 1.0)
        autocast = torch.autocast(
            torch.device(self.device).type, torch.bfloat16, enabled=autocast_wrapped(self.trunk)
        )
        out = []
        with self._packed(), autocast:
            for f, completion in zip(features, completions, strict=True):
                n = len(completion)
                if n == 0:
                    out.append(f.new_zeros(0))
                    continue
                targets = torch.tensor(completion, device=f.device)
                logits = lm_head(f[:n].to(dtype))
                out.append(completion_logps(logits, targets, temperature, False)[0])
        return out

    def reference_logps(self, samples: Sequence[StepSample], width: int) -> torch.Tensor:
        """(B, width) reference log-probs of the rows' completion tokens, from this iteration's `evaluate`
        (zeros past each completion and for placeholder rows)."""
        out = torch.zeros((len(samples), width), device=self.device)
        for row, s in enumerate(samples):
            logps = self._reference.get((s.episode_index, s.step_index))
            if logps is not None:
                n = min(logps.numel(), width)
                out[row, :n] = logps[:n]
        return out

    def batch_features(self, samples: Sequence[StepSample], width: int) -> torch.Tensor:
        """(B, width, hidden) hidden states of the rows' completion positions (zeros for placeholder rows)."""
        hidden = self.head.net[0].in_features
        empty = torch.zeros((1, hidden), device=self.device)
        rows = [self._features.get((s.episode_index, s.step_index), empty) for s in samples]
        return pad_features(rows, width)

    # -- persistence ----------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        # on the CPU: the file loads on any device (a process's own, e.g. cuda:3, is not another's)
        state = {key: value.cpu() for key, value in self.head.state_dict().items()}
        torch.save(state, Path(directory) / VALUE_HEAD_FILE)

    def load(self, directory: str | Path) -> bool:
        """Load the head from a checkpoint directory; False when it has none."""
        path = Path(directory) / VALUE_HEAD_FILE
        if not path.is_file():
            return False
        self.head.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return True


def pad_features(features: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """(B, width, hidden) from per-row (L_i, hidden) tensors, zero-padded on the right."""
    hidden = features[0].size(-1)
    out = features[0].new_zeros((len(features), width, hidden))
    for row, f in enumerate(features):
        n = min(f.size(0), width)
        out[row, :n] = f[:n]
    return out


def plain_lm_head(model: Any) -> bool:
    """Whether `model`'s logits are its LM head on the last hidden state, nothing more (no soft-capping or
    scaling, which some architectures apply after the head): then `Critic` can score the reference
    log-probs from the hidden states it already has."""
    config = model.config
    text = getattr(config, "get_text_config", lambda: config)()
    scalers = (
        "final_logit_softcapping",
        "logit_scale",
        "output_multiplier",
        "lm_head_multiplier",
        "logits_scaling",
    )
    return model.get_output_embeddings() is not None and all(
        getattr(text, k, None) in (None, 1.0) for k in scalers
    )


def _hidden_size(model: Any) -> int:
    config = model.config
    text = getattr(config, "get_text_config", lambda: config)()
    return int(text.hidden_size)


__all__ = ["VALUE_HEAD_FILE", "Critic", "ValueHead", "clipped_value_loss", "pad_features", "plain_lm_head"]
