"""Run untrusted, model-written Python code and call one function of it in a separate, limited process.

`run_function(code, "build_model", args)` checks the code, starts a fresh interpreter in a new temporary
directory (removed afterwards) and returns a `SandboxResult` (ok, value, reason, elapsed). The layers:

1. **Static check** (`check_code`, in the parent, before any process starts): the code must parse; every
   `import` must name a module of `ALLOWED_MODULES` (top-level name) and none of `FORBIDDEN_SUBMODULES`;
   the names in `FORBIDDEN_NAMES` (`eval`, `exec`, `open`, `compile`, `__import__`, `globals`,
   `getattr`, ...), dunder names and attributes (`__subclasses__`, `__globals__`, ...), frame and code
   attributes (`f_globals`, `gi_frame`, ...), string constants that spell a dunder, and assignments to
   attributes of imported modules (monkeypatching, e.g. of the scoring metric) are rejected.
2. **Process limits** (`resource.setrlimit` in the child, first thing): address space (`memory_mb`),
   CPU seconds (`cpu_s`), size of any file written (`file_mb`). The parent enforces a wall-clock
   timeout and kills the child's whole process group. RLIMIT_NPROC is not set: it counts every process
   of the user, not of the child, so a low value breaks thread creation depending on what else the
   user runs; process creation is refused by the audit hook instead.
3. **Inside the child**: the environment is minimal (no inherited variables: API keys stay out; one BLAS
   thread); the code runs with builtins that lack `open`, `eval`, `exec`, `compile`, `input`,
   `breakpoint`, `globals`, `locals`, `vars`, `getattr`, `setattr`, `delattr`, and an `__import__`
   that enforces the allow-list; a `sys.addaudithook` hook ends the child with a failure on sockets
   (no network), process creation (`subprocess`, `os.system`, `os.exec*`, `os.fork`, `os.posix_spawn`),
   further audit hooks, file writes or changes outside the temporary directory, and file reads outside
   it, the Python installation and a few system files the numeric libraries read (`/proc/self`, CPU
   and cgroup information, `/dev/null`, `/dev/urandom`). A violation ends the child at once, so code
   cannot catch it and carry on.

This protects against accidental damage by model-written code (a stray `rm`, a download, an endless
loop, a memory blow-up); it is not a security boundary against a determined attacker. Python-level
checks can be bypassed (native code of the allowed libraries runs unchecked, and an allowed library can
be monkeypatched to change what the scoring computes); code from an untrusted party needs an OS-level
sandbox (a container or VM without network, gVisor, nsjail).

The child is this file run as a script (`python -I sandbox.py`; `-I` keeps the script's directory,
where agentrl/types.py would shadow the standard library's `types`, off sys.path). Requests and results
travel as JSON, so the parent never unpickles what the child sends.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

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
#: Builtins removed from the namespace the code runs in (the static check rejects them too).
_REMOVED_BUILTINS = FORBIDDEN_NAMES - {"__import__"}
#: Where the child may read besides its directory and the Python installation (the numeric libraries
#: read CPU counts, cgroup quotas and memory information).
_EXTRA_READ_ROOTS = (
    "/proc/self",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/sys/fs/cgroup",
    "/sys/devices/system/cpu",
    "/dev/null",
    "/dev/urandom",
)
#: The file the child's stdout and stderr go to (inside its directory, so file_mb bounds it).
_OUTPUT_FILE = "output.txt"
_REASON_CHARS = 300


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed call."""

    timeout_s: float = 10.0  # wall clock of the whole child, interpreter start and imports included
    cpu_s: float | None = None  # CPU seconds (RLIMIT_CPU); None: timeout_s rounded up
    memory_mb: int = 2048  # address space (RLIMIT_AS); numpy + scikit-learn alone map about 500 MB
    file_mb: int = 16  # largest file the child may write (RLIMIT_FSIZE), its output included

    def cpu_seconds(self) -> int:
        return max(1, math.ceil(self.cpu_s if self.cpu_s is not None else self.timeout_s))


@dataclass
class SandboxResult:
    """What a sandboxed call gave: its JSON value when ok, else a one-line reason."""

    ok: bool
    value: Any = None
    reason: str = ""
    elapsed: float = 0.0  # seconds, the whole child included
    output: str = field(default="", repr=False)  # the tail of what the code printed


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


# ---- the parent side ----------------------------------------------------------------------------------
def run_function(
    code: str,
    function: str,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    limits: SandboxLimits | None = None,
    harness: str | None = None,
    static_check: bool = True,
    seed: int = 0,
) -> SandboxResult:
    """Run `code` in a sandboxed child and call its `function(*args, **kwargs)`; args, kwargs and the
    return value must be JSON-serialisable.

    `harness` ("module:function", trusted code) changes the call to `harness(fn, *args, **kwargs)`: the
    harness is imported, and its `prepare()` attribute called when it has one, before the audit hook is
    installed and before the code runs, so it can load data and hold its own references to the libraries
    it scores with. `seed` seeds `random` and numpy's global generator in the
    child. `static_check=False` skips `check_code` (tests use it to reach the child's own defences).
    """
    limits = limits or SandboxLimits()
    start = time.perf_counter()
    if static_check:
        problem = check_code(code)
        if problem:
            return SandboxResult(False, reason=problem, elapsed=time.perf_counter() - start)
    request = {
        "code": code,
        "function": function,
        "args": list(args),
        "kwargs": dict(kwargs or {}),
        "harness": harness,
        "seed": int(seed),
        "memory_mb": int(limits.memory_mb),
        "cpu_s": limits.cpu_seconds(),
        "file_mb": int(limits.file_mb),
        "project_root": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    }
    try:
        payload = json.dumps(request).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"sandbox arguments must be JSON-serialisable: {exc}") from exc
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="agentrl-sandbox-"))
    try:
        result = _run_child(payload, workdir, limits)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result.elapsed = time.perf_counter() - start
    return result


def _child_env(workdir: str) -> dict[str, str]:
    # Nothing is inherited: API keys and tokens in the parent's environment stay out of reach.
    env = {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[name] = "1"  # one BLAS thread: the address-space limit then bounds the data, not thread stacks
    return env


def _run_child(payload: bytes, workdir: str, limits: SandboxLimits) -> SandboxResult:
    output_path = os.path.join(workdir, _OUTPUT_FILE)
    with open(output_path, "wb") as output:
        proc = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=output,
            cwd=workdir,
            env=_child_env(workdir),
            start_new_session=True,  # its own process group, killed as a whole
            close_fds=True,
        )
        timed_out = False
        try:
            stdout, _ = proc.communicate(payload, timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            stdout, _ = proc.communicate()
        finally:
            _kill_group(proc.pid)  # whatever the child left behind
    printed = _tail(output_path)
    if timed_out:
        return SandboxResult(False, reason=f"timeout after {limits.timeout_s:g} s", output=printed)
    try:
        message = json.loads(stdout.decode("utf-8", "replace")) if stdout.strip() else None
    except ValueError:
        message = None
    if isinstance(message, dict) and "ok" in message:
        reason = _one_line(str(message.get("reason", "")))
        return SandboxResult(bool(message["ok"]), message.get("value"), reason, output=printed)
    return SandboxResult(False, reason=_exit_reason(proc.returncode, limits, printed), output=printed)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_reason(returncode: int, limits: SandboxLimits, printed: str) -> str:
    """Why a child ended without a result, from its exit status."""
    if returncode < 0:
        signum = -returncode
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
    return f"the process exited with status {returncode} and no result{detail}"


def _tail(path: str, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - limit, 0))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."


# ---- the child side -------------------------------------------------------------------------------------
class _Violation(Exception):
    """Raised (and never caught by user code: the child exits first) for a refused operation."""


def _child_main() -> None:  # pragma: no cover - runs in the child process
    import resource

    request = json.loads(sys.stdin.buffer.read().decode())
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (request["memory_mb"] * mb, request["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_CPU, (request["cpu_s"], request["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (request["file_mb"] * mb, request["file_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Python ignores SIGXFSZ (a write past the limit raises a vague OSError); the signal's default action
    # ends the child, and the parent names the limit.
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    # The result goes to the original stdout; whatever the code prints goes to the output file.
    result_fd = os.dup(1)
    os.dup2(2, 1)
    workdir = os.path.realpath(os.getcwd())
    function = request["function"]

    def finish(ok: bool, value: Any = None, reason: str = "") -> None:
        try:
            text = json.dumps({"ok": ok, "value": value, "reason": reason}, allow_nan=True)
        except (TypeError, ValueError):
            text = json.dumps({"ok": False, "reason": f"{function} returned a value that is not JSON data"})
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.write(result_fd, text.encode())
        os._exit(0)  # no finalizers or exit handlers of the code run after the result

    try:
        if request["project_root"] not in sys.path:
            sys.path.append(request["project_root"])
        harness = None
        if request["harness"]:
            import importlib

            module, _, name = request["harness"].partition(":")
            harness = getattr(importlib.import_module(module), name)
            prepare = getattr(harness, "prepare", None)
            if callable(prepare):
                prepare()
        import random

        random.seed(request["seed"])
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(request["seed"])
        compiled = compile(request["code"], "<submission>", "exec")
    except MemoryError:
        finish(False, reason=f"memory limit {request['memory_mb']} MB exceeded")
    except SyntaxError as exc:
        finish(False, reason=f"syntax error: {exc.msg} (line {exc.lineno})")
    except BaseException as exc:  # noqa: BLE001 - reported, never raised
        finish(False, reason=f"sandbox setup failed: {type(exc).__name__}: {exc}")

    _install_audit_hook(workdir, finish)
    namespace: dict[str, Any] = {"__name__": "submission", "__builtins__": _restricted_builtins(finish)}
    try:
        exec(compiled, namespace)  # noqa: S102 - the point of the sandbox
        fn = namespace.get(function)
        if not callable(fn):
            finish(False, reason=f"the code defines no function {function!r}")
        if harness is not None:
            value = harness(fn, *request["args"], **request["kwargs"])
        else:
            value = fn(*request["args"], **request["kwargs"])
    except MemoryError:
        finish(False, reason=f"memory limit {request['memory_mb']} MB exceeded")
    except RecursionError:
        finish(False, reason="maximum recursion depth exceeded")
    except BaseException as exc:  # noqa: BLE001 - any failure of the code is a result
        finish(False, reason=_describe_exception(exc, function))
    finish(True, value)


def _describe_exception(exc: BaseException, function: str) -> str:
    """`build_model raised ValueError: ... (line 4)` when the code's own frames are in the traceback."""
    import traceback

    # lookup_lines=False: reading the library sources for the traceback would trip the audit hook
    frames = traceback.StackSummary.extract(traceback.walk_tb(exc.__traceback__), lookup_lines=False)
    lines = [f.lineno for f in frames if f.filename == "<submission>"]
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if lines:
        return f"{function} raised {message} (line {lines[-1]})"
    return message


def _restricted_builtins(finish: Any) -> dict[str, Any]:
    import builtins

    names = dict(vars(builtins))
    for name in _REMOVED_BUILTINS:
        names.pop(name, None)
    real_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        # The code's own import statements come here (its namespace's builtins); libraries keep theirs.
        problem = "relative imports are not allowed" if level else _module_problem(name)
        if problem:
            finish(False, reason=problem)
        return real_import(name, globals, locals, fromlist, level)

    names["__import__"] = guarded_import
    return names


def _install_audit_hook(workdir: str, finish: Any) -> None:  # pragma: no cover - runs in the child
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    read_roots = tuple(os.path.realpath(p) for p in prefixes | set(_EXTRA_READ_ROOTS)) + (workdir,)
    write_roots = (workdir, "/dev/null")
    path_dirs = {os.path.realpath(p) for p in sys.path if p}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    process_events = (
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
    )
    path_events = {
        "os.remove": (0,),
        "os.rename": (0, 1),
        "os.rmdir": (0,),
        "os.mkdir": (0,),
        "os.chmod": (0,),
        "os.chown": (0,),
        "os.symlink": (0, 1),
        "os.link": (0, 1),
        "os.truncate": (0,),
        "os.utime": (0,),
        "shutil.rmtree": (0,),
        "shutil.copyfile": (1,),
        "shutil.copytree": (1,),
        "shutil.move": (0, 1),
    }

    def inside(path: Any, roots: tuple[str, ...]) -> bool:
        real = os.path.realpath(os.fsdecode(path))
        return any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)

    def refuse(reason: str) -> None:
        finish(False, reason=reason)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            if isinstance(path, int) or path is None:
                if isinstance(path, int) and path > 2:
                    refuse("opening a file descriptor is not allowed")
                return
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags
            )
            if writes and not inside(path, write_roots):
                refuse(f"writing {os.fsdecode(path)!r} is not allowed (outside the sandbox directory)")
            if not writes and not inside(path, read_roots):
                refuse(
                    f"reading {os.fsdecode(path)!r} is not allowed "
                    "(outside the sandbox directory and the Python installation)"
                )
        elif event in ("os.listdir", "os.scandir") and isinstance(args[0], str | bytes | os.PathLike):
            # the import system lists every sys.path directory (the project root among them)
            if not inside(args[0], read_roots) and os.path.realpath(os.fsdecode(args[0])) not in path_dirs:
                refuse(f"listing {os.fsdecode(args[0])!r} is not allowed (outside the sandbox directory)")
        elif event.startswith("socket."):
            refuse(f"network access is not allowed ({event})")
        elif event.startswith(process_events):
            refuse(f"starting processes is not allowed ({event})")
        elif event == "sys.addaudithook":
            refuse("adding audit hooks is not allowed")
        elif event in path_events:
            for k in path_events[event]:
                if k < len(args) and isinstance(args[k], str | bytes | os.PathLike):
                    if not inside(args[k], (workdir,)):
                        where = os.fsdecode(args[k])
                        refuse(f"{event} on {where!r} is not allowed (outside the sandbox directory)")

    sys.addaudithook(hook)


if __name__ == "__main__":  # the child process
    _child_main()

__all__ = [
    "ALLOWED_MODULES",
    "FORBIDDEN_NAMES",
    "SandboxLimits",
    "SandboxResult",
    "check_code",
    "run_function",
]
