"""`synced_forwards` (agentrl/kernels/syncforward.py) on a model sharded with torch FSDP2 over two CPU processes.

Two spawned processes (gloo) shard one tiny random Llama with `fully_shard` and make different numbers
of forward calls, as rollouts do. Inside `synced_forwards` both finish, with the outputs (and the
gradients) of an unsharded copy; without it the process with more calls waits for an all-gather that
never comes. One pair of workers runs both: the synced stages report, then the unsynced calls run and
are killed after a deadline, so a deadlock fails or passes a test instead of hanging it.
"""

from __future__ import annotations

import copy
import queue as queue_module
import time
import traceback
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentrl.kernels.kvcache import cache_kwarg, output_cache
from agentrl.kernels.syncforward import ForwardCounts, is_sharded, synced_forwards, token_input

WORLD = 2
STARTUP_S = 150  # spawn + imports + sharding, on a loaded machine
SYNCED_S = 30  # the synced stages (under a second), once both workers are ready
HAZARD_S = 5  # the unsynced calls: milliseconds of work, so silence this long is a deadlock


def _tiny_model() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


def _ids(rank: int, length: int, salt: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * rank + salt)
    return torch.randint(3, 128, (1, length), generator=generator)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


class AllGatherSum(torch.nn.Module):
    """A module whose forward is a collective (an all_gather), with no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x)
        return torch.stack(parts).sum(0)


# -- the stages each worker runs ----------------------------------------------------------------------------
def _forwards(model: Any, reference: Any, rank: int) -> dict[str, Any]:
    """Rank 0: 3 forwards of different lengths, the last one keeping its KV cache through the dummy
    forwards of the exit; rank 1: a prefill and 6 cached decode steps. The first forward of each keeps
    autograd; its loss is backpropagated after the context, on both."""
    diffs, losses = [], []
    with synced_forwards(model) as counts:
        if rank == 0:
            for k, length in enumerate([5, 9, 3]):
                ids = _ids(rank, length, k)
                mask = torch.ones_like(ids)
                with torch.set_grad_enabled(k == 0):
                    out = model(input_ids=ids, attention_mask=mask, use_cache=k == 2)
                    ref = reference(input_ids=ids, attention_mask=mask, use_cache=False)
                diffs.append(_max_diff(out.logits, ref.logits))
                if k == 0:
                    assert out.logits.requires_grad
                    losses.append((out.logits.float().pow(2).mean(), ref.logits.float().pow(2).mean()))
            kept = output_cache(out)
            before = [layer.keys.clone() for layer in kept.layers]
        else:
            ids = _ids(rank, 6, 0)
            out = model(input_ids=ids, use_cache=True)
            ref = reference(input_ids=ids, use_cache=True)
            assert out.logits.requires_grad
            losses.append((out.logits.float().pow(2).mean(), ref.logits.float().pow(2).mean()))
            diffs.append(_max_diff(out.logits, ref.logits))
            cache, ref_cache, arg = output_cache(out), output_cache(ref), cache_kwarg(reference)
            token = out.logits[:, -1:].argmax(-1)
            with torch.no_grad():
                for _ in range(6):
                    out = model(input_ids=token, use_cache=True, **{arg: cache})
                    ref = reference(input_ids=token, use_cache=True, **{arg: ref_cache})
                    diffs.append(_max_diff(out.logits, ref.logits))
                    cache, ref_cache = output_cache(out), output_cache(ref)
                    token = out.logits[:, -1:].argmax(-1)
            assert cache.get_seq_length() == 12
    if rank == 0:  # the 4 dummy forwards left the caller's cache alone
        assert kept.get_seq_length() == 3
        assert all(torch.equal(layer.keys, b) for layer, b in zip(kept.layers, before, strict=True))
    # the backward is a collective too: one per process, outside the context (module doc)
    loss, ref_loss = losses[0]
    loss.backward()
    ref_loss.backward()
    grad_diff = 0.0
    for (name, param), (ref_name, ref_param) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert name == ref_name
        expected = ref_param.grad.clone()
        dist.all_reduce(expected)  # FSDP averages the processes' gradients
        grad_diff = max(grad_diff, _max_diff(param.grad.full_tensor(), expected / WORLD))
    return {"counts": counts, "diffs": diffs, "grad_diff": grad_diff}


def _generate(model: Any, reference: Any, rank: int) -> dict[str, Any]:
    """HF `generate`: one call for 2 new tokens against two calls for 3 and 6. The model is marked
    FSDP-managed, so transformers would run its own synced_gpus loop, whose per-token all_reduce would
    meet the other process's agreement; synced_forwards turns it off."""
    model._is_fsdp_managed_module = True
    same, lengths = [], []
    with torch.no_grad(), synced_forwards(model) as counts:
        for k, new in enumerate([2] if rank == 0 else [3, 6]):
            ids = _ids(rank, 4 + k, 7)
            kwargs = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False, "pad_token_id": 0}
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
            expected = reference.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
            same.append(torch.equal(out, expected))
            lengths.append(out.shape[1] - ids.shape[1])
    return {"counts": counts, "same": same, "new": lengths}


def _idle(model: Any, reference: Any, rank: int) -> dict[str, Any]:
    """Rank 0 has no forward at all (no episode to play) while rank 1 has two, starting from resharded
    root parameters, so the first forward all-gathers them: the agreement must come before that."""
    model.reshard()
    diffs = []
    with torch.no_grad(), synced_forwards(model) as counts:
        if rank == 1:
            for length in (3, 6):
                ids = _ids(rank, length, 5)
                diffs.append(_max_diff(model(input_ids=ids).logits, reference(input_ids=ids).logits))
    # an unsharded module (no collective in its forward) is left alone, whatever the calls
    with synced_forwards(reference) as unsharded:
        hooked = bool(reference._forward_pre_hooks)
        for length in range(2, 3 + 3 * rank):
            reference(input_ids=_ids(rank, length, 6))
    return {
        "counts": counts,
        "diffs": diffs,
        "unsharded": unsharded,
        "hooked": hooked,
        "is_sharded": (is_sharded(model), is_sharded(reference)),
    }


def _two_modules(model: Any, rank: int) -> dict[str, Any]:
    """Two synced modules in one context, and a nested re-entry (a no-op)."""
    gather = AllGatherSum()

    def dummy(module: Any, device: torch.device) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return ((torch.zeros(1),), {}) if module is gather else token_input(module, device)

    sums = []
    with torch.no_grad(), synced_forwards(model, gather, dummy_input=dummy) as counts:
        if rank == 0:
            sums.append(float(gather(torch.ones(1))))
            sums.append(float(gather(torch.full((1,), 2.0))))
            model(input_ids=_ids(rank, 3, 1))
        else:
            with synced_forwards(model) as inner:
                assert inner is counts
                for length in (4, 8):
                    model(input_ids=_ids(rank, length, 2))
            model(input_ids=_ids(rank, 5, 3))
            sums.append(float(gather(torch.full((1,), 10.0))))
    return {"counts": counts, "sums": sums}


def _unsynced(model: Any, rank: int, messages: Any) -> None:
    """The hazard: 3 forwards against 7, no agreement, each reported as it ends; then a barrier."""
    with torch.no_grad():
        for k in range(3 if rank == 0 else 7):
            model(input_ids=_ids(rank, 3 + k, k))
            messages.put(("unsynced_forwards", rank, k + 1))
    dist.barrier()


def _worker(rank: int, init_file: str, messages: Any) -> None:
    torch.set_num_threads(1)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group(
            "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=WORLD,
            timeout=timedelta(seconds=STARTUP_S + SYNCED_S),
        )
        model = _tiny_model()
        reference = copy.deepcopy(model)
        mesh = init_device_mesh("cpu", (WORLD,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        assert all(type(p).__name__ == "DTensor" for p in model.parameters())
        dist.barrier()
        messages.put(("ready", rank, None))
        results = {}
        for name, stage in [
            ("forwards", lambda: _forwards(model, reference, rank)),
            ("generate", lambda: _generate(model, reference, rank)),
            ("idle", lambda: _idle(model, reference, rank)),
            ("two_modules", lambda: _two_modules(model, rank)),
        ]:
            messages.put(("stage", rank, name))
            results[name] = stage()
        messages.put(("synced", rank, results))
        _unsynced(model, rank, messages)
        messages.put(("unsynced", rank, None))
    except BaseException:
        messages.put(("error", rank, traceback.format_exc()))


# -- the parent: start, watch with deadlines, kill -------------------------------------------------------
def _collect(messages: Any, want: str, deadline: float, seen: dict) -> None:
    """Read messages until every rank has sent `want` (or an error), or the deadline passes."""
    while time.monotonic() < deadline:
        if all((want, r) in seen or ("error", r) in seen for r in range(WORLD)):
            return
        try:
            kind, rank, payload = messages.get(timeout=0.2)
        except queue_module.Empty:
            continue
        seen[(kind, rank)] = payload


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: Any) -> dict:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    context = mp.get_context("spawn")
    messages = context.Queue()
    init_file = str(tmp_path_factory.mktemp("syncforward") / "init")
    workers = [
        context.Process(target=_worker, args=(r, init_file, messages), daemon=True) for r in range(WORLD)
    ]
    seen: dict = {}
    timings: dict[str, float] = {}
    start = time.monotonic()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OMP_NUM_THREADS", "1")  # the workers' environment, read as they start
            for worker in workers:
                worker.start()
        _collect(messages, "ready", start + STARTUP_S, seen)
        timings["startup_s"] = time.monotonic() - start
        mark = time.monotonic()
        _collect(messages, "synced", mark + SYNCED_S, seen)
        timings["synced_s"] = time.monotonic() - mark
        if all(("synced", r) in seen for r in range(WORLD)):
            mark = time.monotonic()
            _collect(messages, "unsynced", mark + HAZARD_S, seen)
            timings["unsynced_s"] = time.monotonic() - mark
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
            worker.join(timeout=10)
    seen["timings"] = timings
    print("synced_forwards timings:", {k: round(v, 1) for k, v in timings.items()})
    return seen


def _synced(fsdp_run: dict, rank: int) -> dict:
    error = fsdp_run.get(("error", rank))
    stage = fsdp_run.get(("stage", rank))
    assert ("synced", rank) in fsdp_run, error or f"rank {rank} did not finish stage {stage!r} in time"
    return fsdp_run[("synced", rank)]


@pytest.mark.multiprocess
def test_uneven_forwards_finish_with_unsharded_outputs(fsdp_run):
    r0, r1 = (_synced(fsdp_run, r)["forwards"] for r in range(WORLD))
    assert r0["counts"] == ForwardCounts(real=3, dummy=4)
    assert r1["counts"] == ForwardCounts(real=7, dummy=0)
    assert len(r0["diffs"]) == 3 and len(r1["diffs"]) == 7
    assert max(r0["diffs"] + r1["diffs"]) < 1e-5
    assert r0["grad_diff"] < 1e-5 and r1["grad_diff"] < 1e-5


@pytest.mark.multiprocess
def test_generate_calls_and_lengths_differ(fsdp_run):
    r0, r1 = (_synced(fsdp_run, r)["generate"] for r in range(WORLD))
    assert r0["new"] == [2] and r1["new"] == [3, 6]
    assert all(r0["same"] + r1["same"])
    # a generate call with n new tokens is n forwards (prefill, n - 1 decode steps)
    assert r0["counts"] == ForwardCounts(real=2, dummy=7)
    assert r1["counts"] == ForwardCounts(real=9, dummy=0)


@pytest.mark.multiprocess
def test_a_process_without_forwards_serves_the_others(fsdp_run):
    r0, r1 = (_synced(fsdp_run, r)["idle"] for r in range(WORLD))
    assert r0["counts"] == ForwardCounts(real=0, dummy=2)
    assert r1["counts"] == ForwardCounts(real=2, dummy=0)
    assert max(r1["diffs"]) < 1e-5
    for r in (r0, r1):
        assert r["is_sharded"] == (True, False)
        assert r["unsharded"] == ForwardCounts() and not r["hooked"]


@pytest.mark.multiprocess
def test_two_modules_and_reentry(fsdp_run):
    r0, r1 = (_synced(fsdp_run, r)["two_modules"] for r in range(WORLD))
    # rounds: gather (r1 dummy), gather (r1 dummy), model, model (r0 dummy), model (r0 dummy),
    # gather (r0 dummy, contributing zeros)
    assert r0["sums"] == [1.0, 2.0] and r1["sums"] == [10.0]
    assert r0["counts"] == ForwardCounts(real=3, dummy=3)
    assert r1["counts"] == ForwardCounts(real=4, dummy=2)


@pytest.mark.multiprocess
def test_without_sync_the_longer_process_hangs(fsdp_run):
    for rank in range(WORLD):
        _synced(fsdp_run, rank)  # the hazard runs after the synced stages
    # rank 0 did its 3 forwards; rank 1 did as many and then waited in its 4th forward's all-gather
    assert fsdp_run.get(("unsynced_forwards", 0)) == 3
    assert fsdp_run.get(("unsynced_forwards", 1)) == 3, fsdp_run.get(("error", 1))
    assert ("unsynced", 1) not in fsdp_run


def test_one_process_is_the_identity():
    model = _tiny_model()
    ids = _ids(0, 6, 0)
    expected = model(input_ids=ids).logits
    pre_hooks, generate = dict(model._forward_pre_hooks), model.generate
    assert not dist.is_initialized()
    with synced_forwards(model, enabled=True) as counts:
        assert dict(model._forward_pre_hooks) == pre_hooks and model.generate == generate
        assert torch.equal(model(input_ids=ids).logits, expected)
    assert counts == ForwardCounts()


def test_world_size_one_group_is_the_identity(tmp_path):
    model = _tiny_model()
    ids = _ids(0, 6, 0)
    expected = model(input_ids=ids).logits
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        with synced_forwards(model, enabled=True) as counts:
            assert not model._forward_pre_hooks
            assert torch.equal(model(input_ids=ids).logits, expected)
        assert counts == ForwardCounts()
    finally:
        dist.destroy_process_group()
