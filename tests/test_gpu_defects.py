"""Defects of the GPU and sharded paths (issue 22), each checked on the CPU: `torch.cuda` mocked where a
GPU count or device matters, a tiny model, and two gloo processes where ranks matter
(tests/test_distributed.py)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import NEEDS_GGUF, embedded_gguf_missing, gloo_env

from agentrl import distributed as dist
from agentrl.config import compose_config
from agentrl.envs import env_factory

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ROOT / "tests" / "workers"

TINY = [
    "model=tiny-random",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=4",
    "agent.invalid_rule=random",
    "algo.group_size=2",
    "algo.groups_per_iteration=1",
    "algo.gradient_accumulation_steps=1",
    "algo.save_final=false",
    "algo.iterations=1",
    "algo.torch_threads=1",
    "eval.episodes=2",
]


def _cfg(*overrides: str) -> Any:
    return compose_config(["task=train", "algo=msgrpo", *TINY, *overrides])


def test_the_eval_before_training_runs_on_the_prepared_model(tmp_path, monkeypatch):
    """A1/B5: the evaluation before training runs after the Trainer's `accelerator.prepare` (ZeRO-3's
    partitions and FSDP's shards exist only then, and mixed precision's autocast wraps `forward` then),
    so the evaluations before and after training see the same model."""
    import accelerate

    import agentrl.evaluation
    from agentrl.trainers.multistep import train_llm

    events: list[str] = []
    prepare_model = accelerate.Accelerator.prepare_model

    def recording_prepare(self, model, *args, **kwargs):
        events.append("prepare")
        return prepare_model(self, model, *args, **kwargs)

    real = agentrl.evaluation.evaluate

    def evaluate(*args: Any, description: str = "", **kwargs: Any):
        events.append(description)
        return real(*args, description=description, **kwargs)

    monkeypatch.setattr(accelerate.Accelerator, "prepare_model", recording_prepare)
    monkeypatch.setattr(agentrl.evaluation, "evaluate", evaluate)
    result = train_llm(_cfg("algo.eval_before=true"), tmp_path, env_factory)
    assert events.index("prepare") < events.index("eval before training")
    assert events[-1] == "eval after training"
    assert result.extra["before"]["episodes"] == 2
    assert (tmp_path / "eval_before.json").is_file()


@pytest.mark.multiprocess  # two processes
def test_the_process_group_gets_the_trainers_timeout(tmp_path):
    """A7: the process group exists before the Trainer's arguments (the model loads onto each process's
    device), so it is created with the timeout the Trainer would have used (`ddp_timeout`), not the
    backend's default (NCCL's 600 s)."""
    out = tmp_path / "timeout.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    subprocess.run(
        [*launch, str(WORKERS / "pg_timeout.py"), str(out), "1234"],
        env=gloo_env(),
        check=True,
        timeout=120,
        cwd=ROOT,
    )
    assert json.loads(out.read_text()) == {"group": 1234.0, "trainer": 1234}


def test_a_single_relaunched_process_borrows_the_parents_run_directory(tmp_path, monkeypatch):
    """A9: `distributed=...` with `num_processes` null on a machine with one GPU relaunches one process
    (WORLD_SIZE=1): it is launched (no second relaunch) and writes into the directory its parent holds."""
    from agentrl.runs import launch as run

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv(dist.LOCKED_RUN_DIR, str(tmp_path))
    monkeypatch.setattr(dist, "ensure_process_group", lambda *a, **k: None)
    assert dist.launched()

    def take():
        raise AssertionError("the parent holds the lock")

    lock = run._claim(take, resume=False)
    assert isinstance(lock, run.BorrowedLock) and lock.path == tmp_path.resolve()
    monkeypatch.delenv(dist.LOCKED_RUN_DIR)
    assert not dist.launched()


def test_candidate_scoring_runs_under_gradient_checkpointing():
    """A3: TWOSOME's training forward (`candidate_logps` under autograd) with
    `algo.gradient_checkpointing=true`: checkpointed layers return no KV cache, so the candidates are
    scored with one plain forward per row instead; the values equal the shared-prefix path's."""
    from agentrl.agents.scoring import candidate_logps
    from agentrl.models import load_model

    model, _ = load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7], [1, 2, 3, 4, 5]]
    candidates = [[[50, 51], [60, 61, 62], [70]], [[80]], [[5, 6]]]
    model.eval()
    with torch.no_grad():
        shared, shared_mask = candidate_logps(model, prompts, candidates)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    logps, mask = candidate_logps(model, prompts, candidates)
    assert torch.equal(mask, shared_mask)
    assert torch.allclose(logps, shared, atol=1e-5)
    logps.sum().backward()
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in model.parameters())


def test_one_process_with_several_visible_gpus_trains_on_one(tmp_path, monkeypatch):
    """A2: one process on a node with 4 visible GPUs: TrainingArguments counts them all (`n_gpu`), the
    Trainer would wrap the model in DataParallel and GRPOTrainer raises; the arguments are pinned to
    one device (cuda:0) before the model loads, and another device index is refused with the fix."""
    from accelerate.state import AcceleratorState, PartialState

    from agentrl.config import typed
    from agentrl.errors import ConfigError
    from agentrl.trainers.settings import grpo_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    # accelerate's process-wide state would keep the mocked CUDA device for later tests
    monkeypatch.setattr(AcceleratorState, "_shared_state", {})
    monkeypatch.setattr(PartialState, "_shared_state", {})
    algo = typed(_cfg().algo)
    args = grpo_config(algo, tmp_path, "cuda", 0)
    assert (str(args.device), args.n_gpu) == ("cuda:0", 1)
    with pytest.raises(ConfigError, match="model.device=cuda:2: .*CUDA_VISIBLE_DEVICES=2"):
        grpo_config(algo, tmp_path, "cuda:2", 0)


POAD = [
    "algo=poad",
    "algo.ppo_epochs=2",
    "algo.checkpoint_every=1",
    "algo.eval_before=false",
    "algo.eval_every=0",
]


def test_the_value_head_has_its_own_optimizer_saved_and_restored(tmp_path, monkeypatch):
    """A4/A5: the value head sits on the Trainer's device with its own optimizer, outside the model's
    (FSDP's optimizer state dict raises KeyError on a group of non-module parameters; ZeRO-3 converts
    only the module's); its Adam moments and schedule are saved with each checkpoint and restored on
    resume."""
    from agentrl.trainers.actor_critic import HEAD_OPTIMIZER_FILE
    from agentrl.trainers.grpo_trainer import MultiStepTrainer
    from agentrl.trainers.multistep import train_llm

    trainers: list[Any] = []
    real_init = MultiStepTrainer.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        trainers.append(self)

    monkeypatch.setattr(MultiStepTrainer, "__init__", spy)
    train_llm(_cfg(*POAD, "algo.iterations=2"), tmp_path, env_factory)
    first = trainers[-1]
    head = list(first.actor_critic.critic.head.parameters())
    model_params = {id(p) for group in first.optimizer.param_groups for p in group["params"]}
    assert not model_params & {id(p) for p in head}
    device = first.accelerator.device  # "cuda" and "cuda:0" are the same GPU
    assert all((p.device.type, p.device.index or 0) == (device.type, device.index or 0) for p in head)
    saved = torch.load(tmp_path / "checkpoint-1" / HEAD_OPTIMIZER_FILE, weights_only=True)
    assert saved["scheduler"]["last_epoch"] == 1 and saved["optimizer"]["state"]

    loaded: list[dict] = []
    real_load = MultiStepTrainer._load_head_optimizer

    def load_spy(self: Any, checkpoint: Any) -> None:
        real_load(self, checkpoint)
        loaded.append(copy.deepcopy(self.head_optimizer.state_dict()))  # Adam updates it in place

    monkeypatch.setattr(MultiStepTrainer, "_load_head_optimizer", load_spy)
    shutil.rmtree(tmp_path / "checkpoint-2")  # the last iteration's: resume at 1, from the saved moments
    train_llm(_cfg(*POAD, "algo.iterations=2"), tmp_path, env_factory, resume=True)
    restored = loaded[0]["state"]
    for key, moments in saved["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(restored[key][name], moments[name])
    assert trainers[-1].head_scheduler.last_epoch == 2


@pytest.mark.parametrize(
    "layout", ["optimizer.bin", "optimizer_0/__0_0.distcp", "global_step1/zero_pp_rank_0.pt"]
)
def test_a_sharded_engines_optimizer_state_is_loaded_on_resume(tmp_path, monkeypatch, layout):
    """B4: FSDP saves the optimizer as `optimizer.bin` (or `optimizer_0/`), DeepSpeed under
    `global_step*/`, not `optimizer.pt`: the resume hands such a checkpoint to the Trainer's loader
    instead of treating it as model-only (which restarted Adam and skipped the saved scheduler)."""
    from transformers import Trainer

    from agentrl.runs.runlog import write_manifest
    from agentrl.trainers.grpo_trainer import MultiStepTrainer

    checkpoint = tmp_path / "checkpoint-1"
    (checkpoint / layout).parent.mkdir(parents=True, exist_ok=True)
    (checkpoint / layout).write_bytes(b"state")
    (checkpoint / "scheduler.pt").write_bytes(b"state")
    write_manifest(checkpoint, step=1, optimizer=True)
    loads: list[str] = []
    monkeypatch.setattr(Trainer, "_load_optimizer_and_scheduler", lambda self, path: loads.append(path))
    trainer = object.__new__(MultiStepTrainer)
    trainer.head_optimizer, trainer.use_adaptive_entropy = None, False
    trainer._load_optimizer_and_scheduler(str(checkpoint))
    assert loads == [str(checkpoint)]


@pytest.mark.parametrize("engine", ["zero2", "zero3"])
def test_settings_deepspeed_steps_past_are_refused_before_launch(engine):
    """B1: DeepSpeed's engine steps inside the backward of every pass that synchronises gradients, so a
    token budget's chunks and further PPO epochs (with their KL gate) would each step: refused."""
    from agentrl.errors import ConfigError

    base = ["task=train", "model=tiny-random", f"distributed={engine}"]
    with pytest.raises(ConfigError, match=r"^algo.max_batch_tokens=512: DeepSpeed"):
        compose_config([*base, "algo=msgrpo", "algo.max_batch_tokens=512"])
    with pytest.raises(ConfigError, match=r"^algo.ppo_epochs=2: DeepSpeed"):
        compose_config([*base, "algo=poad", "model.lora.r=4", "algo.ppo_epochs=2"])
    compose_config([*base, "algo=poad", "model.lora.r=4"])
    compose_config(
        ["task=train", "model=tiny-random", "distributed=fsdp2", "algo=msgrpo", "algo.max_batch_tokens=512"]
    )


@pytest.mark.parametrize("engine", ["zero2", "zero3"])
def test_model_only_checkpoints_under_deepspeed_are_refused_before_launch(engine):
    """N6: transformers resumes a DeepSpeed run only from the engine's own checkpoint (`global_step*/`,
    which holds the optimizer: "Can't find a valid checkpoint" otherwise), so a run whose checkpoints
    would be model-only (`algo.save_optimizer=false`) could never resume: refused before it starts."""
    from agentrl.errors import ConfigError

    base = ["task=train", "model=tiny-random", "algo=msgrpo", "algo.save_optimizer=false"]
    with pytest.raises(ConfigError, match=r"^algo.save_optimizer=false: DeepSpeed"):
        compose_config([*base, f"distributed={engine}"])
    compose_config([*base, "distributed=ddp"])  # not DeepSpeed: not refused


def test_an_empty_iteration_under_deepspeed_skips_the_optimizer_step(monkeypatch):
    """B1: no row anywhere (no informative group): DeepSpeed steps inside the last backward, before the
    pre-optimizer-step hook that drops the gradients could act. The torch optimizer inside its
    wrappers (accelerate's, ZeRO's) skips that step: Adam's step count and moments stay as they were
    (a learning rate of 0 kept the weights but moved both); an iteration with rows steps as usual."""
    from types import SimpleNamespace

    from trl import GRPOTrainer

    from agentrl.trainers.grpo_trainer import MultiStepTrainer

    param = torch.nn.Parameter(torch.ones(2))
    adam = torch.optim.AdamW([param], lr=1e-3)
    param.grad = torch.ones(2)
    adam.step()  # an earlier iteration: non-zero moments
    # ZeRO's optimizer around Adam, and accelerate's DeepSpeedOptimizerWrapper around it
    zero = SimpleNamespace(optimizer=adam, step=lambda: adam.step(), param_groups=adam.param_groups)
    wrapper = SimpleNamespace(optimizer=zero, param_groups=adam.param_groups)

    def engine_backward(self, *args, **kwargs):  # the engine steps inside the last backward
        param.grad = torch.zeros(2)
        zero.step()

    monkeypatch.setattr(GRPOTrainer, "training_step", engine_backward)
    trainer = object.__new__(MultiStepTrainer)
    trainer.is_deepspeed_enabled, trainer.optimizer, trainer.max_batch_tokens = True, wrapper, None
    trainer._prepare_inputs = lambda inputs: inputs
    state = adam.state[param]
    before = (float(state["step"]), state["exp_avg"].clone(), param.detach().clone())
    trainer._empty_iteration = True
    trainer.training_step(torch.nn.Linear(1, 1), {"completion_ids": None})
    assert float(state["step"]) == before[0] and torch.equal(state["exp_avg"], before[1])
    assert torch.equal(param.detach(), before[2]) and "step" not in vars(adam)  # Adam's own step is back
    trainer._empty_iteration = False
    trainer.training_step(torch.nn.Linear(1, 1), {"completion_ids": None})
    assert float(state["step"]) == before[0] + 1


#: what `accelerate launch --config_file <trl>/accelerate_configs/fsdp2.yaml` sets (mixed precision off:
#: the CPU run is fp32)
FSDP2_ENV = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
    "FSDP_OFFLOAD_PARAMS": "false",
    "ACCELERATE_MIXED_PRECISION": "no",
}
FSDP2_RUN = [
    "distributed=fsdp2",
    "distributed.num_processes=2",
    "model=tiny-random",
    "env=frozenlake",
    "algo.checkpoint_every=1",
    "algo.groups_per_iteration=1",
    "algo.group_size=2",
    "eval.episodes=2",
    "algo.torch_threads=1",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=4",
    "agent.invalid_rule=random",
]


def _fsdp2_train(run: Path, *overrides: str, dump: Path | None = None, processes: int = 2) -> None:
    """A new run in `run` with `overrides`, or with `dump` a resume of it (its saved overrides hold
    the rest) that writes the optimizer state it loaded to `dump`."""
    env = {**gloo_env(), **FSDP2_ENV, **({"DUMP_LOADED_OPTIMIZER": str(dump)} if dump else {})}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    where = [f"resume={run}"] if dump else [*FSDP2_RUN, f"hydra.run.dir={run}"]
    cmd = [*launch, str(WORKERS / "fsdp_cpu.py"), "train", *where, *overrides]
    done = subprocess.run(cmd, env=env, cwd=ROOT, timeout=900, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.multiprocess  # two runs of two or three processes each (~1 min per case on 2 CPU cores)
@pytest.mark.parametrize(
    ("overrides", "processes"),
    [
        (["algo=msgrpo"], 2),
        (["algo=poad", "model.lora.r=4"], 2),
        (["algo=msgrpo", "algo.max_batch_tokens=40"], 2),
        (["algo=msgrpo"], 3),
    ],
    ids=["msgrpo", "poad-lora", "max_batch_tokens", "msgrpo-3-processes"],
)
def test_fsdp2_trains_checkpoints_and_resumes_on_cpu_processes(tmp_path, overrides, processes):
    """`agentrl train distributed=fsdp2` as gloo processes through accelerate's FSDP2 path
    (tests/workers/fsdp_cpu.py says what differs from `accelerate launch` on GPUs): the eval before, 2
    iterations with a metrics row each, a checkpoint with FSDP's files, resume with Adam's moments
    restored exactly, the eval after."""
    from agentrl.trainers.actor_critic import HEAD_OPTIMIZER_FILE
    from tests.helpers import logged_iterations

    run = tmp_path / "run"
    _fsdp2_train(run, *overrides, "algo.iterations=2", processes=processes)
    assert logged_iterations(run) == [1, 2]
    checkpoint = run / "checkpoint-2"  # the last iteration's: the resume continues from it
    files = {p.name for p in checkpoint.iterdir()}
    assert {"optimizer.bin", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"} <= files
    assert (run / "eval_before.json").is_file() and (run / "eval.json").is_file()
    if "algo=poad" in overrides:
        assert {"value_head.pt", HEAD_OPTIMIZER_FILE} <= files
    dump = tmp_path / "loaded.pt"
    _fsdp2_train(run, "algo.iterations=3", dump=dump, processes=processes)
    assert logged_iterations(run) == [1, 2, 3]
    saved = torch.load(checkpoint / "optimizer.bin", weights_only=False)["state"]
    loaded = torch.load(dump, weights_only=False)["optimizer"]["state"]
    assert saved.keys() == loaded.keys() and saved
    for name, moments in saved.items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded[name][key], moments[key])
    assert any(float(m["exp_avg"].abs().sum()) > 0 for m in saved.values())


#: what `accelerate launch` derives from TRL's zero3.yaml (mixed precision off: the CPU run is fp32)
ZERO3_ENV = {
    "DS_ACCELERATOR": "cpu",
    "ACCELERATE_USE_DEEPSPEED": "true",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "none",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true",
    "ACCELERATE_MIXED_PRECISION": "no",
}


def _zero3_train(run: Path, *overrides: str, dump: Path | None = None) -> None:
    """`_fsdp2_train` under DeepSpeed ZeRO-3 (tests/workers/zero3_cpu.py)."""
    env = {**gloo_env(), **ZERO3_ENV, **({"DUMP_LOADED_OPTIMIZER": str(dump)} if dump else {})}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    common = [o.replace("fsdp2", "zero3") for o in FSDP2_RUN]
    where = [f"resume={run}"] if dump else [*common, f"hydra.run.dir={run}"]
    cmd = [*launch, str(WORKERS / "zero3_cpu.py"), "train", *where, *overrides]
    done = subprocess.run(cmd, env=env, cwd=ROOT, timeout=900, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.multiprocess  # two runs of two processes each; needs deepspeed (docs/distributed.md#status)
@pytest.mark.parametrize(
    "overrides", [["algo=msgrpo"], ["algo=poad", "model.lora.r=4"]], ids=["msgrpo", "poad-lora"]
)
def test_zero3_trains_checkpoints_and_resumes_on_two_cpu_processes(tmp_path, overrides):
    """Deliverable 2 under DeepSpeed ZeRO-3 with its CPU accelerator: the eval before, 2 iterations, a
    checkpoint with DeepSpeed's partitions (`global_step2/`), resume with each process's Adam moments
    restored exactly, the eval after."""
    pytest.importorskip("deepspeed")
    from tests.helpers import logged_iterations

    run = tmp_path / "run"
    _zero3_train(run, *overrides, "algo.iterations=2")
    checkpoint = run / "checkpoint-2"  # the last iteration's: the resume continues from it
    assert (run / "eval_before.json").is_file() and (run / "eval.json").is_file()
    dump = tmp_path / "loaded"
    _zero3_train(run, "algo.iterations=3", dump=dump)
    assert logged_iterations(run) == [1, 2, 3]
    for rank in (0, 1):
        file = checkpoint / "global_step2" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        saved = torch.load(file, weights_only=False)["optimizer_state_dict"]["optimizer_state_dict"]["state"]
        loaded = torch.load(f"{dump}.{rank}", weights_only=False)["state"]
        assert saved.keys() == loaded.keys() and saved
        for key, moments in saved.items():
            for name in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(loaded[key][name], moments[name])


@pytest.mark.multiprocess  # needs deepspeed; two processes, ~1 min
def test_an_empty_iteration_moves_no_weight_under_deepspeed(tmp_path):
    """B1 with DeepSpeed itself (ZeRO-2, CPU accelerator): after an iteration with rows, an iteration
    with none leaves every weight, and Adam's step count and moments, as they were (a plain step moved
    the weights' checksum 777.28 -> 1042.26; a learning rate of 0 kept them but stepped Adam)."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "sums.json"
    env = {**gloo_env(), **ZERO3_ENV, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*launch, str(WORKERS / "deepspeed_empty.py"), str(out)],
        env=env,
        cwd=ROOT,
        timeout=600,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["deepspeed"] and result["sums"][1] == result["sums"][0]
    assert result["adam"][1] == result["adam"][0] and result["adam"][0][0] >= 1


def _qwen_3b_on_meta() -> Any:
    """Qwen2.5-3B's shape with no memory behind it (meta tensors): its parameters count, nothing else."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _gpu_with(monkeypatch: Any, total: int, allocated: list[int]) -> None:
    """A mocked CUDA device of `total` bytes with `allocated[0]` bytes in use (torch caches none)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - allocated[0], total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: allocated[0])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated[0])


def test_the_auto_budgets_leave_room_for_the_training_state_still_to_come(monkeypatch):
    """N4: the trainer plans its passes' memory when it is built, before the first backward and optimizer
    step, so the gradients and AdamW moments (+34.5 GiB at 3B) are not allocated yet. A 3B full fine-tune
    with a KL term (fp32 weights and reference loaded) on an 80 GiB GPU: the planned peak, with those
    to come and activations at the ~5.6 MB a padded token measured on an H200, fits; planned from the
    free memory alone it would not."""
    from agentrl.trainers import settings

    model = _qwen_3b_on_meta()
    weights = sum(p.numel() * 4 for p in model.parameters())
    total, allocated = 80 * 2**30, [2 * weights]  # the policy's fp32 weights and TRL's reference copy
    _gpu_with(monkeypatch, total, allocated)
    pending = settings.pending_training_state_bytes(model)
    assert pending == 3 * weights  # a gradient and two moments a parameter: 34.5 GiB

    def planned_peak(pending: int) -> float:
        positions = settings.resolve_max_batch_tokens("auto", model, "cuda", pending=pending)
        tokens = settings.auto_prompt_budget(model, "cuda", kernel=False, pending=pending)
        logits = positions * settings.LOGIT_COPIES * 4 * model.config.vocab_size
        return allocated[0] + 3 * weights + tokens * 5.6e6 + logits

    assert planned_peak(pending) <= total
    assert planned_peak(0) > total  # the budgets as they were: the run would run out of memory


def test_the_trainer_plans_again_once_a_rollout_engine_holds_memory(monkeypatch):
    """A colocated vLLM engine (or a bf16 copy) is built after the trainer: the budgets are planned again
    once it exists, from what it left."""
    from types import SimpleNamespace

    from agentrl.trainers.grpo_trainer import MultiStepTrainer

    model = _qwen_3b_on_meta()
    weights = sum(p.numel() * 4 for p in model.parameters())
    allocated = [weights]
    _gpu_with(monkeypatch, 140 * 2**30, allocated)
    trainer = object.__new__(MultiStepTrainer)
    trainer.model, trainer.optimizer = model, None
    trainer.args = SimpleNamespace(device=torch.device("cuda"), gradient_checkpointing=False)
    trainer.accelerator = SimpleNamespace(num_processes=1)
    trainer.max_batch_tokens_setting, trainer.memory_share = "auto", 1.0
    trainer.plan_memory()
    before = (trainer.max_batch_tokens, trainer.padded_budget)
    allocated[0] += 20 * 2**30  # the engine's share of the GPU
    trainer.plan_memory()
    assert trainer.max_batch_tokens < before[0] and trainer.padded_budget < before[1]
    assert trainer.prompt_budget is None  # CUDA: TRL's pass per row, not the shared-prefix kernel


def test_hub_kernels_stay_off_unless_asked(tmp_path):
    """transformers turns Hub kernels on whenever the `kernels` package is installed and downloads them
    the first time a model on a GPU runs train()/eval(); on a machine without internet that crashed
    every GPU run. The policy and TRL's reference model load with `use_kernels=model.hub_kernels`."""
    from agentrl.config import typed
    from agentrl.models import load_model
    from agentrl.trainers.settings import grpo_config

    cfg = _cfg()
    assert cfg.model.hub_kernels is False
    model, _ = load_model(typed(cfg.model), device="cpu", for_training=True)
    assert model.use_kernels is False  # transformers' own default here is True
    kl = typed(_cfg("algo.beta=0.04").algo)  # a KL term: TRL loads a reference model (full fine-tuning)
    assert grpo_config(kl, tmp_path, "cpu", 0).model_init_kwargs["use_kernels"] is False
    on = _cfg("model.hub_kernels=true")
    assert grpo_config(kl, tmp_path, "cpu", 0, hub_kernels=on.model.hub_kernels).model_init_kwargs[
        "use_kernels"
    ]
    assert grpo_config(typed(cfg.algo), tmp_path, "cpu", 0).model_init_kwargs is None  # no reference model


@pytest.mark.skipif(embedded_gguf_missing(), reason=NEEDS_GGUF)
def test_the_embedded_models_conversion_loads_without_hub_kernels(tmp_path, monkeypatch):
    """transformers 5.25 defaults to `use_kernels=True` and raises "Kernels are not available" where the
    `kernels` package is missing (a GPU image with only the packages agentrl needs): the GGUF conversion
    must ask for none, like every other load."""
    import transformers

    from agentrl import models

    seen: dict = {}

    class Stop(Exception):
        pass

    def load(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)
    with pytest.raises(Stop):
        models.ensure_smollm2(str(tmp_path))
    assert seen["use_kernels"] is False
