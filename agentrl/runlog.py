"""What a run writes while it runs: metrics.jsonl + TensorBoard, rich progress, and the one place that
writes files atomically and finds checkpoints."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends one JSON object per iteration to run_dir/metrics.jsonl (flushed at once) and mirrors
    the numeric values to TensorBoard under run_dir/tb/. On resume, steps already logged are skipped,
    so a resumed run never duplicates an iteration."""

    def __init__(self, run_dir: Path, resume: bool = False, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._logged: set[int] = set()
        self._time_offset = 0.0
        if resume and self.path.exists():
            self._read_existing()
        elif self.path.exists() and not resume:
            self.path.unlink()
        self._start = time.perf_counter()
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))
            except Exception as exc:  # TensorBoard is optional: metrics.jsonl is the record
                log.warning("TensorBoard logging disabled: %s", exc)

    def _read_existing(self) -> None:
        good_lines = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill: drop it
                continue
            if "iteration" in row and row["iteration"] not in self._logged:
                self._logged.add(int(row["iteration"]))
                self._time_offset = max(self._time_offset, float(row.get("time_s") or 0.0))
                good_lines.append(line)
        # rewrite without the torn line so the file always parses
        self.path.write_text("".join(line + "\n" for line in good_lines), encoding="utf-8")

    def last_step(self) -> int | None:
        return max(self._logged) if self._logged else None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if step in self._logged:
            return
        elapsed = self._time_offset + time.perf_counter() - self._start
        row = {"iteration": int(step), "time_s": round(elapsed, 3)}
        row.update({k: _jsonable(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._logged.add(int(step))
        if self._tb is not None:
            for key, value in row.items():
                if key != "iteration" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Progress:
    def __init__(self, bar: Any, task: Any):
        self._bar, self._task = bar, task

    def advance(self, line: str = "", n: int = 1) -> None:
        self._bar.update(self._task, advance=n, metrics=line)


@contextlib.contextmanager
def progress(description: str, total: int | None) -> Iterator[_Progress]:
    """A rich progress bar (count, ETA) with a live metrics line; quiet when logging is silenced."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from agentrl.console import console

    bar = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[metrics]}"),
        console=console,
        transient=False,
        disable=os.environ.get("AGENTRL_NO_PROGRESS") == "1",
    )
    with bar:
        yield _Progress(bar, bar.add_task(description, total=total, metrics=""))


@contextlib.contextmanager
def atomic_dir(final_path: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `final_path` in one rename, so a
    reader (resume) never sees a half-written checkpoint."""
    final_path = Path(final_path)
    tmp = final_path.with_name(f".tmp-{final_path.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final_path.exists():
        old = final_path.with_name(f".old-{final_path.name}-{os.getpid()}")
        os.replace(final_path, old)
        os.replace(tmp, final_path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final_path)


@contextlib.contextmanager
def atomic_file(final_path: Path) -> Iterator[Path]:
    """Yield a temporary sibling path (same suffix, so libraries that add extensions keep it); on
    success it replaces `final_path` in one rename, so a reader never sees a half-written file."""
    final_path = Path(final_path)
    tmp = final_path.with_name(f".tmp-{os.getpid()}-{final_path.name}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, final_path)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file, then rename)."""
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n", encoding="utf-8")


# Checkpoints are `checkpoint-<N>` directories (HF trainers) or `checkpoint-<N>.zip` files (SB3). Both
# appear only by rename after they are fully written, so a listed checkpoint is complete.
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)(\.zip)?$")


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(N, path) of every checkpoint in `run_dir`, oldest first."""
    found = []
    for path in Path(run_dir).glob("checkpoint-*"):
        match = CHECKPOINT_RE.match(path.name)
        if match and (path.is_file() if match.group(2) else path.is_dir()):
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the highest N, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` (at least one) checkpoints, with their side files
    (`checkpoint-<N>.json`, `checkpoint-<N>.replay.pkl`)."""
    found = list_checkpoints(run_dir)
    for step, path in found[: max(len(found) - max(keep, 1), 0)]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        for side in Path(run_dir).glob(f"checkpoint-{step}.*"):
            if side.is_file():
                side.unlink(missing_ok=True)
