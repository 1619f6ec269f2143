"""benchmarks/iteration_speed.py: reading runs, medians and speedups, failed runs, the plan, and one
end-to-end comparison of two trees on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "iteration_speed.py"
TINY = ["model=tiny-random", "algo.group_size=2", "algo.groups_per_iteration=2", "algo.max_steps=2"]
TINY += ["algo.min_informative_groups=0", "algo.max_rollout_rounds=1"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("iteration_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["iteration_speed"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("iteration_speed", None)


def write_run(
    run_dir: Path, seconds: list[float], returns: list[float], eval_returns: list[float] | None
) -> Path:
    """A run directory as `agentrl train` leaves it: metrics.jsonl, and eval.json + episodes.jsonl
    unless `eval_returns` is None (a run that died before its eval)."""
    run_dir.mkdir(parents=True)
    rows = [
        {
            "iteration": k,
            "time_s": sum(seconds[:k]),
            "iteration_s": s,
            "rollout_s": s / 4,
            "update_s": s * 3 / 4,
            "train/mean_return": r,
            "train/success_rate": 0.5,
            "train/invalid_rate": 0.1,
            "train/untagged_rate": 0.0,
        }
        for k, (s, r) in enumerate(zip(seconds, returns, strict=True), 1)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if eval_returns is not None:
        mean = sum(eval_returns) / len(eval_returns)
        (run_dir / "eval.json").write_text(json.dumps({"mean_return": mean, "success_rate": 0.25}))
        episodes = "".join(json.dumps({"return": r}) + "\n" for r in eval_returns)
        (run_dir / "episodes.jsonl").write_text(episodes)
    return run_dir


def record(bench, run_dir: Path, side: str, seed: int, iterations: int, rc: int = 0) -> dict:
    """What run_one records for a finished run."""
    result = {
        "preset": "p",
        "side": side,
        "seed": seed,
        "rc": rc,
        "log": "x.log",
        **bench.read_run(run_dir, iterations),
    }
    result["status"] = "ok" if rc == 0 and not result.get("missing") else "failed"
    return result


def test_the_median_leaves_out_iteration_1_from_three_or_more(bench, tmp_path):
    run = write_run(tmp_path / "a", [30.0, 2.0, 4.0], [0.0, 0.0, 0.0], [1.0])
    median = {"iteration_s": 3.0, "rollout_s": 0.75, "credit_s": None, "prepare_s": None, "update_s": 2.25}
    assert bench.read_run(run, 3)["median"] == median  # credit_s, prepare_s: absent from these runs
    two = write_run(tmp_path / "b", [30.0, 2.0], [0.0, 0.0], [1.0])
    assert bench.read_run(two, 2)["median"]["iteration_s"] == 16.0  # N < 3: every iteration counts


def test_speedup_is_the_ratio_of_medians_pooled_over_seeds(bench, tmp_path):
    runs = [
        record(
            bench,
            write_run(tmp_path / "b0", [99.0, 8.0, 12.0], [-1.0, 0.0, 1.0], [1.0, 0.0]),
            "baseline",
            0,
            3,
        ),
        record(
            bench,
            write_run(tmp_path / "b1", [99.0, 10.0, 10.0], [1.0, 2.0, 3.0], [1.0, 1.0]),
            "baseline",
            1,
            3,
        ),
        record(
            bench, write_run(tmp_path / "c0", [99.0, 4.0, 6.0], [0.0, 0.0, 0.0], [0.0, 0.0]), "current", 0, 3
        ),
        record(
            bench, write_run(tmp_path / "c1", [99.0, 5.0, 5.0], [0.0, 0.0, 0.0], [0.0, 0.0]), "current", 1, 3
        ),
    ]
    baseline, current = bench.summarize(runs, ["baseline", "current"], ["p"], True, "current")
    assert baseline["median_iteration_s"] == 10.0 and current["median_iteration_s"] == 5.0
    assert baseline["speedup_iteration_s"] == 2.0 and current["speedup_iteration_s"] == 1.0
    # learning: per-iteration means over seeds, the mean over iterations with its SE over seeds
    assert [c["mean"] for c in baseline["train_return_per_iteration"]] == [0.0, 1.0, 2.0]
    assert baseline["train_return"] == 1.0 and baseline["train_return_se"] == pytest.approx(1.0)
    assert baseline["eval_return"] == 0.75 and baseline["eval_episodes"] == 4  # pooled episodes
    assert baseline["eval_return_se"] == pytest.approx(0.25)
    table = bench.table([baseline, current])
    assert "2.00x" in table and max(len(line) for line in table.splitlines()) <= 80


def test_seconds_per_unit_of_work_where_the_sides_work_differs(bench, tmp_path):
    """Both sides take 2 s of rollout an iteration, but the baseline's episodes run twice the steps:
    per step it is the faster one; the update per 1,000 tokens likewise."""
    runs = []
    for side, length, tokens in (("baseline", 6.0, 4000), ("current", 3.0, 1000)):
        run_dir = write_run(tmp_path / side, [8.0, 8.0, 8.0], [0.0, 0.0, 0.0], [0.0])
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            row.update({"train/episodes": 24, "train/mean_length": length, "train_tokens": tokens})
            row.update({"rollout_rounds": 1, "samples": 20})
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        runs.append(record(bench, run_dir, side, 0, 3))
    baseline, current = bench.summarize(runs, ["baseline", "current"], ["p"], True, "current")
    assert baseline["speedup_iteration_s"] == 1.0  # the same seconds per iteration
    assert (baseline["median_rollout_steps"], current["median_rollout_steps"]) == (144.0, 72.0)
    assert baseline["median_rollout_s_per_step"] == pytest.approx(2.0 / 144)
    assert baseline["speedup_rollout_s_per_step"] == pytest.approx(0.5)
    assert current["median_update_s_per_ktoken"] == pytest.approx(6.0)
    assert baseline["speedup_update_s_per_ktoken"] == pytest.approx(0.25)
    result = {
        "summary": [baseline, current],
        "command": "c",
        "cpu_model": "cpu",
        "threads": 2,
        "load_average": {"start": [0], "end": [0]},
        "seeds": [0],
        "iterations": 3,
        "sides": [],
        "warmup_excluded": True,
        "reference": "current",
        "runs": runs,
    }
    assert "| p | baseline | 144 | 1 | 4000 | 14 | 0.50x | 1500 | 0.25x |" in bench.markdown(result)


def test_a_failed_run_is_marked_and_the_others_still_count(bench, tmp_path):
    runs = [
        record(bench, write_run(tmp_path / "b0", [5.0], [0.0], None), "baseline", 0, 1, rc=1),
        record(bench, write_run(tmp_path / "c0", [5.0], [0.0], [0.0]), "current", 0, 1),
    ]
    assert runs[0]["missing"] == ["eval.json"]
    baseline, current = bench.summarize(runs, ["baseline", "current"], ["p"], False, "current")
    assert (baseline["failed"], current["failed"]) == (1, 0)
    assert baseline["median_iteration_s"] is None and current["median_iteration_s"] == 5.0
    assert "FAILED" in bench.table([baseline, current]).splitlines()[1]
    result = {"warmup_excluded": False, "reference": "current", "runs": runs}
    assert "failed: p/baseline/seed0 rc=1, log x.log" in bench.notes(result)


def test_a_run_that_exits_non_zero_keeps_its_exit_code_and_log_tail(bench, tmp_path, monkeypatch):
    crash = [sys.executable, "-c", "import sys; print('loading', flush=True); sys.exit('Traceback: boom')"]
    monkeypatch.setattr(bench, "train_command", lambda *args: crash)
    args = bench.parse_args(["--iterations", "2", "--out", str(tmp_path / "out")])
    run = bench.run_one(bench.Side("current", []), "frozenlake_learn", 0, args)
    assert (run["status"], run["rc"]) == ("failed", 1)
    assert run["log_tail"] == ["loading", "Traceback: boom"]
    assert "metrics.jsonl" in run["missing"]


def test_sides_interleave_and_flip_order_from_block_to_block(bench):
    a, b = bench.Side("baseline", []), bench.Side("current", [])
    order = [(seed, preset, side.label) for seed, preset, side in bench.schedule([0, 1], ["p", "q"], [a, b])]
    assert order == [
        (0, "p", "baseline"),
        (0, "p", "current"),
        (0, "q", "current"),
        (0, "q", "baseline"),
        (1, "p", "baseline"),
        (1, "p", "current"),
        (1, "q", "current"),
        (1, "q", "baseline"),
    ]


def test_dry_run_names_both_trees_and_creates_no_worktree(bench, capsys):
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout
    argv = [
        "--baseline",
        "HEAD",
        "--side",
        "fp32=algo.precision=fp32",
        "--presets",
        "frozenlake_learn",
        "--dry-run",
    ]
    before = worktrees()
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert f"side baseline: $BASELINE_TREE = a temporary git worktree of HEAD ({head.strip()})" in out
    assert f"side current: {REPO}" in out
    commands = [line for line in out.splitlines() if line.startswith("cd ")]
    assert [c.split(" &&")[0] for c in commands] == ["cd $BASELINE_TREE", f"cd {REPO}", f"cd {REPO}"]
    assert all("algo.checkpoint_every=0" in c and "algo.eval_every=0" in c for c in commands)
    assert commands[2].endswith(
        "algo.precision=fp32 hydra.run.dir="
        + str(Path("outputs/bench/iteration_speed/frozenlake_learn/fp32/seed0").resolve())
    )
    assert worktrees() == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--baseline", "no-such-rev"], "--baseline no-such-rev: not a commit of"),
        (["--side", "fp32"], "--side 'fp32': expected LABEL=OVERRIDE"),
        (["--side", "x=algo.iterations=5"], "--side x: algo.iterations is set by the benchmark"),
        (["--side", "a=", "--side", "a=seed2"], "--side a: 'seed2' is not a KEY=VALUE override"),
        (["--", "hydra.run.dir=/tmp/x"], "overrides after --: hydra.run.dir is set by the benchmark"),
    ],
)
def test_bad_arguments_fail_in_one_line(bench, capsys, argv, message):
    assert bench.main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1


def test_a_tree_that_does_not_hold_agentrl_is_refused(bench, tmp_path):
    side = bench.Side("elsewhere", [], tree=tmp_path)
    with pytest.raises(
        bench.BenchError, match=f"side elsewhere: agentrl imports from .*, not from {tmp_path}"
    ):
        bench.check_import(side, threads=1)


def test_an_override_one_side_lacks_fails_before_any_training(bench, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--side", "bad=algo.no_such_key=1", "--presets", "frozenlake_learn", "--out", str(out)]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: side bad, frozenlake_learn: the config does not compose: ")
    assert "algo.no_such_key" in err and not out.exists()


@pytest.mark.slow  # three tiny trainings and their checks (~40 s on the loaded 2-core machine)
def test_baseline_worktree_and_a_side_end_to_end(bench, tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["--baseline", "HEAD", "--side", "fp32=algo.precision=fp32", "--presets", "frozenlake_learn"]
    argv += ["--iterations", "1", "--threads", "1", "--eval-episodes", "1", "--out", str(out), *TINY]
    assert bench.main(argv) == 0
    result = json.loads((out / "iteration_speed.json").read_text())
    assert [r["side"] for r in result["runs"]] == ["baseline", "current", "fp32"]
    assert all(r["status"] == "ok" and r["iterations"][0]["iteration_s"] > 0 for r in result["runs"])
    baseline_cwd = result["runs"][0]["cwd"]
    assert "agentrl-baseline-" in baseline_cwd and result["runs"][1]["cwd"] == str(REPO)
    assert "precision fp32" in result["sides"][2]["plans"]["frozenlake_learn"]
    assert [row["speedup_iteration_s"] is not None for row in result["summary"]] == [True] * 3
    assert "| frozenlake_learn | fp32 |" in (out / "iteration_speed.md").read_text()
    assert "frozenlake_learn current" in capsys.readouterr().out
    assert not Path(baseline_cwd).exists() and baseline_cwd not in worktrees()


def worktrees() -> str:
    return subprocess.run(["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True).stdout


@pytest.mark.parametrize(("error", "code"), [(KeyboardInterrupt, 130), (RuntimeError, None)])
def test_the_baseline_worktree_is_removed_after_an_interrupt_or_an_error(bench, monkeypatch, error, code):
    seen = {}

    def interrupted(sides, args):
        seen["tree"] = sides[0].tree
        assert (sides[0].tree / "agentrl" / "__init__.py").is_file()  # checked out while measuring
        raise error

    monkeypatch.setattr(bench, "measure", interrupted)
    argv = ["--baseline", "HEAD", "--presets", "frozenlake_learn"]
    if code is None:
        with pytest.raises(error):
            bench.main(argv)
    else:
        assert bench.main(argv) == code
    assert not seen["tree"].exists() and str(seen["tree"]) not in worktrees()


def test_a_run_past_its_timeout_is_ended_with_its_children(bench, tmp_path):
    # a shell with a child: both must go (a training's own subprocesses live in its process group)
    pid_file = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    process = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    while not pid_file.is_file() or not pid_file.read_text().strip():
        time.sleep(0.05)
    assert bench.wait(process, timeout_s=0.5) == 124
    assert not running(int(pid_file.read_text()))


def running(pid: int, seconds: float = 5.0) -> bool:
    """Whether `pid` is still alive (not gone, not a zombie) after up to `seconds`."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        time.sleep(0.05)
    return True
