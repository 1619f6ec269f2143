"""Several training processes (agentrl/distributed.py, the rank-aware engine): run on the CPU with gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import gloo_env

from agentrl import distributed as dist
from agentrl.config import compose_config, typed
from agentrl.errors import ConfigError
from agentrl.trainers.iteration import global_group, merge_process_metrics
from tests.helpers import logged_iterations

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "ddp_update.py"


def test_processes_play_disjoint_groups_that_one_process_would_play():
    groups, world = 3, 2
    for round_ in range(3):
        two = [global_group(round_, g, groups, rank, world) for rank in range(world) for g in range(groups)]
        one = [global_group(round_, g, groups * world) for g in range(groups * world)]
        assert two == one  # the same groups, so the same env seeds (training_seed hashes the index)
        assert len(set(two)) == len(two)


def test_process_metrics_add_counts_take_slowest_times_and_weight_rates():
    rows = [
        {"train/episodes": 8, "train/success_rate": 0.5, "iteration_s": 3.0, "groups": 2},
        {"train/episodes": 24, "train/success_rate": 0.0, "iteration_s": 5.0, "groups": 6},
    ]
    merged = merge_process_metrics(rows)
    assert merged == {"train/episodes": 32, "train/success_rate": 0.125, "iteration_s": 5.0, "groups": 8}
    assert merge_process_metrics(rows[:1]) is rows[0]


def test_without_a_process_group_the_collectives_are_the_identity():
    assert (dist.rank(), dist.world_size(), dist.is_main()) == (0, 1, True)
    assert dist.all_sum([1.0, 2.5]) == [1.0, 2.5]
    assert dist.any_true(False) is False and dist.any_true(True) is True
    assert dist.gather({"a": 1}) == [{"a": 1}]


def _update(out: Path, processes: int, *args: str, env: dict[str, str] | None = None) -> dict:
    """tests/workers/ddp_update.py as one process or `processes` gloo processes; its JSON."""
    cmd = [sys.executable, str(WORKER), str(out), *args]
    if processes > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd = [*launch, f"--nproc_per_node={processes}", *cmd[1:]]
    subprocess.run(cmd, env={**gloo_env(), **(env or {})}, check=True, timeout=600, cwd=ROOT)
    result = json.loads(out.read_text())
    assert result["world"] == processes
    return result


def _same_update(many: dict, one: dict, iterations: int) -> None:
    """`many` processes trained every iteration, the first with the loss and gradient of one process on
    all the rows, and ended with its weights."""
    assert many["optimizer_steps"] == iterations == one["optimizer_steps"]
    assert many["iterations_logged"] == iterations == one["iterations_logged"]
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert many["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert many["weights"] == pytest.approx(one["weights"], rel=1e-7)  # the same updates


#: the updates' token budget (tests/workers/ddp_update.py) and iterations
BUDGET, ITERATIONS = "24", 2


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference of the many-process updates: one process, all eight rows."""
    return _update(tmp_path_factory.mktemp("one") / "one.json", 1, BUDGET, str(ITERATIONS))


@pytest.mark.multiprocess
def test_two_processes_give_the_loss_and_gradient_of_one_process_with_all_rows(tmp_path, one_process):
    """5 + 3 rows on two processes == 8 rows on one: the loss is a mean over every process's tokens
    (num_items_in_batch summed over processes) and DDP averages the gradients; micro-batches of
    different sizes (TRL gathers per-row statistics) and, with a token budget, different numbers of
    passes per micro-batch (padded with blank passes) keep the processes in step."""
    _same_update(_update(tmp_path / "two.json", 2, BUDGET, str(ITERATIONS)), one_process, ITERATIONS)


@pytest.mark.multiprocess
def test_three_processes_train_every_iteration_like_one_process(tmp_path, one_process):
    """TRL's sampler takes world_size x steps_per_generation placeholder rows per chunk and drops a chunk
    it cannot fill: with too few rows the epoch of three or more processes was empty and the run ended
    without a step. Three processes train both iterations, the first with one process's loss."""
    _same_update(_update(tmp_path / "three.json", 3, BUDGET, str(ITERATIONS)), one_process, ITERATIONS)


@pytest.mark.multiprocess
def test_four_processes_train_every_iteration_like_one_process(tmp_path, one_process):
    _same_update(_update(tmp_path / "four.json", 4, BUDGET, str(ITERATIONS)), one_process, ITERATIONS)


@pytest.mark.multiprocess
def test_three_fsdp2_processes_train_every_iteration_like_one_process(tmp_path, one_process):
    """FSDP2 (accelerate's path with its plugin kept on the CPU: tests/workers/fsdp_cpu.py) on three
    processes: both iterations train, with the loss, gradient and weights of one process."""
    from tests.test_gpu_defects import FSDP2_ENV

    many = _update(tmp_path / "fsdp.json", 3, BUDGET, str(ITERATIONS), env=FSDP2_ENV)
    assert many["fsdp"]
    _same_update(many, one_process, ITERATIONS)


def test_the_placeholder_dataset_gives_every_world_size_its_iterations():
    """TRL's own sampler over the placeholder rows yields each process one batch of
    steps_per_generation micro-batches per iteration, at every world size and accumulation."""
    from trl.trainer.utils import RepeatSampler

    from agentrl.trainers.grpo_trainer import placeholder_rows

    for world in range(1, 9):
        for parts in (1, 2, 3, 4):
            generation = 2 * world * parts  # what GRPOConfig sets from per_device 2 and num_generations 2
            args = SimpleNamespace(
                steps_per_generation=parts, generation_batch_size=generation, num_generations=2
            )
            rows = list(range(placeholder_rows(args)))
            sampler = RepeatSampler(rows, mini_repeat_count=2, batch_size=generation // 2, repeat_count=parts)
            # the Trainer's dataloader takes batches of 2 x parts per process: whole iterations
            iterations = len(list(sampler)) // (2 * parts * world) // parts
            assert iterations >= 1, (world, parts)


@pytest.mark.multiprocess  # eight processes start (~2 min); the update itself is checked above
def test_agentrl_train_distributed_ddp_runs_three_processes_and_resumes(tmp_path):
    run = tmp_path / "run"
    common = [
        "env=frozenlake",
        "model=tiny-random",
        "algo.groups_per_iteration=2",
        "algo.group_size=2",
        "eval.episodes=3",
        "algo.checkpoint_every=1",
        "algo.torch_threads=1",
    ]
    cli = [sys.executable, "-m", "agentrl", "train"]
    first = [*cli, *common, "distributed=ddp", "distributed.num_processes=3", "algo.iterations=2"]
    done = subprocess.run(
        [*first, f"hydra.run.dir={run}"],
        env=gloo_env(),
        cwd=ROOT,
        timeout=600,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert logged_iterations(run) == [1, 2]  # one row per iteration, from process 0 only
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert row["groups"] == 6 and row["train/episodes"] == 12  # every process's groups
    checkpoint = run / "checkpoint-1"
    ranks = {f"rng_state_{k}.pth" for k in range(3)}
    assert ranks <= {p.name for p in checkpoint.iterdir()}
    assert set(json.loads((checkpoint / "manifest.json").read_text())["files"]) >= ranks
    assert json.loads((run / "eval.json").read_text())["episodes"] == 3  # the shards put back together
    assert (run / "final" / "model.safetensors").is_file()
    assert not list(tmp_path.glob("**/.tmp-*"))
    # the saved overrides say distributed=ddp: resuming relaunches three processes again
    done = subprocess.run(
        [*cli, f"resume={run}", "algo.iterations=3"],
        env=gloo_env(),
        cwd=ROOT,
        timeout=600,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert logged_iterations(run) == [1, 2, 3]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "complete" and status["parts"] == 2  # the run's two parts: first, resume


def test_launcher_commands():
    ddp = typed(
        compose_config(
            ["task=train", "algo=msgrpo", "distributed=ddp", "distributed.num_processes=4"]
        ).distributed
    )
    cmd = dist.launcher_command(ddp, ["train", "env=snake"], cuda=False)
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--nproc_per_node=4"]
    assert "--standalone" in cmd and cmd[-4:] == ["-m", "agentrl", "train", "env=snake"]
    cmd = dist.launcher_command(ddp, ["train"], cuda=True, mixed_precision="bf16")
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"]
    config = Path(cmd[cmd.index("--config_file") + 1])
    assert config.name == "multi_gpu.yaml" and config.is_file()
    assert cmd[cmd.index("--num_processes") + 1] == "4" and cmd[cmd.index("--mixed_precision") + 1] == "bf16"
    for name in ("zero2", "zero3", "fsdp2"):
        assert dist.accelerate_config(name).is_file()
        sharded = typed(compose_config(["task=train", "algo=msgrpo", f"distributed={name}"]).distributed)
        with pytest.raises(ConfigError, match="needs CUDA GPUs"):
            dist.launcher_command(sharded, ["train"], cuda=False)
    nameless = typed(compose_config(["task=train", "algo=msgrpo", "distributed=ddp"]).distributed)
    with pytest.raises(ConfigError, match="num_processes"):
        dist.launcher_command(nameless, ["train"], cuda=False)


def test_bad_distributed_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="valid choices: ddp, fsdp2, none, zero2, zero3"):
        compose_config(["distributed=deepspeed"])
    with pytest.raises(ConfigError, match="num_processes"):
        compose_config(["distributed.num_processes=2"])
    with pytest.raises(ConfigError, match="main_process_ip"):
        compose_config(["distributed=ddp", "distributed.num_machines=2"])


def test_a_sweep_refuses_distributed_jobs(tmp_path):
    from agentrl.runs.launch import launch

    with pytest.raises(ConfigError, match="agentrl train"):
        launch(
            "train",
            [
                "algo=msgrpo",
                "model=tiny-random",
                "distributed=ddp",
                "distributed.num_processes=2",
                f"hydra.sweep.dir={tmp_path}",
            ],
            multirun=True,
        )


def test_settings_a_sharded_engine_cannot_run_are_refused_before_launch():
    base = ["task=train", "model=tiny-random"]
    with pytest.raises(ConfigError, match=r"model.device_map=auto: cannot be used with distributed=ddp"):
        compose_config([*base, "algo=msgrpo", "distributed=ddp", "model.device_map=auto"])
    with pytest.raises(ConfigError, match=r"critic's trunk, which distributed=zero3 cannot shard"):
        compose_config([*base, "algo=poad", "distributed=zero3"])
    with pytest.raises(ConfigError, match=r"critic's trunk, which distributed=fsdp2 cannot shard"):
        compose_config([*base, "algo=rlft", "algo.advantage=gae", "distributed=fsdp2"])
    with pytest.raises(ConfigError, match="algo=twosome"):
        compose_config([*base, "algo=twosome", "distributed=fsdp2", "model.lora.r=8"])
    compose_config([*base, "algo=poad", "distributed=zero3", "model.lora.r=8"])  # LoRA: the trunk is the base
    compose_config([*base, "algo=poad", "distributed=ddp"])
