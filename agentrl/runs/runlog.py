"""What a run writes while it runs: metrics.jsonl + TensorBoard, rich progress, and the one place that
writes files atomically and finds checkpoints."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.runs import trackers

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends one JSON object per iteration to run_dir/metrics.jsonl (flushed at once) and mirrors
    the numeric values to TensorBoard under run_dir/tb/ (unless the run's `report_to` leaves it out) and
    to the run's other trackers (agentrl/runs/trackers.py). On resume, steps already logged are skipped,
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
        if tensorboard and trackers.tensorboard_on():
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
        # rewrite without the torn line so the file always parses; by rename, since the other processes
        # of a resumed run read it meanwhile (their time limit's clock, the target check)
        with atomic_file(self.path) as tmp:
            tmp.write_text("".join(line + "\n" for line in good_lines), encoding="utf-8")

    def last_step(self) -> int | None:
        return max(self._logged) if self._logged else None

    def log(self, step: int, metrics: dict[str, Any], time_s: float | None = None) -> None:
        """One iteration's row; `time_s` is the caller's training clock (default: this log's own, which
        a resume continues from the largest time logged)."""
        if step in self._logged:
            return
        if time_s is None:
            time_s = self._time_offset + time.perf_counter() - self._start
        row = {"iteration": int(step), "time_s": round(time_s, 3)}
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
        tracked = trackers.active()
        if tracked is not None:
            tracked.log(step, row)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _eta(counted: float | None, bound: float | None) -> str:
    """The ETA shown: the smaller of the count-based estimate and the caller's upper bound (marked <=)."""
    if bound is not None and (counted is None or bound < counted):
        return f"<={_clock(bound)}"
    return "?" if counted is None else _clock(counted)


def _eta_column() -> Any:
    """A rich column showing `_eta` of rich's own remaining-time estimate and the task's `eta_bound`."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class EtaColumn(ProgressColumn):
        max_refresh = 0.5

        def render(self, task: Any) -> Any:
            if task.finished:
                return Text("0:00", style="progress.remaining")
            bound, at = task.fields.get("eta_bound"), task.fields.get("eta_at")
            if bound is not None:
                bound = max(bound - (time.monotonic() - at), 0.0)
            return Text(_eta(task.time_remaining, bound), style="progress.remaining")

    return EtaColumn()


class _Progress:
    """The live rich bar (a terminal)."""

    def __init__(self, bar: Any, task: Any):
        self._bar, self._task = bar, task

    def advance(self, line: str = "", n: int = 1, eta_s: float | None = None) -> None:
        """Count `n` more done and show `line` (the metrics so far); `eta_s`: at most this many seconds
        are left (e.g. from the episodes' step cap)."""
        self._bar.update(self._task, advance=n, metrics=line, **self._bound(eta_s))

    def update(self, line: str, eta_s: float | None = None) -> None:
        """Show `line` without counting anything done (e.g. steps/s while episodes are still running)."""
        self._bar.update(self._task, metrics=line, **self._bound(eta_s))

    def set_total(self, total: int) -> None:
        """The count becomes known after the bar started (SFT: when the trainer has sized its epochs)."""
        self._bar.update(self._task, total=total)

    @staticmethod
    def _bound(eta_s: float | None) -> dict[str, Any]:
        return {} if eta_s is None else {"eta_bound": eta_s, "eta_at": time.monotonic()}

    def close(self) -> None:
        pass


class _PlainProgress:
    """Plain full-width lines for a log file or a pipe (no terminal), each written and flushed as it
    happens: `description done/total (pct%) elapsed eta | metrics`.

    `every_advance`: one line per advance (training: one per iteration). Otherwise (evaluation): a line
    each time another 10% of the total is done (at most one a second: lockstep episodes often end
    together), a line whenever 30 s pass without one (`update`'s steps/s keeps a long lockstep eval
    visible before its episodes finish), and a last line at the end, so a long eval prints at least
    every 30 s and a short one at most about ten lines. The ETA is the remaining count at the mean speed
    since the start, or the caller's bound `eta_s` when that is smaller (shown as <=M:SS); advances
    without a metrics line (the iterations a resumed run had already done) move the count, not the
    speed."""

    HEARTBEAT_S = 30.0
    MIN_GAP_S = 1.0  # between two 10% lines
    STEPS = 10  # lines per run when not every advance prints (one per 10%)

    def __init__(self, description: str, total: int | None, every_advance: bool, clock: Any = time.monotonic):
        from agentrl.console import console

        self._console, self._clock = console, clock
        self.description, self.total, self.every_advance = description, total, every_advance
        self.done, self._base, self._line = 0, 0, ""
        self._bound: tuple[float, float] | None = None  # (seconds left at most, when it was given)
        self._start = self._last_print = clock()
        self._printed_done = 0
        self._next_mark = self._mark_after(0)

    def _mark_after(self, done: int) -> int:
        step = max(1, math.ceil(self.total / self.STEPS)) if self.total else 1
        return (done // step + 1) * step

    def advance(self, line: str = "", n: int = 1, eta_s: float | None = None) -> None:
        self.done += n
        self._set_bound(eta_s)
        if not line:
            self._base += n
        else:
            self._line = line
        if self.every_advance:
            if line:
                self._print()
            return
        since = self._clock() - self._last_print
        if (self.done >= self._next_mark and since >= self.MIN_GAP_S) or since >= self.HEARTBEAT_S:
            self._print()

    def update(self, line: str, eta_s: float | None = None) -> None:
        self._line = line
        self._set_bound(eta_s)
        if not self.every_advance and self._clock() - self._last_print >= self.HEARTBEAT_S:
            self._print()

    def _set_bound(self, eta_s: float | None) -> None:
        if eta_s is not None:
            self._bound = (eta_s, self._clock())

    def set_total(self, total: int) -> None:
        self.total = total
        self._next_mark = self._mark_after(self.done)

    def close(self) -> None:
        if not self.every_advance and self.done != self._printed_done:
            self._print()

    def _print(self) -> None:
        now = self._clock()
        elapsed = now - self._start
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        worked = self.done - self._base
        if self.total and self.done >= self.total:
            eta = "0:00"
        else:
            counted = None
            if self.total and worked > 0 and elapsed > 0:
                counted = (self.total - self.done) * elapsed / worked
            bound = None if self._bound is None else max(self._bound[0] - (now - self._bound[1]), 0.0)
            eta = _eta(counted, bound)
        text = f"{self.description} {count}{pct} elapsed {_clock(elapsed)} eta {eta}"
        if self._line:
            text += f" | {self._line}"
        self._console.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)
        self._console.file.flush()
        self._last_print, self._printed_done = now, self.done
        self._next_mark = self._mark_after(self.done)


class _NoProgress:
    def advance(self, line: str = "", n: int = 1, eta_s: float | None = None) -> None:
        pass

    def update(self, line: str, eta_s: float | None = None) -> None:
        pass

    def set_total(self, total: int) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def progress(
    description: str, total: int | None, *, every_advance: bool = True
) -> Iterator[_Progress | _PlainProgress | _NoProgress]:
    """Progress of `total` items: `advance(line, n)` counts items done and shows the metrics `line`;
    `update(line)` shows a line without counting. In a terminal a live rich bar (count, elapsed, ETA,
    metrics); otherwise plain lines (see `_PlainProgress`; `every_advance=False` prints about every 10%
    and every 30 s instead of once per item). Silent with AGENTRL_NO_PROGRESS=1."""
    from agentrl.console import console, interactive

    if os.environ.get("AGENTRL_NO_PROGRESS") == "1":
        yield _NoProgress()
        return
    if not interactive():
        plain = _PlainProgress(description, total, every_advance)
        try:
            yield plain
        finally:
            plain.close()
        return

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        _eta_column(),
        TextColumn("{task.fields[metrics]}"),
        console=console,
        transient=False,
        # the speed behind the ETA averages over the last hour: rich's 30 s default leaves one sample,
        # and no ETA, when an iteration takes longer than that
        speed_estimate_period=3600,
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
    replace_dir(tmp, final_path, tag=str(os.getpid()))


def replace_dir(tmp: Path, final_path: Path, tag: str) -> None:
    """Put the finished directory `tmp` at `final_path` in one rename (an existing one is moved aside
    first, as `.old-<name>-<tag>`, and removed after)."""
    if final_path.exists():
        old = final_path.with_name(f".old-{final_path.name}-{tag}")
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
# appear only by rename after they are fully written; each carries a manifest (written last) of its
# files' sizes and fingerprints, so resume can tell an intact checkpoint from one damaged afterwards (a
# full disk, a copy cut short, zero-filled blocks after a crash) and fall back to an older one.
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)(\.zip)?$")
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
FINGERPRINT_BYTES = 1 << 20


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(N, path) of every checkpoint in `run_dir`, oldest first."""
    found = []
    for path in Path(run_dir).glob("checkpoint-*"):
        match = CHECKPOINT_RE.match(path.name)
        if match and (path.is_file() if match.group(2) else path.is_dir()):
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the highest N, or None (unverified: resume uses `newest_valid_checkpoint`)."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def prune_checkpoints(run_dir: Path, keep: int, current: int | None = None) -> None:
    """Delete all but the newest `keep` (at least one) checkpoints, with their side files
    (`checkpoint-<N>.json`, `.replay.pkl`, `.manifest.json`). With `current` (the step just saved),
    checkpoints numbered above it are left out of the count: they are leftovers of a killed run that
    resume skipped as damaged, and counting them could delete the checkpoint just written."""
    found = [(n, p) for n, p in list_checkpoints(run_dir) if current is None or n <= current]
    for step, path in found[: max(len(found) - max(keep, 1), 0)]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        for side in Path(run_dir).glob(f"checkpoint-{step}.*"):
            if side.is_file():
                side.unlink(missing_ok=True)


def manifest_path(checkpoint: Path) -> Path:
    """A checkpoint's manifest: `checkpoint-N/manifest.json`, or `checkpoint-N.manifest.json` beside a
    `checkpoint-N.zip`."""
    checkpoint = Path(checkpoint)
    if checkpoint.suffix == ".zip":
        return checkpoint.with_name(f"{checkpoint.stem}.manifest.json")
    return checkpoint / MANIFEST


def file_fingerprint(path: Path) -> str:
    """sha256 of a file's first and last MiB (the whole file up to 2 MiB). With the size, it catches
    truncation, zero-filled or swapped files and damage to the formats' headers and zip directories in
    milliseconds at any size; a full sha256 costs 1.4 s per 1.6 GB on an idle core (3-4 s under load),
    as much again as the save, too slow for a large model's save inside a pre-emption grace period."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        head = handle.read(FINGERPRINT_BYTES)
        digest.update(head)
        size = handle.seek(0, os.SEEK_END)
        if size > len(head):
            handle.seek(max(len(head), size - FINGERPRINT_BYTES))
            digest.update(handle.read())
    return digest.hexdigest()


def write_manifest(
    checkpoint: Path, side_files: tuple[Path, ...] = (), optional: tuple[Path, ...] = (), **info: Any
) -> Path:
    """Write a checkpoint's manifest: every file with its size and fingerprint, plus `info` (e.g. step).
    Call it after every file is complete: a manifest vouches for what it lists. A directory lists all
    its files; a zip lists itself and `side_files`; `optional` files are listed when present and may
    be deleted later without making the checkpoint invalid (a replay buffer only the newest keeps)."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        base = checkpoint
        required = sorted(p for p in checkpoint.rglob("*") if p.is_file() and p.name != MANIFEST)
    else:
        base = checkpoint.parent
        required = [checkpoint, *map(Path, side_files)]
    files: dict[str, dict[str, Any]] = {}
    for path, is_optional in [*((p, False) for p in required), *((Path(p), True) for p in optional)]:
        if is_optional and not path.is_file():
            continue
        entry: dict[str, Any] = {"size": path.stat().st_size, "fingerprint": file_fingerprint(path)}
        if is_optional:
            entry["optional"] = True
        files[path.relative_to(base).as_posix()] = entry
    target = manifest_path(checkpoint)
    header = {"format": MANIFEST_FORMAT, "fingerprint": "sha256 of the first and last MiB"}
    write_json(target, {**header, **info, "files": files})
    return target


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be trusted, or None when it can. With a manifest: every listed file is
    present (optional ones may be gone) with its recorded size and fingerprint. Without one (those of
    older agentrl versions) it is trusted only if its files pass a format check: zip archives (torch
    .pt/.pth/.bin, SB3 .zip) test clean, safetensors headers match the file size, JSON parses."""
    checkpoint = Path(checkpoint)
    mpath = manifest_path(checkpoint)
    if not mpath.is_file():
        files = [checkpoint] if checkpoint.is_file() else sorted(checkpoint.rglob("*"))
        for path in (p for p in files if p.is_file()):
            problem = _format_problem(path)
            if problem:
                return f"no manifest, and {path.name} {problem}"
        return None
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        entries = {str(name): dict(entry) for name, entry in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"unreadable manifest {mpath.name} ({exc.__class__.__name__})"
    base = checkpoint if checkpoint.is_dir() else checkpoint.parent
    for name, entry in entries.items():
        path = base / name
        if not path.is_file():
            if entry.get("optional"):
                continue
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry.get("size"):
            return f"{name} has {size} bytes, its manifest says {entry.get('size')}"
        if file_fingerprint(path) != entry.get("fingerprint"):
            return f"{name} does not match its fingerprint (its content changed)"
    return None


def _format_problem(path: Path) -> str | None:
    """A cheap check that a file of a known format is whole (None when whole or of an unknown format)."""
    suffix = path.suffix
    try:
        if suffix in (".zip", ".pt", ".pth", ".bin"):
            if not zipfile.is_zipfile(path):
                return "is not a zip archive (truncated?)"
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            return f"has a corrupt member {bad}" if bad else None
        if suffix == ".safetensors":
            size = path.stat().st_size
            with path.open("rb") as handle:
                header_len = int.from_bytes(handle.read(8), "little")
                header = json.loads(handle.read(header_len)) if 8 + header_len <= size else None
            if header is None:
                return "has a truncated header"
            data = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
            expected = 8 + header_len + data
            return None if expected == size else f"has {size} bytes, its header says {expected}"
        if suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        return f"is unreadable ({exc.__class__.__name__}: {exc})"
    return None


def newest_valid_checkpoint(run_dir: Path, kind: str | None = None) -> Path | None:
    """The newest checkpoint that `checkpoint_problem` finds nothing wrong with, or None; each newer one
    is skipped with a warning that names it and says why. `kind`: "dir" (HF) or "zip" (SB3) only."""
    for _, path in reversed(list_checkpoints(run_dir)):
        if (kind == "dir" and not path.is_dir()) or (kind == "zip" and path.suffix != ".zip"):
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            if not manifest_path(path).is_file():
                log.info("%s has no manifest (an older version wrote it) but its files load", path.name)
            return path
        log.warning("Skipping %s: %s", path.name, problem)
    return None
