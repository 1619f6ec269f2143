"""metrics.jsonl resume semantics, atomic directories and JSON."""

from __future__ import annotations

import json

import pytest

from agentrl.runlog import MetricsLog, atomic_dir, write_json


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
