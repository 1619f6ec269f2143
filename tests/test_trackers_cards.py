"""`report_to` (agentrl/runs/trackers.py) and model cards with `agentrl push` (agentrl/runs/card.py).

One tiny training run reports to MLflow (a file store in the run directory) and W&B (offline); its
trackers, its cards and a push to a mocked Hub are checked from it. No Hub is reachable from the test
machines: `HfApi` is replaced by a recorder."""

from __future__ import annotations

import glob
import json
import struct
import sys
import types
from pathlib import Path

import mlflow  # the dev extra installs mlflow-skinny and wandb: no skip
import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.runs import trackers
from agentrl.runs.runlog import MetricsLog, checkpoint_problem

TINY = [
    "model=tiny-random",
    "agent.prefill='<action>'",
    "agent.sampling.max_new_tokens=4",
    "agent.invalid_rule=random",
    "algo.group_size=2",
    "algo.groups_per_iteration=2",
    "algo.gradient_accumulation_steps=1",
    "algo.periodic_eval_episodes=1",
    "algo.iterations=2",
    "algo.eval_every=1",
    "algo.checkpoint_every=1",
    "algo.keep_checkpoints=2",
    "eval.episodes=2",
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-iteration run reporting to MLflow and W&B, with checkpoints and final/."""
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path_factory.mktemp("trained") / "run"
    args = ["train", *TINY, "report_to=[mlflow,wandb]", f"hydra.run.dir={run}"]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    mp.undo()
    assert result.exit_code == 0, result.output
    return run


def mlflow_run(run_dir: Path):
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    client = mlflow.MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    return client, client.get_run(run_id)


def wandb_records(run_dir: Path) -> list:
    """The records of the run's offline W&B file (run-<id>.wandb: a LevelDB-style log of protobufs)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, parts, records = 32768, 7, [], []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            continue
        parts.append(data[pos : pos + length])
        pos += length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            records.append(record)
            parts = []
    return records


# ---- trackers -----------------------------------------------------------------------------------------
def test_mlflow_has_the_runs_config_and_every_iterations_metrics(trained):
    client, run = mlflow_run(trained)
    assert run.info.run_name == trained.name and run.info.status == "FINISHED"
    params = run.data.params
    assert params["env.name"] == "frozenlake" and params["algo.iterations"] == "2"
    assert params["model.name"] == "tiny-random" and params["report_to"] == '["mlflow", "wandb"]'

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    rows = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    for key in (
        "train/success_rate",
        "train/invalid_rate",
        "train/untagged_rate",
        "loss",
        "eval/success_rate",
    ):
        assert history(key) == [(r["iteration"], r[key]) for r in rows if key in r], key
    saved = json.loads((trained / "eval.json").read_text())
    assert history("before/invalid_rate") == [(0, saved["before"]["invalid_rate"])]
    assert history("final/untagged_rate") == [(2, saved["untagged_rate"])]
    assert not (trained / "tb").exists()  # report_to without tensorboard writes no tb/


def test_wandb_offline_has_the_runs_config_and_every_iterations_metrics(trained):
    records = wandb_records(trained)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == trained.name and run.run_group == "train_frozenlake"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["env"]["name"] == "frozenlake" and config["algo"]["iterations"] == 2
    history = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = record.history.item  # a key with a / is stored as a nested key of one part
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    rows = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    logged = [h for h in history if "train/success_rate" in h]
    assert [(h["iteration"], h["train/invalid_rate"], h["loss"]) for h in logged] == [
        (r["iteration"], r["train/invalid_rate"], r["loss"]) for r in rows
    ]
    assert any("final/success_rate" in h and h["iteration"] == 2 for h in history)


def test_a_tracker_not_installed_is_refused_before_a_run_directory(tmp_path, monkeypatch):
    real = trackers.checks.installed
    monkeypatch.setattr(trackers.checks, "installed", lambda module: module != "wandb" and real(module))
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", *TINY, "report_to=wandb", f"hydra.run.dir={run}"])
    assert result.exit_code == 2 and not run.exists()
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        "error: report_to=wandb needs wandb, which is not installed: pip install 'agentrl[trackers]' "
        "(or pip install wandb)"
    ]
    result = CliRunner().invoke(app, ["train", *TINY, "report_to=neptune", f"hydra.run.dir={run}"])
    assert result.exit_code == 2 and not run.exists()
    assert "report_to=neptune: unknown tracker; valid choices: tensorboard, wandb, mlflow, trackio, none" in (
        result.output
    )
    result = CliRunner().invoke(app, ["train", *TINY, "report_to=wandb", "--dry-run"])
    assert result.exit_code == 2 and "report_to=wandb needs wandb" in result.output


def config(report_to, name: str = "train_frozenlake"):
    return OmegaConf.create({"task": "train", "name": name, "report_to": report_to, "env": {"name": "x"}})


def test_report_to_none_writes_metrics_jsonl_only_and_default_writes_tensorboard(tmp_path):
    for report_to, tb in (("none", False), ("tensorboard", True)):
        run = tmp_path / report_to
        with trackers.tracking(config(report_to), run) as tracked:
            assert tracked is not None and tracked.opened == {}
            with MetricsLog(run) as log:
                log.log(1, {"loss": 0.5})
        assert (run / "metrics.jsonl").is_file() and (run / "tb").exists() == tb
        assert not (run / "trackers.json").exists()


def test_a_resumed_run_continues_its_tracker_runs(tmp_path):
    run = tmp_path / "run"
    with trackers.tracking(config(["mlflow", "wandb"]), run) as tracked:
        with MetricsLog(run) as log:
            log.log(1, {"loss": 1.0})
    first = json.loads((run / "trackers.json").read_text())
    with trackers.tracking(config(["mlflow", "wandb"]), run, resume=True) as tracked:
        with MetricsLog(run, resume=True) as log:
            log.log(1, {"loss": 9.0})  # logged before the kill: skipped
            log.log(2, {"loss": 0.5})
    assert json.loads((run / "trackers.json").read_text()) == first
    assert tracked.last_step == 2
    client, saved = mlflow_run(run)
    assert [(m.step, m.value) for m in client.get_metric_history(saved.info.run_id, "loss")] == [
        (1, 1.0),
        (2, 0.5),
    ]


def test_trackio_gets_the_run_and_its_rows(tmp_path, monkeypatch):
    calls: list[tuple] = []
    fake = types.ModuleType("trackio")
    fake.init = lambda **kwargs: calls.append(("init", kwargs))
    fake.log = lambda metrics, step=None: calls.append(("log", metrics, step))
    fake.finish = lambda: calls.append(("finish",))
    monkeypatch.setitem(sys.modules, "trackio", fake)
    run = tmp_path / "run"
    with trackers.tracking(config("trackio"), run):
        with MetricsLog(run) as log:
            log.log(3, {"train/success_rate": 0.25, "note": "text", "flag": True})
    init = calls[0]
    assert init[0] == "init" and init[1]["name"] == "run" and init[1]["project"] == "agentrl"
    assert init[1]["config"]["report_to"] == "trackio" and init[1]["resume"] == "allow"
    assert calls[1:] == [
        ("log", {"train/success_rate": 0.25, "time_s": calls[1][1]["time_s"]}, 3),
        ("finish",),
    ]


# ---- model cards and push ----------------------------------------------------------------------------
def test_final_and_checkpoints_carry_a_hub_model_card(trained):
    from huggingface_hub import ModelCard

    saved = json.loads((trained / "eval.json").read_text())
    card = ModelCard.load(trained / "final" / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-generation"
    assert {"trl", "agentrl", "reinforcement-learning", "msgrpo", "frozenlake"} <= set(data["tags"])
    assert data["license"] == "apache-2.0"  # the tiny model: random weights with SmolLM2's tokenizer
    text = card.text
    for needle in (
        "MS-GRPO",
        "`env=frozenlake` (map=random, size=4",
        "| before training | ",
        "| after training | ",
        "invalid | untagged",
        f"{saved['invalid_rate']:.3f} | {saved['untagged_rate']:.3f}",
        "training time: ",
        "machine: ",
        "agentrl train algo=msgrpo model=tiny-random",
        "report_to=[mlflow,wandb]",
        "## Config",
        "iterations: 2",
        "Answer with one action as <action>NAME</action>.",
    ):
        assert needle in text, needle
    checkpoints = sorted(p for p in trained.glob("checkpoint-*") if p.is_dir())
    assert checkpoints
    for checkpoint in checkpoints:
        # the card replaces TRL's own, and the checkpoint still checks out for a resume
        assert checkpoint_problem(checkpoint) is None
        assert "README.md" in json.loads((checkpoint / "manifest.json").read_text())["files"]
        text = (checkpoint / "README.md").read_text()
        assert f"checkpoint {checkpoint.name} of the run" in text and "| periodic eval at iteration" in text
        assert "| after training |" not in text


def test_push_uploads_final_with_its_card_to_a_mocked_hub(trained, monkeypatch, tmp_path):
    import huggingface_hub

    calls: list[tuple] = []

    class FakeApi:
        def create_repo(self, **kwargs):
            calls.append(("create_repo", kwargs))
            return f"https://huggingface.co/{kwargs['repo_id']}"

        def upload_folder(self, **kwargs):
            folder = Path(kwargs["folder_path"])
            calls.append(("upload_folder", kwargs, sorted(p.name for p in folder.iterdir())))

    (trained / "final" / "README.md").unlink()  # push writes a missing card
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    result = CliRunner().invoke(app, ["push", str(trained), "me/frozenlake-tiny", "--private"])
    assert result.exit_code == 0, result.output
    assert "https://huggingface.co/me/frozenlake-tiny" in result.output
    create, upload = calls
    assert create[1] == {
        "repo_id": "me/frozenlake-tiny",
        "repo_type": "model",
        "private": True,
        "exist_ok": True,
    }
    assert Path(upload[1]["folder_path"]) == trained / "final" and "README.md" in upload[2]
    assert "model.safetensors" in upload[2] and upload[1]["repo_id"] == "me/frozenlake-tiny"
    assert (
        "machine: not recorded (this card was written after training"
        in (trained / "final" / "README.md").read_text()
    )

    class Refused(FakeApi):
        def create_repo(self, **kwargs):
            raise OSError("401 Client Error: Unauthorized\n(no token)")

    monkeypatch.setattr(huggingface_hub, "HfApi", Refused)
    result = CliRunner().invoke(app, ["push", str(trained), "me/x"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: push to me/x failed: 401 Client Error: Unauthorized (no token)"
    result = CliRunner().invoke(app, ["push", str(tmp_path), "me/x"])
    assert result.exit_code == 2 and "not an agentrl run directory" in result.output


def test_base_model_and_license_for_the_card():
    from agentrl.runs.card import base_model, license_of

    def cfg(source: str):
        return OmegaConf.create({"model": {"name_or_path": source}})

    assert base_model(cfg("builtin:smollm2-135m")) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert license_of("HuggingFaceTB/SmolLM2-135M-Instruct", cfg("builtin:smollm2-135m")) == {
        "license": "apache-2.0"
    }
    qwen = license_of("Qwen/Qwen2.5-3B-Instruct", cfg("Qwen/Qwen2.5-3B-Instruct"))
    assert qwen["license"] == "other" and qwen["license_name"] == "qwen-research"
    assert license_of("someone/model", cfg("someone/model")) == {"license": "unknown"}


def test_a_local_base_models_own_card_gives_its_license(tmp_path):
    from agentrl.runs.card import base_model, license_of

    (tmp_path / "README.md").write_text("---\nlicense: mit\n---\n# a model\n")
    cfg = OmegaConf.create({"model": {"name_or_path": str(tmp_path)}})
    assert base_model(cfg) is None and license_of(None, cfg) == {"license": "mit"}
