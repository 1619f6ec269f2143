"""Run directories: unique names, one process per directory, `status.json`, and reading a finished run.

- Names. The default `hydra.run.dir` (conf/config.yaml) is
  `outputs/<date>/<HH-MM-SS.mmm>-<id>_<name>`: milliseconds from `${run_time:}` and a random hex id from
  `${run_id:}` (both resolvers are registered here, cached per config like Hydra's `${now:}`), so two
  commands started in the same millisecond still get two directories. Sweep job directories carry an id
  too (`<job>_<id>_<overrides>`), the overrides made one path component by `${dir_name:...}` (a value
  such as `agent.path=outputs/run` would otherwise nest the job's directory, or lead out of the sweep's).
- Lock. `RunLock` takes an exclusive `flock` on `<run dir>/.lock`, which holds the owner's pid, host and
  start time. The kernel drops the lock when the process ends, however it ends (a crash, SIGKILL), so a
  lock file left behind never blocks anyone; a clean release also deletes the file.
- `status.json`: `running` while a job runs, then `complete`, `failed` or `interrupted` with a one-line
  `reason` (see `write_status` for the fields). A process killed outright leaves `running`;
  `effective_status` tells that apart from a live run.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentrl.errors import RunDirError
from agentrl.runs.runlog import write_json

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
STATUS_FILE = "status.json"
#: the states status.json records; `killed` is only ever derived (effective_status)
STATES = ("running", "complete", "failed", "interrupted")
#: files whose presence means a directory already holds a run
RUN_MARKERS = (".hydra/config.yaml", STATUS_FILE, "eval.json", "metrics.jsonl")
RUN_ID_HEX = 4  # 16 bits of randomness on top of the millisecond
#: bytes of a sweep job's overrides kept in its directory name (a file name has at most 255)
DIR_NAME_BYTES = 200


def _now() -> datetime:
    """The clock of run names (a function, so tests can freeze it)."""
    return datetime.now()


def new_run_id() -> str:
    return secrets.token_hex(RUN_ID_HEX // 2)


def run_time() -> str:
    now = _now()
    return f"{now:%H-%M-%S}.{now.microsecond // 1000:03d}"


def dir_name(text: str) -> str:
    """`text` as one path component: path separators become `_`, and it is cut to `DIR_NAME_BYTES`
    (the job's overrides are whole in its .hydra/overrides.yaml)."""
    name = str(text).replace("/", "_").replace("\\", "_")
    return name.encode()[:DIR_NAME_BYTES].decode(errors="ignore")


def register_resolvers() -> None:
    """`${run_time:}` and `${run_id:}` for the run-directory patterns of conf/config.yaml, cached per
    config so every read of one job's `hydra.run.dir` gives the same path, and `${dir_name:...}`
    (idempotent)."""
    # the lambdas look the functions up when called, so a test can replace them
    if not OmegaConf.has_resolver("run_time"):
        OmegaConf.register_new_resolver("run_time", lambda: run_time(), use_cache=True)
    if not OmegaConf.has_resolver("run_id"):
        OmegaConf.register_new_resolver("run_id", lambda: new_run_id(), use_cache=True)
    if not OmegaConf.has_resolver("dir_name"):
        OmegaConf.register_new_resolver("dir_name", dir_name)


register_resolvers()


def host_name() -> str:
    return socket.gethostname()


def stamp() -> str:
    return datetime.now().isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------
# what a directory holds
# ---------------------------------------------------------------------------------------------------
def run_marker(path: Path, markers: tuple[str, ...] = RUN_MARKERS) -> str | None:
    """The first file in `markers` that `path` holds (it already holds a run), or None."""
    return next((m for m in markers if (Path(path) / m).exists()), None)


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """status.json as a dict, or None when absent or unreadable."""
    try:
        data = json.loads((Path(run_dir) / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def lock_holder(run_dir: Path) -> dict[str, Any] | None:
    """pid, host and start time written in `<run dir>/.lock`, or None when there is no lock file."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8").split()
    except OSError:
        return None
    holder: dict[str, Any] = {"pid": None, "host": None, "since": None}
    for key, value in zip(("pid", "host", "since"), text, strict=False):
        holder[key] = int(value) if key == "pid" and value.isdigit() else value
    return holder


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def effective_status(run_dir: Path) -> str | None:
    """status.json's state, except that a `running` whose process is gone reads `killed` (SIGKILL, a
    power cut: nothing could write the end state). Gone means no lock file, or on this host a lock file
    that no process holds (its pid dead, or alive but reused by another program); a lock written on
    another host is taken at its word. None without status.json."""
    status = read_status(run_dir)
    if status is None:
        return None
    state = str(status.get("status"))
    if state != "running":
        return state
    holder = lock_holder(run_dir)
    if holder is None:
        return "killed"
    if holder["host"] == host_name():
        if not isinstance(holder["pid"], int) or not _pid_alive(holder["pid"]) or not _lock_held(run_dir):
            return "killed"
    return state


def _lock_held(run_dir: Path) -> bool:
    """Whether a process holds `<run dir>/.lock` (a shared flock taken and dropped at once succeeds only
    when nobody holds the exclusive one)."""
    import fcntl

    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's shared lock
    return False


def is_complete(run_dir: Path) -> bool:
    """A finished run: eval.json is written and status.json (when there is one: runs of older versions
    have none) says complete."""
    run_dir = Path(run_dir)
    if not (run_dir / "eval.json").is_file():
        return False
    status = read_status(run_dir)
    return status is None or status.get("status") == "complete"


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl ([] without the file), less a line cut by a kill."""
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def last_metrics_time(run_dir: Path) -> float:
    """The largest `time_s` in metrics.jsonl: MetricsLog carries it on across resumes, so it is the
    training time of every part so far (0 without rows)."""
    times = [float(r["time_s"]) for r in metrics_rows(run_dir) if isinstance(r.get("time_s"), (int, float))]
    return max(times, default=0.0)


def metrics_time_at(run_dir: Path, step: int) -> float:
    """The training clock (`time_s`) at iteration `step`: its row's, or, where a kill cut that row, the
    largest logged at an earlier iteration (0 without one). A resume from checkpoint-`step` continues the
    clock from here."""
    rows = [r for r in metrics_rows(run_dir) if isinstance(r.get("time_s"), (int, float))]
    exact = [float(r["time_s"]) for r in rows if r.get("iteration") == step]
    if exact:
        return exact[0]
    earlier = [
        float(r["time_s"]) for r in rows if isinstance(r.get("iteration"), int) and r["iteration"] < step
    ]
    return max(earlier, default=0.0)


# ---------------------------------------------------------------------------------------------------
# the lock
# ---------------------------------------------------------------------------------------------------
class RunLock:
    """An exclusive lock on a run directory (`flock` on `<dir>/.lock`). `acquire` raises RunDirError
    naming the holder when another process has it. Extra fields: `resume` (the job continues a run)."""

    def __init__(self, path: Path, *, resume: bool = False):
        self.path = Path(path).resolve()
        self.resume = resume
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        import fcntl

        lock = self.path / LOCK_FILE
        for _ in range(5):
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:  # a file in the way, no permission, a read-only disk
                raise RunDirError(f"cannot use run directory {self.path}: {exc.strerror or exc}") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirError(self._in_use_message()) from None
            # The holder before us deletes the file as it releases: a lock on that deleted file is no
            # lock on the directory, so take the one the path names now.
            try:
                same = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {host_name()} {stamp()}\n".encode())
                self._fd = fd
                return self
            os.close(fd)
        raise RunDirError(f"cannot lock run directory {self.path}: its lock file keeps changing")

    def _in_use_message(self) -> str:
        holder = lock_holder(self.path) or {}
        who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder.get("pid") else "another process"
        since = f" since {holder['since']}" if holder.get("since") else ""
        return f"run directory {self.path} is in use by {who}{since}; wait for it to end or choose another"

    def release(self) -> None:
        if self._fd is None:
            return
        lock = self.path / LOCK_FILE
        try:
            if os.stat(lock).st_ino == os.fstat(self._fd).st_ino:
                lock.unlink()
        except OSError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __enter__(self) -> RunLock:
        return self if self.held else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim(path: Path, *, resume: bool = False, markers: tuple[str, ...] = RUN_MARKERS) -> RunLock:
    """Lock `path` for a new job (created if missing). Unless `resume`, a directory that already holds a
    run (one of `markers`) is refused; the check runs under the lock, so of two processes racing for one
    directory exactly one gets it."""
    lock = RunLock(path, resume=resume).acquire()
    marker = None if resume else run_marker(lock.path, markers)
    if marker is not None:
        lock.release()
        raise RunDirError(
            f"{lock.path} already holds a run ({marker}): choose another hydra.run.dir (or leave it out "
            f"for a new one); a training run there continues with: agentrl train "
            f"{shell_override('resume', lock.path)}"
        )
    return lock


# ---------------------------------------------------------------------------------------------------
# status.json
# ---------------------------------------------------------------------------------------------------
def write_status(run_dir: Path, status: str, **fields: Any) -> dict[str, Any]:
    """Write status.json atomically. Fields: `status` (running | complete | failed | interrupted), `task`,
    `reason` (failed/interrupted: "<ExceptionType>: <message>"), `started` / `ended` (this part, ISO
    time), `first_started`, `parts` (jobs run in this directory: 1 + resumes), `pid`, `host`, and for
    a complete training run `train_time_s` (all parts). Fields not given are kept from the file."""
    if status not in STATES:
        raise ValueError(f"status {status!r} is not one of {STATES}")
    data = {**(read_status(run_dir) or {}), **fields}
    if status == "running":
        data.pop("reason", None)
        data.pop("ended", None)
    data = {"status": status, **{k: v for k, v in data.items() if k != "status"}}
    write_json(Path(run_dir) / STATUS_FILE, data)
    return data


def start_status(run_dir: Path, task: str, *, resume: bool) -> None:
    """status.json at the start of a job: `running`; a resumed run counts one more part."""
    previous = read_status(run_dir) if resume else None
    now = stamp()
    parts = int(previous.get("parts", 1)) + 1 if previous else 1
    fields: dict[str, Any] = {
        "task": task,
        "started": now,
        "first_started": (previous or {}).get("first_started") or (previous or {}).get("started") or now,
        "parts": parts,
        "pid": os.getpid(),
        "host": host_name(),
    }
    if not resume:
        (Path(run_dir) / STATUS_FILE).unlink(missing_ok=True)
    write_status(run_dir, "running", **fields)


def end_status(run_dir: Path, exc: BaseException | None, **fields: Any) -> None:
    """status.json at the end of a job: complete, or failed / interrupted with the one-line reason."""
    if exc is None:
        write_status(run_dir, "complete", ended=stamp(), **fields)
        return
    # KeyboardInterrupt, and the trainers' exception for a stop signal (it carries `signum`)
    interrupted = isinstance(exc, KeyboardInterrupt) or getattr(exc, "signum", None) is not None
    message = " ".join(str(exc).split())
    reason = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    write_status(run_dir, "interrupted" if interrupted else "failed", ended=stamp(), reason=reason, **fields)


# ---------------------------------------------------------------------------------------------------
# a finished run, read back (resume, eval from_run=)
# ---------------------------------------------------------------------------------------------------
@dataclass
class SavedRun:
    """A run directory's saved config and overrides (`.hydra/`)."""

    root: Path
    config: DictConfig
    overrides: list[str]

    @property
    def task(self) -> str:
        return str(self.config.get("task"))

    @property
    def algo(self) -> str | None:
        algo = self.config.get("algo")
        return str(algo.get("name")) if isinstance(algo, DictConfig) else None


def load_run(path: Path, what: str) -> SavedRun:
    """Read `<path>/.hydra/config.yaml` and overrides.yaml; RunDirError (one line, starting with `what`)
    when `path` is not a run directory."""
    root = Path(path).expanduser().resolve()
    config_path = root / ".hydra" / "config.yaml"
    if not config_path.is_file():
        reason = "no such directory" if not root.exists() else "no .hydra/config.yaml"
        raise RunDirError(f"{what} {path}: {reason} (not an agentrl run directory)")
    try:
        config = OmegaConf.load(config_path)
        overrides_path = root / ".hydra" / "overrides.yaml"
        overrides = [str(o) for o in OmegaConf.load(overrides_path)] if overrides_path.is_file() else []
    except Exception as exc:  # a truncated or hand-edited file
        raise RunDirError(f"{what} {path}: unreadable .hydra/ ({type(exc).__name__}: {exc})") from exc
    if not isinstance(config, DictConfig):
        raise RunDirError(f"{what} {path}: .hydra/config.yaml is not a mapping")
    return SavedRun(root, config, overrides)


def load_train_run(path: Path, what: str) -> SavedRun:
    """`load_run`, and the run must be a training run (task=train)."""
    run = load_run(path, what)
    if run.task != "train" or run.algo is None:
        raise RunDirError(
            f"{what} {path}: it is an {run.task} run (task={run.task}); this takes a training run "
            "directory (task=train)"
        )
    return run


# ---------------------------------------------------------------------------------------------------
# overrides
# ---------------------------------------------------------------------------------------------------
def override_key(override: str) -> str:
    """`+algo.lr=1` -> `algo.lr`; `~agent.prefill` -> `agent.prefill`."""
    return override.split("=", 1)[0].lstrip("~+")


def override_value(override: str) -> Any:
    """The value of one `key=value` override as Hydra parses it (quotes removed); a list for a sweep."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides([override])[0]
    return list(parsed.sweep_string_iterator()) if parsed.is_sweep_override() else parsed.value()


def under(key: str, prefixes: tuple[str, ...]) -> bool:
    """`key` is one of `prefixes` or below one (`algo.lr` is under `algo`)."""
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def merge_overrides(previous: list[str], extra: list[str], groups: tuple[str, ...] = ()) -> list[str]:
    """`previous` with what `extra` sets replaced in place (the last value of a key wins), then the rest
    of `extra` in order. An extra `<group>=<option>` in `groups` also drops the previous keys under
    that group (they belong to the old option)."""
    latest = {override_key(o): o for o in extra}
    replaced = tuple(k for k in latest if k in groups)
    merged: list[str] = []
    placed: set[str] = set()
    for item in previous:
        key = override_key(item)
        if key in latest:
            if key not in placed:
                merged.append(latest[key])
                placed.add(key)
        elif not under(key, replaced):
            merged.append(item)
    for item in extra:
        key = override_key(item)
        if key not in placed:
            merged.append(latest[key])
            placed.add(key)
    return merged


def quote(value: Any) -> str:
    """A value as Hydra override text: a single-quoted string (paths may hold `=`, `,` or spaces)."""
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def shell_override(key: str, value: Any) -> str:
    """`key=value` as one word of a command a user can paste into a shell: Hydra-quoted where Hydra would
    read the value otherwise (a `,` makes a sweep), shell-quoted where the shell would split or expand it
    (`'resume=/runs/my run'`)."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    text = f"{key}={value}"
    try:
        plain = OverridesParser.create().parse_override(text).value() == str(value)
    except Exception:  # noqa: BLE001 - Hydra's parser refuses it: quote it
        plain = False
    if not plain:
        text = f"{key}={quote(value)}"
    if "'" in text and not any(c in text for c in '"$`\\!'):
        return f'"{text}"'  # reads better than shlex's '"'"'
    return shlex.quote(text)


__all__ = [
    "LOCK_FILE",
    "RUN_MARKERS",
    "STATES",
    "STATUS_FILE",
    "RunLock",
    "SavedRun",
    "claim",
    "effective_status",
    "end_status",
    "is_complete",
    "last_metrics_time",
    "metrics_time_at",
    "load_run",
    "load_train_run",
    "lock_holder",
    "merge_overrides",
    "new_run_id",
    "override_key",
    "quote",
    "read_status",
    "register_resolvers",
    "run_marker",
    "start_status",
    "write_status",
]
