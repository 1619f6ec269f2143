"""Several training processes (agentrl/distributed.py, the rank-aware engine): run on the CPU with gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl import distributed as dist
from agentrl.config import compose_config, typed
from agentrl.errors import ConfigError
from agentrl.trainers.iteration import global_group, merge_process_metrics
from tests.helpers import logged_iterations

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "ddp_update.py"


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_NO_PROGRESS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", dist.LOCKED_RUN_DIR):
        env.pop(key, None)
    return env


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


@pytest.mark.parametrize("budget", [24])
def test_two_processes_give_the_loss_and_gradient_of_one_process_with_all_rows(tmp_path, budget):
    """5 + 3 rows on two processes == 8 rows on one: the loss is a mean over every process's tokens
    (num_items_in_batch summed over processes) and DDP averages the gradients; micro-batches of
    different sizes (TRL gathers per-row statistics) and, with a token budget, different numbers of
    passes per micro-batch (padded with blank passes) keep the processes in step."""
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    extra = [str(budget)] if budget else []
    subprocess.run(
        [sys.executable, str(WORKER), str(one), *extra], env=_env(), check=True, timeout=300, cwd=ROOT
    )
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    subprocess.run([*launch, str(WORKER), str(two), *extra], env=_env(), check=True, timeout=300, cwd=ROOT)
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert (a["world"], b["world"]) == (1, 2)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert b["weights"] == pytest.approx(a["weights"], rel=1e-7)  # the same update


@pytest.mark.slow  # six processes start (~2 min); the update itself is checked above
def test_agentrl_train_distributed_ddp_runs_two_processes_and_resumes(tmp_path):
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
    first = [*cli, *common, "distributed=ddp", "distributed.num_processes=2", "algo.iterations=2"]
    done = subprocess.run(
        [*first, f"hydra.run.dir={run}"], env=_env(), cwd=ROOT, timeout=600, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert logged_iterations(run) == [1, 2]  # one row per iteration, from process 0 only
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert row["groups"] == 4 and row["train/episodes"] == 8  # both processes' groups
    checkpoint = run / "checkpoint-1"
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in checkpoint.iterdir()}
    assert set(json.loads((checkpoint / "manifest.json").read_text())["files"]) >= {"rng_state_1.pth"}
    assert json.loads((run / "eval.json").read_text())["episodes"] == 3  # the shards put back together
    assert (run / "final" / "model.safetensors").is_file()
    assert not list(tmp_path.glob("**/.tmp-*"))
    # the saved overrides say distributed=ddp: resuming relaunches two processes again
    done = subprocess.run(
        [*cli, f"resume={run}", "algo.iterations=3"],
        env=_env(),
        cwd=ROOT,
        timeout=600,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert logged_iterations(run) == [1, 2, 3]
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "complete" and status["parts"] == 2


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
