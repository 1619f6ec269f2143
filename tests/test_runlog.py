"""metrics.jsonl resume semantics, atomic directories, JSON, and checkpoint manifests."""

from __future__ import annotations

import json
import logging
import os
import zipfile

import pytest

from agentrl.runs.runlog import (
    MetricsLog,
    atomic_dir,
    checkpoint_problem,
    manifest_path,
    newest_valid_checkpoint,
    prune_checkpoints,
    write_json,
    write_manifest,
)


def test_metrics_log_appends_and_resumes_without_duplicates(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=False)
    for it in range(3):
        log.log(it, {"loss": 1.0 / (it + 1)})
    log.close()
    # a kill mid-write leaves a torn last line
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 3, "lo')
    log = MetricsLog(tmp_path, resume=True, tensorboard=False)
    assert log.last_step() == 2
    for it in range(1, 5):  # a resumed run re-logs 1..2 (skipped) and continues with 3, 4
        log.log(it, {"loss": 0.0})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[1]["loss"] == 0.5  # the original value, not the re-logged one
    assert all(rows[i]["time_s"] <= rows[i + 1]["time_s"] for i in range(4))


def test_a_resume_continues_the_training_clock_from_its_checkpoints_iteration(tmp_path, monkeypatch):
    """Killed at iteration 5 with checkpoint-3, the resumed run's clock (its time limit's and the rows'
    time_s) goes on from iteration 3's time: iterations redone after the kill count once."""
    from agentrl.runs import rundir
    from agentrl.trainers import callbacks

    rows = [{"iteration": i, "time_s": 10.0 * i} for i in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"iteration": 6, "ti'
    )
    assert rundir.metrics_time_at(tmp_path, 3) == 30.0
    assert rundir.metrics_time_at(tmp_path, 6) == 50.0  # the row a kill cut: the latest before it
    assert rundir.metrics_time_at(tmp_path, 0) == 0.0

    now = [1000.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: now[0])
    limit = callbacks.TimeLimit(60.0, used=rundir.metrics_time_at(tmp_path, 3))
    assert not limit.spent
    limit.on_train_begin(None, None, None)
    log = MetricsLog(tmp_path, resume=True, tensorboard=False)

    class Bar:
        def advance(self, *args, **kwargs):
            pass

    class State:
        global_step = 6

    class Control:
        should_training_stop = False

    writer = callbacks.MetricsWriter(log, Bar(), {}, time_left=limit.seconds_left, clock=limit.clock)
    now[0] += 25.0  # iterations 4-6 again, 25 s: the clock reads 55 s, short of the minute
    writer.on_log(None, State(), None, logs={"loss": 0.0})
    assert not limit.on_step_end(None, State(), Control()).should_training_stop
    now[0] += 5.0
    assert limit.on_step_end(None, State(), Control()).should_training_stop and limit.reached
    log.close()
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in written] == [1, 2, 3, 4, 5, 6]
    assert written[-1]["time_s"] == 55.0
    assert callbacks.TimeLimit(60.0, used=60.0).spent and not callbacks.TimeLimit(None, used=99.0).spent


def test_metrics_log_fresh_run_starts_empty(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 7}\n')
    log = MetricsLog(tmp_path, tensorboard=False)
    assert log.last_step() is None
    log.log(0, {"x": float("nan")})
    log.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["x"] is None


def test_metrics_log_writes_tensorboard_events(tmp_path):
    with MetricsLog(tmp_path) as log:
        log.log(0, {"reward": 1.0, "note": "text is skipped"})
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_atomic_dir_replaces_only_on_success(tmp_path):
    target = tmp_path / "checkpoint-1"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("first")
    assert (target / "a.txt").read_text() == "first"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("killed")
    assert (target / "a.txt").read_text() == "first"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-1"]


def test_write_json_round_trips(tmp_path):
    import numpy as np

    write_json(tmp_path / "x.json", {"a": np.float32(0.5), "b": [1, 2]})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 0.5, "b": [1, 2]}


# ---- checkpoint manifests ------------------------------------------------------------------------------
def _checkpoint_dir(root, step: int, payload: bytes = b""):
    path = root / f"checkpoint-{step}"
    path.mkdir()
    (path / "model.bin").write_bytes(payload or os.urandom(3 << 20))
    (path / "state.json").write_text(json.dumps({"step": step}))
    return path


def test_manifest_catches_truncation_changed_content_and_missing_files(tmp_path):
    path = _checkpoint_dir(tmp_path, 1)
    write_manifest(path, step=1)
    assert manifest_path(path) == path / "manifest.json"
    assert json.loads(manifest_path(path).read_text())["step"] == 1
    assert checkpoint_problem(path) is None

    model = path / "model.bin"
    data = model.read_bytes()
    model.write_bytes(data[: len(data) // 2])
    assert "model.bin has" in checkpoint_problem(path)
    model.write_bytes(bytes(len(data)))  # the right size, zero-filled
    assert "model.bin does not match" in checkpoint_problem(path)
    model.write_bytes(data)
    (path / "state.json").unlink()
    assert checkpoint_problem(path) == "state.json is missing"


def test_zip_manifest_sits_beside_it_and_an_optional_file_may_go(tmp_path):
    archive = tmp_path / "checkpoint-5.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("policy.pth", os.urandom(1000))
    meta, replay = tmp_path / "checkpoint-5.json", tmp_path / "checkpoint-5.replay.pkl"
    meta.write_text("{}")
    replay.write_bytes(os.urandom(5000))
    write_manifest(archive, (meta,), (replay,), step=5)
    assert manifest_path(archive) == tmp_path / "checkpoint-5.manifest.json"
    assert checkpoint_problem(archive) is None
    replay.unlink()  # the next checkpoint deletes the older replay buffer
    assert checkpoint_problem(archive) is None
    meta.write_text("")
    assert "checkpoint-5.json has 0 bytes" in checkpoint_problem(archive)


def test_newest_valid_checkpoint_skips_damaged_ones_and_says_why(tmp_path, caplog):
    for step in (1, 2, 3):
        write_manifest(_checkpoint_dir(tmp_path, step), step=step)
    (tmp_path / "checkpoint-3" / "model.bin").write_bytes(b"cut")
    (tmp_path / "checkpoint-2" / "manifest.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="agentrl.runs.runlog"):
        assert newest_valid_checkpoint(tmp_path) == tmp_path / "checkpoint-1"
    assert "Skipping checkpoint-3: model.bin has 3 bytes" in caplog.text
    assert "Skipping checkpoint-2: unreadable manifest" in caplog.text
    assert newest_valid_checkpoint(tmp_path, kind="zip") is None  # only directories here


def test_checkpoint_without_manifest_is_trusted_only_if_its_files_load(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "checkpoint-1"
    path.mkdir()
    save_file({"w": torch.ones(64, 64)}, path / "model.safetensors")
    torch.save({"state": torch.zeros(256)}, path / "optimizer.pt")
    (path / "trainer_state.json").write_text('{"global_step": 1}')
    assert checkpoint_problem(path) is None
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        whole = (path / name).read_bytes()
        (path / name).write_bytes(whole[: len(whole) - 7])
        assert checkpoint_problem(path).startswith(f"no manifest, and {name}"), name
        (path / name).write_bytes(whole)
    assert checkpoint_problem(path) is None


def test_prune_keeps_the_checkpoint_just_saved_over_newer_leftovers(tmp_path):
    for step in (1, 2, 5):
        (tmp_path / f"checkpoint-{step}.zip").write_bytes(b"z")
        (tmp_path / f"checkpoint-{step}.manifest.json").write_text("{}")
    prune_checkpoints(tmp_path, keep=1, current=2)  # checkpoint-5: a damaged leftover of a killed run
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-2.manifest.json",
        "checkpoint-2.zip",
        "checkpoint-5.manifest.json",
        "checkpoint-5.zip",
    ]
