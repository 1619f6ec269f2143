"""`HFBackend`: batched generation on a transformers model (see the package doc)."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

from agentrl.agents.backends.base import Backend, Completion, SamplingConfig, completion_length
from agentrl.agents.backends.graphs import RolloutGraphs
from agentrl.agents.backends.sampling import sample_tokens
from agentrl.errors import BackendError
from agentrl.kernels.packed import PackedLinears
from agentrl.kernels.precision import autocast_wrapped
from agentrl.kernels.syncforward import is_sharded

log = logging.getLogger(__name__)


# ---- transformers ----------------------------------------------------------------------------------
@functools.cache
def _stopping_classes() -> tuple[type, type]:
    """LogitsProcessor/StoppingCriteria subclasses, defined lazily so importing this module stays light."""
    import torch
    from transformers import LogitsProcessor, StoppingCriteria

    class LogprobRecorder(LogitsProcessor):
        """Records log_softmax(raw logits / T) of each sampled token, keeping one (B, V) tensor at a time.

        It runs before HF's temperature/top-k/top-p warpers (custom processors are merged ahead of
        them), so it sees raw logits. At call t the token sampled at call t-1 is the last input id.
        """

        def __init__(self, temperature: float):
            self.temperature = temperature if temperature > 0 else 1.0
            self.previous: Any = None
            self.chosen: list[Any] = []

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            if self.previous is not None:
                self.chosen.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
            self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
            return scores

        def finish(self, generated: Any) -> Any:
            """(B, T) log-probs of `generated` (the new tokens only)."""
            steps = generated.shape[1]
            if steps == 0:
                return generated.new_zeros(generated.shape, dtype=torch.float32)
            if len(self.chosen) < steps:
                self.chosen.append(self.previous.gather(1, generated[:, steps - 1 : steps]).squeeze(1))
            return torch.stack(self.chosen[:steps], dim=1)

    class StopOnStrings(StoppingCriteria):
        """Per-row stop once the generated text contains a stop string (checked on a short tail)."""

        def __init__(self, tokenizer: Any, stops: tuple[str, ...], prompt_length: int):
            self.tokenizer, self.stops, self.prompt_length = tokenizer, stops, prompt_length
            # every token decodes to at least one character in practice; +2 covers partial merges
            self.window = max(len(s) for s in stops) + 2

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            tails = input_ids[:, max(self.prompt_length, input_ids.shape[1] - self.window) :].tolist()
            texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
            done = [any(s in text for s in self.stops) for text in texts]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return LogprobRecorder, StopOnStrings


class HFBackend(Backend):
    """Batched generation with a transformers causal LM (the default; CPU or GPU).

    Prefix caching (`prefix_cache=True`): prompts of one env share a long head (chat template + the
    env's instructions). Its key/value states are computed once, kept (batch 1), and broadcast to every
    row of later calls, so each call only prefills the rows' own suffixes (kernels/kvcache.py).

    Prompt sharing (`share_prompts=True`): the G episodes of a group start from one observation and a
    small grid has few states, so a lockstep batch holds many copies of few prompts. Distinct prompts are
    prefilled once and every row samples its own continuation with transformers' logits warpers; the
    model runs once per distinct context (prompt + tokens drawn so far), so rows that write the same
    answer prefix share its decoding. One-token answers (an action word after a prefill)
    need only each prompt's next-token logits, which are memoised until the weights change. Same
    distribution, log-probs and trimming as the `generate` path; only the random stream differs.

    Everything kept is dropped whenever the weights change: parameter version counters move on in-place
    updates, but fused optimizers (torch's `AdamW(fused=True)`, the HF Trainer's CPU default) update in
    place WITHOUT moving them, so a trainer must call `weights_changed()` after each optimizer step.
    """

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, prefix_cache: bool = True, share_prompts: bool = False):
        from agentrl.kernels.kvcache import cache_kwarg

        self.model = model
        self.tokenizer = tokenizer
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(int(tokenizer.eos_token_id))
        if not eos_ids:
            raise BackendError("the model has no eos token id; set generation_config.eos_token_id")
        self.eos_ids = sorted(int(e) for e in eos_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        self.prefix_cache = prefix_cache
        self.share_prompts = share_prompts
        self._prefix_ids: list[int] = []
        self._prefix_states: list[tuple[Any, Any]] = []
        self._prefix_key: tuple[int, int, int] | None = None
        self._memo: dict[tuple[int, ...], Any] = {}  # one-token answers: first-token logits per prompt
        self._memo_key: tuple[int, int, int] | None = None
        self._weights_epoch = 0  # bumped by weights_changed()
        self._cache_arg = cache_kwarg(model)
        self.graphs: RolloutGraphs | None = None  # the recording rollout's (`recording_graphs`)
        self._packs: PackedLinears | None = None  # the linear weights packed for no-grad forwards

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def clear_prefix_cache(self) -> None:
        self._prefix_ids, self._prefix_states, self._prefix_key = [], [], None

    def weights_changed(self) -> None:
        """Drop everything computed with the old weights (call after each optimizer step)."""
        self._weights_epoch += 1
        self.clear_prefix_cache()
        self._memo, self._memo_key = {}, None
        self.graphs = None
        self._packs = None

    def _weights_key(self) -> tuple[int, int, int]:
        return id(self.model), self._weights_epoch, sum(p._version for p in self.model.parameters())

    def _shared_prefix(self, prompts: list[list[int]]) -> int:
        """Length of the cached head all prompts start with (0: no prefix caching this call)."""
        from agentrl.kernels.kvcache import MIN_SHARED_PREFIX, common_prefix_length

        if not self.prefix_cache:
            return 0
        # every row keeps at least one token of its own, so the model computes its next-token logits
        heads = [p[:-1] for p in prompts]
        common = common_prefix_length(heads)
        if self._prefix_states and self._prefix_key != self._weights_key():
            self.clear_prefix_cache()  # weights changed since the states were computed
        if self._prefix_ids:
            shared = min(common, common_prefix_length([heads[0], self._prefix_ids]))
            if shared >= MIN_SHARED_PREFIX:
                return shared
        if common < MIN_SHARED_PREFIX:
            return 0
        self._compute_prefix(heads[0][:common])
        return common if self._prefix_ids else 0

    def _compute_prefix(self, prefix: list[int]) -> None:
        import torch

        from agentrl.kernels.kvcache import output_cache

        # runs inside generate's no_grad/inference_mode context
        output = self.model(
            input_ids=torch.tensor([prefix], device=self.device), use_cache=True, logits_to_keep=1
        )
        layers = getattr(output_cache(output), "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            # sliding-window or recurrent layers cannot be sliced like this: generate without it
            log.info("prefix caching disabled: the model's cache is not made of plain dynamic layers")
            self.prefix_cache = False
            return
        self._prefix_states = [(layer.keys, layer.values) for layer in layers]
        self._prefix_ids = list(prefix)
        self._prefix_key = self._weights_key()

    def generation_config(self, sampling: SamplingConfig) -> Any:
        """A full GenerationConfig: every knob set explicitly so the model's own defaults (e.g. Qwen's
        repetition_penalty 1.05, temperature 0.7) never leak into our sampling distribution."""
        from transformers import GenerationConfig

        return GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=sampling.do_sample,
            # greedy: None (unused; explicit values would only trigger "flag ignored" warnings)
            temperature=sampling.temperature if sampling.do_sample else None,
            top_p=sampling.top_p if sampling.do_sample else None,
            top_k=sampling.top_k if sampling.do_sample else None,
            min_p=None,
            typical_p=1.0,
            repetition_penalty=1.0,
            num_beams=1,
            num_return_sequences=1,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            bos_token_id=self.model.generation_config.bos_token_id,
            use_cache=True,
            return_dict_in_generate=True,
        )

    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[Completion]:
        import torch

        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise BackendError("empty prompt")
        if self.share_prompts:
            return self._generate_shared(prompts, sampling, seed)
        if self.graphs is not None and self.graphs.recording:
            self.graphs.stop()  # as in `_inference`
        from agentrl.kernels.kvcache import expand_states, preallocate

        LogprobRecorder, StopOnStrings = _stopping_classes()
        was_training = self.model.training
        self.model.eval()
        device = self.device
        # inference_mode is fastest, but tensors it creates can never join autograd: use no_grad when the
        # model is being trained so lazily built buffers stay usable by the backward pass
        # (and under FSDP2, whose sharded weights cannot be used for training after an inference_mode forward;
        # and under mixed precision, whose kept weight casts need no_grad: `_weight_casts`)
        plain = not (was_training or is_sharded(self.model) or self._autocast_wrapped())
        grad_context = torch.inference_mode() if plain else torch.no_grad()
        rng_devices = [device] if device.type == "cuda" else []
        try:
            with (
                grad_context,
                self._weight_casts(),
                self._packed_linears(),
                torch.random.fork_rng(devices=rng_devices, enabled=seed is not None),
            ):
                shared = self._shared_prefix(prompts)
                head = list(prompts[0][:shared])
                tails = [list(p[shared:]) for p in prompts]
                width = max(len(t) for t in tails)
                # Left padding of each row's own part: new tokens line up on the right for every row.
                input_ids = torch.tensor(
                    [head + [self.pad_id] * (width - len(t)) + t for t in tails], device=device
                )
                attention_mask = torch.tensor(
                    [[1] * shared + [0] * (width - len(t)) + [1] * len(t) for t in tails],
                    device=device,
                    dtype=torch.long,
                )
                # the prompts' own parts and the answers are then written into the cache in place
                extra = (
                    {
                        self._cache_arg: preallocate(
                            expand_states(self._prefix_states, shared, len(prompts)),
                            width + sampling.max_new_tokens,
                        )
                    }
                    if shared
                    else {}
                )
                prompt_width = shared + width
                recorder = LogprobRecorder(sampling.temperature if sampling.do_sample else 0.0)
                stopping = (
                    [StopOnStrings(self.tokenizer, sampling.stop, prompt_width)] if sampling.stop else []
                )
                if seed is not None:
                    torch.manual_seed(seed)
                output = self.model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    generation_config=self.generation_config(sampling),
                    logits_processor=[recorder],
                    stopping_criteria=stopping,
                    **extra,
                )
                generated = output.sequences[:, prompt_width:]
                logprobs = recorder.finish(generated)
        finally:
            self.model.train(was_training)
        rows = generated.tolist()
        logprob_rows = logprobs.float().cpu().tolist()
        results: list[Completion] = []
        for ids, lps in zip(rows, logprob_rows, strict=True):
            end = self._completion_length(ids, sampling.stop)
            results.append((ids[:end], lps[:end]))
        return results

    def _completion_length(self, ids: list[int], stops: tuple[str, ...]) -> int:
        return completion_length(self.tokenizer, self.eos_ids, ids, stops)

    # ---- prompt sharing (see the class doc) ------------------------------------------------------------
    def _generate_shared(
        self, prompts: list[list[int]], sampling: SamplingConfig, seed: int | None
    ) -> list[Completion]:
        import torch

        from agentrl.kernels.kvcache import output_cache, preallocate

        if sampling.max_new_tokens == 1:
            return self._generate_one(prompts, sampling, seed)
        keys: dict[tuple[int, ...], int] = {}
        context = torch.tensor([keys.setdefault(tuple(p), len(keys)) for p in prompts], device=self.device)
        generator = self._generator(sampling, seed)
        eos = torch.tensor(self.eos_ids, device=self.device)
        with self._inference():
            # One KV-cache row per distinct context (prompt + tokens so far), `context` maps rows onto them
            cache, logits, mask, position = self._prefill([list(k) for k in keys])
            cache = preallocate(cache, sampling.max_new_tokens)
            done = torch.zeros(len(prompts), dtype=torch.bool, device=self.device)
            tokens, logps = [], []
            for step in range(sampling.max_new_tokens):
                chosen, logp = self._sample(logits.float(), sampling, generator, context)
                chosen = torch.where(done, torch.full_like(chosen, self.pad_id), chosen)
                tokens.append(chosen)
                logps.append(logp)
                done |= torch.isin(chosen, eos)
                if sampling.stop:
                    tails = self.tokenizer.batch_decode(
                        torch.stack(tokens[-8:], 1).tolist(), skip_special_tokens=True
                    )
                    done |= torch.tensor(
                        [any(s in t for s in sampling.stop) for t in tails], device=self.device
                    )
                if bool(done.all()) or step + 1 == sampling.max_new_tokens:
                    break
                # Rows that share a context and drew the same token share the next context: an answer
                # format that most rows write alike (<action>NAME</action>) runs once per distinct prefix.
                # Finished rows keep no context: the cache shrinks to the rows still writing (their pad
                # tokens read context 0, and are replaced by pad again).
                active = ~done
                pairs, inverse = torch.unique(
                    context[active] * logits.size(-1) + chosen[active], return_inverse=True
                )
                context = torch.zeros_like(context)
                context[active] = inverse
                parent, token = pairs // logits.size(-1), pairs % logits.size(-1)
                if parent.numel() != mask.size(0) or not torch.equal(
                    parent, torch.arange(mask.size(0), device=parent.device)
                ):
                    # copies every layer's keys and values: skipped in the common case where each
                    # context has exactly one row left, in order
                    cache.batch_select_indices(parent)
                mask = mask[parent]
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                position = position[parent] + 1
                out = self.model(
                    input_ids=token[:, None],
                    attention_mask=mask,
                    position_ids=position[:, None],
                    use_cache=True,
                    **{self._cache_arg: cache},
                )
                cache, logits = output_cache(out), out.logits[:, -1, :]
        return self._trim(torch.stack(tokens, 1), torch.stack(logps, 1), sampling)

    def _generate_one(
        self, prompts: list[list[int]], sampling: SamplingConfig, seed: int | None
    ) -> list[Completion]:
        """One-token answers: each distinct prompt's next-token logits, memoised per weights, so a lockstep
        rollout on a small grid runs each distinct observation once instead of once per step."""
        import torch

        weights = self._weights_key()
        if self._memo_key != weights:
            self._memo, self._memo_key = {}, weights
        keys = [tuple(p) for p in prompts]
        distinct = {key: k for k, key in enumerate(dict.fromkeys(keys))}  # each row's distinct prompt
        graphs = self.graphs if self.graphs is not None and self.graphs.recording else None
        missing = [
            key
            for key in distinct
            if key not in self._memo or (graphs is not None and key not in graphs.logits)
        ]
        if missing:
            record = graphs is not None and graphs.admit(self._prefill_tokens(missing))
            with self._inference(record=record):
                _, logits, _, _ = self._prefill([list(k) for k in missing])
            if record:
                graphs.keep(missing, logits, weights)
            self._memo.update(zip(missing, logits.detach().float(), strict=True))
        scores = torch.stack([self._memo[key] for key in distinct])
        rows = torch.tensor([distinct[key] for key in keys], device=scores.device)
        chosen, logp = self._sample(scores, sampling, self._generator(sampling, seed), rows)
        return self._trim(chosen[:, None], logp[:, None], sampling)

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, Any, Any, Any]:
        """`prefill_shared` on top of the kept KV states of the prompts' shared head."""
        from agentrl.kernels.kvcache import prefill_shared

        shared = self._shared_prefix(prompts)
        return prefill_shared(
            self.model, prompts, self.pad_id, (shared, self._prefix_states) if shared else None
        )

    def _prefill_tokens(self, prompts: list[tuple[int, ...]]) -> int:
        """Tokens `_prefill` runs for `prompts`, padding included: the shared head unless it is kept, and
        every row's own part at the width of the longest."""
        from agentrl.kernels.kvcache import MIN_SHARED_PREFIX, common_prefix_length

        heads = [list(p[:-1]) for p in prompts]
        common = common_prefix_length(heads)
        if self.prefix_cache and self._prefix_ids:
            kept = min(common, common_prefix_length([heads[0], self._prefix_ids]))
            if kept >= MIN_SHARED_PREFIX:
                return len(prompts) * max(len(p) - kept for p in prompts)
        shared = common if common >= MIN_SHARED_PREFIX else 0
        return shared + len(prompts) * max(len(p) - shared for p in prompts)

    @contextlib.contextmanager
    def recording_graphs(self, budget: int | None = None) -> Any:
        """Inside (one rollout), the prefills of one-token answers run with autograd and keep each distinct
        prompt's next-token logits with its graph in `self.graphs`, for the update to take
        (`recorded_logits`) instead of running the same forward again (agents/backends/graphs.py).
        Everything this backend kept without a graph (the head's states, the memoised logits: an eval
        since the last update computes them) is recomputed. Under bf16 autocast each weight is cast once
        for the whole rollout, with its graph: the first cast of a weight happens in a recorded forward
        (any forward that does not record ends the recording, `RolloutGraphs`). `budget`: the most tokens
        the rollout runs with a graph; past it the rollout drops the graphs and generates as usual."""
        import torch

        self.clear_prefix_cache()
        self._memo, self._memo_key = {}, None
        graphs = self.graphs = RolloutGraphs(budget)
        try:
            with torch.enable_grad(), self._weight_casts():
                yield graphs
        finally:
            graphs.recording = False  # `self.graphs` may be given out or dropped by now
            self._packs = None  # as at the end of `weight_casts_kept`

    def recorded_logits(self, prompts: list[tuple[int, ...]]) -> Any:
        """The recording rollout's next-token logits of `prompts` (U, V) with their graphs, if it recorded
        every one under the current weights; else None. Given out once: the store is emptied."""
        graphs, self.graphs = self.graphs, None
        return None if graphs is None else graphs.take(prompts, self._weights_key())

    @contextlib.contextmanager
    def _inference(self, record: bool = False) -> Any:
        """Eval mode and no autograd (with `record`: autograd, for `recording_graphs`), restoring the model's
        train mode afterwards."""
        import torch

        if not record and self.graphs is not None and self.graphs.recording:
            self.graphs.stop()  # a weight cast made now, without a graph, must not reach a recorded forward
        was_training = self.model.training
        self.model.eval()
        try:
            with (
                torch.enable_grad() if record else torch.no_grad(),
                self._weight_casts(),
                contextlib.nullcontext() if record else self._packed_linears(),
            ):
                yield
        finally:
            self.model.train(was_training)

    def _autocast_wrapped(self) -> bool:
        return autocast_wrapped(self.model)

    @contextlib.contextmanager
    def weight_casts_kept(self) -> Any:
        """Keep autocast's bf16 casts of the weights across every generation call inside: a rollout's
        lockstep steps are one call each, and the weights do not change until the update, so each weight
        is cast once per rollout instead of once per step (SmolLM2-135M on a 2-core CPU: ~75 ms a cast
        of all its weights). Nothing inside may take a gradient (the casts are made without one), and
        the casts are dropped on leaving, before the update changes the weights, and so are the packed
        linear weights (`_packed_linears`). Sharded models cast their gathered shards per call as before."""
        import torch

        try:
            if is_sharded(self.model) or not self._autocast_wrapped():
                yield
                return
            with torch.no_grad(), self._weight_casts():
                yield
        finally:
            self._packs = None  # the update runs next: its memory, not the rollout's packs

    def _weight_casts(self) -> Any:
        """One autocast around a whole generation call when the model's forward has its own.

        Autocast casts each weight to bf16 when the forward enters it and drops the casts when it exits,
        so a forward wrapped in autocast casts every weight again at every decoded token (on this CPU a
        decode-sized LM-head matmul: 80 ms, against 42 ms in fp32). Autocast keeps the casts of weights
        that require grad until its outermost context exits (not under inference_mode), so with this one
        around the call each weight is cast once per call (15 ms for that matmul), with the same numerics
        (agentrl's only mixed precision is bf16: trainers/settings.py). Frozen weights (LoRA's base,
        `algo.trainable_layers`) are not kept and are still cast per token."""
        import torch

        if not self._autocast_wrapped():
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _packed_linears(self) -> Any:
        """The model's linear weights packed for oneDNN while the forwards inside need no gradient
        (kernels/packed.py: a decode step's few rows run up to twice as fast), made once per weights
        version and kept until the weights change or the rollout ends (`weight_casts_kept`). On a CPU only,
        in the dtype the layers compute in: bf16 where autocast wraps the forward, else the weights' own."""
        import torch

        if self.device.type != "cpu" or is_sharded(self.model):
            return contextlib.nullcontext()
        key = self._weights_key()
        if self._packs is None or self._packs.key != key:
            self._packs = None  # the old packs go before the new ones are made
            dtype = torch.bfloat16 if self._autocast_wrapped() else None
            self._packs = PackedLinears.build(self.model, dtype, key)
        return self._packs.active() if self._packs is not None else contextlib.nullcontext()

    def _generator(self, sampling: SamplingConfig, seed: int | None) -> Any:
        import torch

        if seed is None or not sampling.do_sample:
            return None
        return torch.Generator(device=self.device).manual_seed(int(seed))

    @staticmethod
    def _sample(scores: Any, sampling: SamplingConfig, generator: Any, rows: Any = None) -> tuple[Any, Any]:
        """One token for each of `rows` (indices into `scores`, one row per distinct context; None: every
        row of `scores`), with temperature, top-k, top-p as transformers' warpers apply them, or greedy;
        and its log_softmax(scores / T) before top-k/top-p, as the `generate` path records it.

        The draw is one uniform number a row through the cumulative distribution of the tokens left after
        top-k and top-p (`sample_tokens`), not `torch.multinomial`, which draws an exponential variable for
        every vocabulary entry of every row: with top-k that is 5 tokens a row instead of 49,152."""
        import torch

        if rows is None:
            rows = torch.arange(scores.size(0), device=scores.device)
        if not sampling.do_sample:
            chosen = scores.argmax(-1)
            logp = scores.gather(1, chosen[:, None]).squeeze(1) - torch.logsumexp(scores, -1)
            return chosen[rows], logp[rows]
        scaled = scores / sampling.temperature
        chosen = sample_tokens(scaled, sampling.top_k, sampling.top_p, generator, rows)
        return chosen, scaled[rows, chosen] - torch.logsumexp(scaled, -1)[rows]

    def _trim(self, tokens: Any, logps: Any, sampling: SamplingConfig) -> list[Completion]:
        results: list[Completion] = []
        for row, lps in zip(tokens.tolist(), logps.cpu().tolist(), strict=True):
            end = self._completion_length(row, sampling.stop)
            results.append((row[:end], lps[:end]))
        return results


def own_forwards(model: Any) -> Any:
    """`model` (a deep copy) with every module's `forward` its class's own again.

    A forward patched onto an instance survives `copy.deepcopy` as a function whose closure still points
    at the ORIGINAL module: TRL's fused LM head (`add_fused_lm_head`, applied by GRPOTrainer) keeps the
    source's bound `forward` in a closure, so a copy would compute with the source's weights and dtype.
    accelerate's device hooks (`_hf_hook`) are kept: their state is an attribute that deepcopy copies.
    """
    for module in model.modules():
        if "forward" in vars(module) and not hasattr(module, "_hf_hook"):
            del module.forward
    return model


class HFCopyBackend(HFBackend):
    """Training rollouts from a copy of the trained model in another dtype (`algo.rollout_dtype`).

    The trainer keeps fp32 weights (algo.precision fp32 or bf16-mixed), and generation with them runs in
    fp32. A bf16 forward is several times faster on a GPU and on a CPU with AMX or AVX512-BF16, and
    autocast over fp32 weights still casts the whole model once per generation call. So a
    bf16 copy generates, refreshed from the trained weights before every rollout (`sync_weights`, a
    parameter-wise copy), and the update corrects for the copy's numerics with TRL's importance-sampling
    ratio, as for rollouts from vLLM. Generation with a stale copy is refused: between an optimizer step
    (`weights_changed`) and the next sync, the copy still holds the previous weights.
    """

    name = "hf-copy"

    def __init__(
        self,
        source: Any,
        tokenizer: Any,
        dtype: Any,
        *,
        prefix_cache: bool = True,
        share_prompts: bool = False,
    ):
        import copy

        if is_sharded(source):
            raise BackendError(
                "algo.rollout_dtype: the trained model is sharded (ZeRO-3/FSDP), so no process holds a whole "
                "copy to generate with; leave algo.rollout_dtype null"
            )
        engine = own_forwards(copy.deepcopy(source)).to(dtype)
        engine.requires_grad_(False)
        engine.eval()
        super().__init__(engine, tokenizer, prefix_cache=prefix_cache, share_prompts=share_prompts)
        self.source = source
        self.synced = False
        self.synced_step: int | None = None
        self.sync_count = 0

    def sync_weights(self, step: int | None = None) -> None:
        """Copy the trained weights (cast to the copy's dtype) into the copy. `step`: the trainer's
        `state.global_step`, kept in `synced_step`."""
        import torch

        with torch.no_grad():
            pairs = zip(
                [*self.model.parameters(), *self.model.buffers()],
                [*self.source.parameters(), *self.source.buffers()],
                strict=True,
            )
            for copy_tensor, trained in pairs:
                copy_tensor.copy_(trained)
        super().weights_changed()  # the copy's kept prefix states and one-token logits are stale
        self.synced, self.synced_step = True, step
        self.sync_count += 1

    def weights_changed(self) -> None:
        """The trained weights moved (an optimizer step): the copy is stale until the next sync."""
        self.synced = False

    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[Completion]:
        if not self.synced:
            raise BackendError(
                "the rollout copy does not hold the current trained weights: call sync_weights() first"
            )
        return super().generate(prompts, sampling, seed=seed)
