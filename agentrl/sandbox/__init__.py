"""Run untrusted, model-written Python code and call one function of it behind an OS boundary.

`run_function(code, "build_model", ...)` returns a `SandboxResult` (ok, value, reason, elapsed, output)
and never raises for anything the code does. The layers, outermost first (docs/envs.md, "The sandbox",
has the threat model):

1. **The OS sandbox** (`sandbox="bwrap"`, the default; `agentrl.sandbox.bwrap`): the child runs under
   bubblewrap as uid 65534 in new user, mount, PID, network, IPC, UTS and cgroup namespaces, without
   capabilities, under a seccomp filter (no new processes, no ptrace, mounts or namespaces), sees the
   Python installation read-only and nothing else of the host, and writes only to a tmpfs of `disk_mb`.
   When the wall-clock timeout passes, bwrap is killed and its PID namespace dies with it.
2. **Limits** set in the child before the code runs: address space, CPU seconds, file size, open files,
   processes (threads); the parent reads the child's output and result with a deadline and keeps at
   most `output_kb` of output and `result_mb` of result.
3. **Trust nothing the child writes**: the child gets its inputs (JSON arguments, numpy arrays) and
   sends back a value (JSON, at most 1 MB and 32 levels deep, or a numeric `.npy` array, its header and
   size checked); the parent parses it with those limits and never unpickles. The caller computes any
   score from the returned value (DataSciCoding keeps the test labels in the parent).
4. **A first filter** in front (`check_code`, static) and inside the child (limited builtins, an
   import guard, an audit hook): it turns the usual mistakes into clear one-line reasons. Nothing rests
   on it: Python-level checks can be bypassed.

`sandbox="unsafe-local"` runs the same child as a plain process (layers 2-4 only; the first call of a
process logs a warning): for machines without user namespaces or bubblewrap, and code you trust.
`python -m agentrl.sandbox --check` says whether this machine can run the OS sandbox.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.sandbox import bwrap as sandbox_bwrap

log = logging.getLogger(__name__)

#: how the child is run: "bwrap" (the OS sandbox) or "unsafe-local" (a plain child process)
SANDBOX_MODES: tuple[str, ...] = ("bwrap", "unsafe-local")
#: Top-level modules the code may import. Numeric and modelling libraries plus pure standard-library
#: helpers; nothing that touches files, processes, the network or the interpreter's internals (os, sys,
#: io, pathlib, subprocess, socket, shutil, ctypes, importlib, builtins, inspect, gc, pickle, operator and
#: string, whose attrgetter/Formatter reach attributes by a computed name, ...).
ALLOWED_MODULES: frozenset[str] = frozenset(
    {
        "numpy",
        "scipy",
        "sklearn",
        "math",
        "cmath",
        "statistics",
        "random",
        "collections",
        "itertools",
        "functools",
        "heapq",
        "bisect",
        "numbers",
        "fractions",
        "decimal",
        "typing",
        "dataclasses",
        "copy",
        "enum",
        "abc",
        "re",
        "warnings",
    }
)
#: Submodules of allowed packages that load native code, build extensions, or read and write files.
FORBIDDEN_SUBMODULES: frozenset[str] = frozenset(
    {"numpy.ctypeslib", "numpy.f2py", "numpy.distutils", "numpy.testing", "scipy.io", "sklearn.externals"}
)
#: Names the code may not use at all (builtins that run code, open files, or reach attributes by name).
FORBIDDEN_NAMES: frozenset[str] = frozenset(
    {
        "__import__",
        "eval",
        "exec",
        "compile",
        "open",
        "input",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "getattr",
        "setattr",
        "delattr",
        "memoryview",
        "exit",
        "quit",
        "help",
    }
)
#: Attributes that lead from ordinary objects to frames, code objects, other modules' globals, or modules
#: the code may not import (`random._os`, `os.sys.modules`).
FORBIDDEN_ATTRIBUTES: frozenset[str] = frozenset(
    {
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_back",
        "f_code",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "ag_code",
        "tb_frame",
        "tb_next",
        "co_code",
        "system",
        "popen",
        "os",
        "_os",
        "sys",
        "modules",
        "builtins",
        "importlib",
        "subprocess",
        "socket",
        "ctypes",
        "ctypeslib",
        "load_library",
    }
)
_DUNDER = re.compile(r"__\w+__")
#: Where the child may read besides its directory and the Python installation (the numeric libraries
#: read CPU counts, cgroup quotas and memory information).
_EXTRA_READ_ROOTS = (
    "/proc/self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/sys/fs/cgroup",
    "/sys/devices/system/cpu",
    "/dev/null",
    "/dev/urandom",
    "/usr/share/zoneinfo",  # pandas (which scikit-learn imports) reads time zones
)
_REASON_CHARS = 300


# ---- the static check -------------------------------------------------------------------------------
def check_code(code: str) -> str | None:
    """Why `code` may not run (one line), or None when it passes the static check."""
    try:
        tree = ast.parse(code, filename="<submission>")
    except SyntaxError as exc:
        return f"syntax error: {exc.msg} (line {exc.lineno})"
    except (ValueError, MemoryError, RecursionError) as exc:  # null bytes, absurd nesting
        return f"the code cannot be parsed: {type(exc).__name__}"
    modules = _imported_names(tree)
    for node in ast.walk(tree):
        problem = _node_problem(node) or _monkeypatch_problem(node, modules)
        if problem:
            line = getattr(node, "lineno", None)
            return f"{problem} (line {line})" if line else problem
    return None


def _imported_names(tree: ast.AST) -> set[str]:
    """Names the code binds to imported modules or their members (`np`, `sklearn`, `metrics`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _monkeypatch_problem(node: ast.AST, modules: set[str]) -> str | None:
    """Assigning to an attribute of an imported module (`np.argsort = ...`) would let the code change
    what the scoring computes: a reward hack, refused."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in modules:
            return f"assigning to attributes of the imported {root.id!r} is not allowed"
    return None


def _module_problem(module: str) -> str | None:
    top = module.split(".")[0]
    if top not in ALLOWED_MODULES:
        return f"import of {top!r} is not allowed"
    parts = module.split(".")
    for k in range(2, len(parts) + 1):
        if ".".join(parts[:k]) in FORBIDDEN_SUBMODULES:
            return f"import of {'.'.join(parts[:k])!r} is not allowed"
    if any(_DUNDER.fullmatch(p) for p in parts):
        return f"import of {module!r} is not allowed"
    return None


def _node_problem(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            problem = _module_problem(alias.name)
            if problem:
                return problem
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            return "relative imports are not allowed"
        problem = _module_problem(node.module or "")
        if problem:
            return problem
        for alias in node.names:
            if alias.name == "*" or _DUNDER.fullmatch(alias.name) or alias.name in FORBIDDEN_ATTRIBUTES:
                return f"importing {alias.name!r} from {node.module!r} is not allowed"
            problem = _module_problem(f"{node.module}.{alias.name}")
            if problem and f"{node.module}.{alias.name}" in FORBIDDEN_SUBMODULES:
                return problem
    elif isinstance(node, ast.Name):
        if node.id in FORBIDDEN_NAMES:
            return f"use of {node.id!r} is not allowed"
        if _DUNDER.fullmatch(node.id) and node.id != "__name__":
            return f"use of {node.id!r} is not allowed"
    elif isinstance(node, ast.Attribute):
        if _DUNDER.fullmatch(node.attr) or node.attr in FORBIDDEN_ATTRIBUTES:
            return f"access to attribute {node.attr!r} is not allowed"
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        # str.format and friends reach attributes through text ("{0.__class__}")
        if _DUNDER.search(node.value):
            return "strings that name dunder attributes are not allowed"
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if node.name in FORBIDDEN_NAMES:
            return f"defining {node.name!r} is not allowed"
    elif isinstance(node, ast.Global | ast.Nonlocal):
        if any(_DUNDER.fullmatch(n) for n in node.names):
            return "use of dunder names is not allowed"
    return None


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed call."""

    timeout_s: float = 10.0  # wall clock of the whole child, interpreter start and imports included
    cpu_s: float | None = None  # CPU seconds (RLIMIT_CPU); None: timeout_s rounded up
    memory_mb: int = 2048  # address space (RLIMIT_AS); numpy + scikit-learn alone map about 500 MB
    file_mb: int = 16  # largest file the child may write (RLIMIT_FSIZE)
    disk_mb: int = 64  # size of the child's only writable directory (a tmpfs; bwrap only)
    result_mb: int = 16  # largest result the parent reads (more: an error)
    output_kb: int = 64  # the tail of the printed output the parent keeps (the rest is read and dropped)
    nproc: int = 64  # processes and threads of the sandbox user (RLIMIT_NPROC; bwrap only)
    nofile: int = 256  # open file descriptors (RLIMIT_NOFILE)

    def cpu_seconds(self) -> int:
        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s))


@dataclass
class SandboxResult:
    """What a sandboxed call gave: its value (JSON data or a numpy array) when ok, else a one-line reason."""

    ok: bool
    value: Any = None
    reason: str = ""
    elapsed: float = 0.0  # seconds, the whole child included
    output: str = field(default="", repr=False)  # the tail of what the code printed


# ---- is the OS sandbox available? --------------------------------------------------------------------------
def sandbox_problem() -> str | None:
    """Why the OS sandbox cannot run on this machine (one line naming what to install or enable), or None.
    Checked once per process: a trivial program runs in the sandbox."""
    return _probe()


_probe_result: list[str | None] = []


def _probe() -> str | None:
    if _probe_result:
        return _probe_result[0]
    problem = None
    if shutil.which(sandbox_bwrap.BWRAP) is None:
        problem = (
            "the DataSciCoding sandbox needs bubblewrap: install it (Debian/Ubuntu: apt-get install "
            "bubblewrap; Fedora: dnf install bubblewrap), or set env.sandbox=unsafe-local to run model "
            "code without an OS boundary"
        )
    elif sandbox_bwrap.seccomp_program() is None:
        problem = (
            "the DataSciCoding sandbox needs libseccomp for its seccomp filter: install it (Debian/Ubuntu: "
            "apt-get install libseccomp2), or set env.sandbox=unsafe-local"
        )
    else:
        result = run_function(
            "def f():\n    return 1\n", "f", limits=SandboxLimits(timeout_s=60), mode="bwrap"
        )
        if not (result.ok and result.value == 1):
            problem = (
                f"the DataSciCoding sandbox (bubblewrap) cannot start here ({result.reason}); user "
                "namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces > 0, or an AppArmor profile for bwrap), or set "
                "env.sandbox=unsafe-local"
            )
    _probe_result.append(problem)
    return problem


def require_sandbox(mode: str) -> None:
    """Raise ConfigError (one line) when `mode` is "bwrap" and the OS sandbox cannot run here; warn once
    per process for "unsafe-local". The env calls it when it is built, so `agentrl train/eval` refuse
    before a run directory exists."""
    from agentrl.errors import ConfigError, UnknownChoiceError

    if mode not in SANDBOX_MODES:
        raise UnknownChoiceError("sandbox", mode, SANDBOX_MODES)
    if mode == "bwrap":
        problem = sandbox_problem()
        if problem:
            raise ConfigError(problem)
    else:
        _warn_unsafe()


_warned_unsafe: list[bool] = []


def _warn_unsafe() -> None:
    """Once per process, so once per agentrl run: the run's log says that its code ran unconfined."""
    if not _warned_unsafe:
        _warned_unsafe.append(True)
        log.warning(
            "env.sandbox=unsafe-local: model-written code runs without an OS boundary (same user, "
            "filesystem and network as agentrl; only Python-level checks and rlimits)"
        )


# ---- the parent side ----------------------------------------------------------------------------------
def run_function(
    code: str,
    function: str,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    arrays: dict[str, Any] | None = None,
    harness: str = "call",
    limits: SandboxLimits | None = None,
    static_check: bool = True,
    inner_checks: bool = True,
    seed: int = 0,
    mode: str = "bwrap",
) -> SandboxResult:
    """Run `code` in a sandboxed child and call its `function`; args, kwargs and a `call` harness's
    return value must be JSON-serialisable, `arrays` numpy arrays (sent as `.npz`).

    `harness`: "call" calls `function(*args, **kwargs)`; "fit_predict_proba" calls `model =
    function(X_train_k, y_train_k)` for each split k of `arrays` and returns the stacked
    `model.predict_proba(X_test_k)` (kwargs `splits`, `classes`). `seed` seeds `random` and numpy's global
    generator in the child. `static_check=False` skips `check_code` and `inner_checks=False` the child's
    own Python-level checks (the escape tests use both to face the OS boundary alone). `mode`:
    "bwrap" or "unsafe-local" (SANDBOX_MODES).
    """
    limits = limits or SandboxLimits()
    start = time.perf_counter()
    if mode not in SANDBOX_MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; valid choices: {', '.join(SANDBOX_MODES)}")
    if static_check:
        problem = check_code(code)
        if problem:
            return SandboxResult(False, reason=problem, elapsed=time.perf_counter() - start)
    payload = _request(code, function, args, kwargs, arrays, harness, limits, inner_checks, seed, mode)
    if mode == "unsafe-local":
        _warn_unsafe()
    result = _run_child(payload, limits, mode)
    result.elapsed = time.perf_counter() - start
    return result


def _request(code, function, args, kwargs, arrays, harness, limits, inner_checks, seed, mode) -> bytes:
    header = {
        "code": code,
        "function": function,
        "args": list(args),
        "kwargs": dict(kwargs or {}),
        "harness": harness,
        "seed": int(seed),
        "inner_checks": bool(inner_checks),
        "allowed": sorted(ALLOWED_MODULES),
        "forbidden_submodules": sorted(FORBIDDEN_SUBMODULES),
        "extra_read_roots": list(_EXTRA_READ_ROOTS),
        "limits": {
            "memory_mb": int(limits.memory_mb),
            "cpu_s": limits.cpu_seconds(),
            "file_mb": int(limits.file_mb),
            "nofile": int(limits.nofile),
            # outside a user namespace RLIMIT_NPROC counts every process of the user: not set there
            "nproc": int(limits.nproc) if mode == "bwrap" else 0,
        },
    }
    try:
        data = json.dumps(header).encode() + b"\n"
    except (TypeError, ValueError) as exc:
        raise ValueError(f"sandbox arguments must be JSON-serialisable: {exc}") from exc
    if arrays:
        import numpy as np

        buffer = io.BytesIO()
        np.savez(buffer, **{name: np.asarray(a) for name, a in arrays.items()})
        data += buffer.getvalue()
    return data


def _child_env(home: str) -> dict[str, str]:
    # Nothing is inherited: API keys and tokens in the parent's environment stay out of reach.
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[name] = "1"  # one BLAS thread: the address-space limit then bounds the data, not thread stacks
    return env


_CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")


def _run_child(payload: bytes, limits: SandboxLimits, mode: str) -> SandboxResult:
    result_read, result_write = os.pipe()
    extra_fds = [result_write]
    workdir = None
    if mode == "bwrap":
        seccomp = sandbox_bwrap.seccomp_fd()
        if seccomp is not None:
            extra_fds.append(seccomp)
        env = _child_env(sandbox_bwrap.WORKDIR)
        argv = sandbox_bwrap.bwrap_command(_CHILD_SCRIPT, env, limits.disk_mb, seccomp, [str(result_write)])
        cwd, popen_env = "/", {"PATH": os.defpath}  # bwrap's own environment (its /proc/1/environ): empty
    else:
        workdir = os.path.realpath(tempfile.mkdtemp(prefix="agentrl-sandbox-"))
        # -B: an uncompiled module (a pip --no-compile install) would otherwise write its .pyc beside
        # itself, outside the sandbox directory, which the audit hook refuses
        argv, cwd = [sys.executable, "-I", "-B", _CHILD_SCRIPT, str(result_write)], workdir
        popen_env = _child_env(workdir)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=popen_env,
            pass_fds=extra_fds,  # the result pipe (its number is the argument) and the BPF
            start_new_session=True,  # its own process group, killed as a whole
        )
    except OSError as exc:
        for fd in (result_read, *extra_fds):
            os.close(fd)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        return SandboxResult(False, reason=f"the sandbox could not start: {exc}")
    for fd in extra_fds:
        os.close(fd)
    try:
        outcome = _communicate(proc, payload, result_read, limits)
    finally:
        _kill_group(proc.pid)  # whatever the child left behind
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        os.close(result_read)
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return _outcome_result(outcome, proc.returncode, limits, mode)


@dataclass
class _Outcome:
    timed_out: bool = False
    overflow: bool = False
    output: bytearray = field(default_factory=bytearray)
    result: bytearray = field(default_factory=bytearray)


#: after the child exits, how long the parent still reads pipes that a leftover process holds open
_EXIT_GRACE_S = 0.2


def _communicate(proc: subprocess.Popen, payload: bytes, result_fd: int, limits: SandboxLimits) -> _Outcome:
    """Feed the request, read output and result until the child exits or the deadline passes; never wait
    for pipes beyond the deadline, never keep more than the limits."""
    out = _Outcome()
    deadline = time.monotonic() + limits.timeout_s
    keep, result_max = limits.output_kb * 1024, limits.result_mb * 1024 * 1024
    sel = selectors.DefaultSelector()
    for fd in (proc.stdin.fileno(), proc.stdout.fileno(), result_fd):
        os.set_blocking(fd, False)
    sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "in")
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
    sel.register(result_fd, selectors.EVENT_READ, "result")
    todo, exited_at = memoryview(payload), None
    with sel:
        while True:
            now = time.monotonic()
            if now >= deadline:
                out.timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and (not sel.get_map() or now - exited_at > _EXIT_GRACE_S):
                break  # after the grace period a leftover process may hold a pipe: not waited for
            if not sel.get_map():  # the child closed its pipes and runs on: wait for its end
                time.sleep(min(0.05, deadline - now))
                continue
            for key, _ in sel.select(timeout=min(0.1, deadline - now)):
                fd = key.fd
                if key.data == "in":
                    todo = _feed(sel, proc, todo)
                    continue
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                elif key.data == "out":
                    out.output += chunk
                    if len(out.output) > 2 * keep:
                        del out.output[:-keep]
                else:
                    out.result += chunk
                    if len(out.result) > result_max:
                        out.overflow = True
                        return out
    del out.output[:-keep]
    return out


def _feed(sel: selectors.BaseSelector, proc: subprocess.Popen, todo: memoryview) -> memoryview:
    try:
        todo = todo[os.write(proc.stdin.fileno(), todo[: 1 << 16]) :]
    except BlockingIOError:
        return todo
    except OSError:  # the child closed its stdin or ended
        todo = todo[:0]
    if not todo:
        sel.unregister(proc.stdin.fileno())
        proc.stdin.close()
    return todo


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _outcome_result(
    outcome: _Outcome, returncode: int | None, limits: SandboxLimits, mode: str
) -> SandboxResult:
    printed = outcome.output.decode("utf-8", "replace")
    if outcome.overflow:
        return SandboxResult(False, reason=f"the result is larger than {limits.result_mb} MB", output=printed)
    if outcome.timed_out:
        return SandboxResult(False, reason=f"timeout after {limits.timeout_s:g} s", output=printed)
    if returncode is None:  # still running after the grace period: a result on time does not count
        return SandboxResult(False, reason=f"timeout after {limits.timeout_s:g} s", output=printed)
    status = _exit_status(returncode, mode)
    if not outcome.result:
        return SandboxResult(False, reason=_exit_reason(status, limits, printed), output=printed)
    try:
        ok, value, reason = _parse_result(bytes(outcome.result))
    except ValueError as exc:
        return SandboxResult(False, reason=_one_line(f"malformed result: {exc}"), output=printed)
    if ok and status != 0:  # a result, then a crash: the result may be partial
        return SandboxResult(False, reason=_exit_reason(status, limits, printed), output=printed)
    return SandboxResult(ok, value if ok else None, reason, output=printed)


def _exit_status(returncode: int, mode: str) -> int:
    """The child's exit status as subprocess reports it (negative: a signal). bwrap exits with 128 + the
    signal that ended the command."""
    if mode == "bwrap" and returncode > 128:
        return -(returncode - 128)
    return returncode


def _exit_reason(status: int, limits: SandboxLimits, printed: str) -> str:
    """Why a child ended without a result, from its exit status."""
    if status < 0:
        signum = -status
        if signum == signal.SIGXCPU:
            return f"CPU time limit {limits.cpu_seconds()} s exceeded"
        if signum == signal.SIGXFSZ:
            return f"file size limit {limits.file_mb} MB exceeded (output or a written file)"
        if signum == signal.SIGKILL:
            return f"killed (SIGKILL; memory limit {limits.memory_mb} MB or the system's OOM killer)"
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"the process crashed ({name})"
    last = [line for line in printed.splitlines() if line.strip()]
    if last and "MemoryError" in last[-1]:
        return f"memory limit {limits.memory_mb} MB exceeded"
    detail = f": {_one_line(last[-1])}" if last else ""
    return f"the process exited with status {status} and no result{detail}"


# ---- reading the child's result: nothing in it is trusted ----------------------------------------------
_HEADER_MAX = 4096
_JSON_MAX = 1024 * 1024
_JSON_DEPTH = 32
_NPY_HEADER_MAX = 4096
_NPY_KINDS = "biuf"  # bool, integers, floats: no objects, strings or structured records


def _parse_result(data: bytes) -> tuple[bool, Any, str]:
    """(ok, value, reason) from the child's result bytes; ValueError (a one-line reason) when malformed."""
    newline = data.find(b"\n", 0, _HEADER_MAX + 1)
    if newline < 0:
        raise ValueError(f"no header line within {_HEADER_MAX} bytes")
    header = _loads_json(data[:newline], depth=1)
    if not isinstance(header, dict) or set(header) != {"ok", "kind", "reason"}:
        raise ValueError("the header is not {ok, kind, reason}")
    ok, kind, reason = header["ok"], header["kind"], header["reason"]
    if not isinstance(ok, bool) or kind not in ("json", "npy") or not isinstance(reason, str):
        raise ValueError("the header's fields have the wrong types")
    if not ok:
        return False, None, _one_line(reason) or "the code failed without a reason"
    payload = data[newline + 1 :]
    if kind == "npy":
        return True, _loads_npy(payload), ""
    if len(payload) > _JSON_MAX:
        raise ValueError(f"a JSON value larger than {_JSON_MAX // 1024} KB")
    return True, _loads_json(payload, depth=_JSON_DEPTH), ""


def _loads_json(data: bytes, depth: int) -> Any:
    """json.loads of bytes already bounded in size, then at most `depth` nested arrays/objects. The C
    decoder stops a deeper nesting bomb itself with RecursionError (its own depth guard)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"invalid JSON ({type(exc).__name__})") from None
    if _json_depth(value) > depth:
        raise ValueError(f"JSON nested deeper than {depth} levels")
    return value


def _json_depth(value: Any) -> int:
    """Nesting depth of decoded JSON, walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, list | dict):
            deepest = max(deepest, level + 1)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _loads_npy(data: bytes) -> Any:
    """A numeric array from `.npy` bytes: header read with a size limit, no pickles, and the data's
    length must match the header's shape before anything is allocated."""
    import numpy as np
    from numpy.lib import format as npy

    fp = io.BytesIO(data)
    try:
        version = npy.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(fp, max_header_size=_NPY_HEADER_MAX)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(fp, max_header_size=_NPY_HEADER_MAX)
        else:
            raise ValueError(f"npy version {version}")
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
        raise ValueError(f"invalid npy header ({_one_line(str(exc))[:80]})") from None
    if dtype.hasobject or dtype.kind not in _NPY_KINDS or dtype.fields is not None:
        raise ValueError(f"npy dtype {dtype} is not numeric")
    count = math.prod(shape)
    if count * dtype.itemsize != len(data) - fp.tell():
        raise ValueError(f"npy data of {len(data) - fp.tell()} bytes does not match shape {shape} {dtype}")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=fp.tell())
    return array.reshape(shape, order="F" if fortran else "C").copy()


def _one_line(text: str) -> str:
    # printable characters only: the child writes this text and terminals interpret control sequences
    line = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    """`python -m agentrl.sandbox --check`: can this machine run the OS sandbox?"""
    args = sys.argv[1:] if argv is None else argv
    if args != ["--check"]:
        print("usage: python -m agentrl.sandbox --check", file=sys.stderr)
        return 2
    bwrap = shutil.which(sandbox_bwrap.BWRAP)
    print(f"bubblewrap: {bwrap or 'not found'}")
    print(f"seccomp filter: {'libseccomp' if sandbox_bwrap.seccomp_program() else 'not available'}")
    problem = sandbox_problem()
    if problem:
        print(f"not available: {problem}")
        return 1
    print("the OS sandbox works; the escape suite: python -m pytest tests/test_sandbox_escapes.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = [
    "ALLOWED_MODULES",
    "FORBIDDEN_NAMES",
    "SANDBOX_MODES",
    "SandboxLimits",
    "SandboxResult",
    "check_code",
    "require_sandbox",
    "run_function",
    "sandbox_problem",
]
