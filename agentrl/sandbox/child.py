"""The child side of `agentrl.sandbox`: run as a script (`python -I child.py`), inside the OS
sandbox (bubblewrap) or, with `sandbox=unsafe-local`, as a plain child process.

It imports nothing of agentrl (inside the sandbox only this file and the Python installation exist).
The request arrives on stdin: one line of JSON, then the input arrays as `.npz` bytes. The result goes
to the file descriptor named by the first argument: one line of JSON (`ok`, `kind`, `reason`), then the payload (JSON text or `.npy`
bytes). Everything here after the code starts runs in the same interpreter as the code, so the parent
trusts none of what arrives on it: it bounds and checks it (`agentrl.sandbox._parse_result`).

The in-interpreter checks (limited builtins, an import guard, an audit hook) are a first filter that
turns the common mistakes into clear one-line reasons; the boundary is the OS sandbox around this
process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

RESULT_FD = int(sys.argv[1]) if len(sys.argv) > 1 else 3  # the result pipe, passed by the parent
_REASON_CHARS = 300
_REMOVED_BUILTINS = (
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
)


def main() -> None:  # pragma: no cover - runs in the child process
    header, _, data = sys.stdin.buffer.read().partition(b"\n")
    request = json.loads(header)
    _set_limits(request["limits"])
    # Whatever the code prints goes to the output pipe (stdout and stderr are one pipe); the result
    # has its own descriptor.
    function = request["function"]

    def finish(ok: bool, value: Any = None, reason: str = "") -> None:
        _finish(ok, value, reason, function)

    try:
        arrays = _load_arrays(data) if data else {}
        harness = HARNESSES[request["harness"]]
        if request["harness"] == "fit_predict_proba":
            import numpy  # noqa: F401 - imported before the code runs, as its own reference
        import random

        random.seed(request["seed"])
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(request["seed"])
        compiled = compile(request["code"], "<submission>", "exec")
    except MemoryError:
        finish(False, reason=f"memory limit {request['limits']['memory_mb']} MB exceeded")
    except SyntaxError as exc:
        finish(False, reason=f"syntax error: {exc.msg} (line {exc.lineno})")
    except BaseException as exc:  # noqa: BLE001 - reported, never raised
        finish(False, reason=f"sandbox setup failed: {type(exc).__name__}: {exc}")

    builtins_ns: Any = __builtins__
    if request["inner_checks"]:
        _install_audit_hook(os.path.realpath(os.getcwd()), finish, request["extra_read_roots"])
        builtins_ns = _restricted_builtins(finish, request["allowed"], request["forbidden_submodules"])
    namespace: dict[str, Any] = {"__name__": "submission", "__builtins__": builtins_ns}
    try:
        exec(compiled, namespace)  # noqa: S102 - the point of the sandbox
        fn = namespace.get(function)
        if not callable(fn):
            finish(False, reason=f"the code defines no function {function!r}")
        value = harness(fn, request, arrays)
    except MemoryError:
        finish(False, reason=f"memory limit {request['limits']['memory_mb']} MB exceeded")
    except RecursionError:
        finish(False, reason="maximum recursion depth exceeded")
    except BaseException as exc:  # noqa: BLE001 - any failure of the code is a result
        finish(False, reason=_describe_exception(exc, function))
    finish(True, value)


def _set_limits(limits: dict[str, int]) -> None:
    import resource

    mb = 1024 * 1024
    pairs = {
        resource.RLIMIT_AS: limits["memory_mb"] * mb,
        resource.RLIMIT_CPU: limits["cpu_s"],
        resource.RLIMIT_FSIZE: limits["file_mb"] * mb,
        resource.RLIMIT_NOFILE: limits["nofile"],
        resource.RLIMIT_CORE: 0,
    }
    # RLIMIT_NPROC is set here, inside the user namespace, so that it counts the sandbox's processes
    # only (Linux >= 5.14 keeps the count per user namespace); set before bwrap it would cap the user's
    # processes on the whole machine.
    if limits.get("nproc"):
        pairs[resource.RLIMIT_NPROC] = limits["nproc"]
    for which, value in pairs.items():
        hard = value + 1 if which == resource.RLIMIT_CPU else value  # SIGXCPU first, SIGKILL a second later
        resource.setrlimit(which, (value, hard))
    # Python ignores SIGXFSZ (a write past the limit then raises a vague OSError); the default action
    # ends the child, and the parent names the limit.
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)


def _load_arrays(data: bytes) -> dict[str, Any]:
    import io

    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _finish(ok: bool, value: Any, reason: str, function: str) -> None:
    """Write the result on the result pipe and end the process at once (no finalizers of the code run)."""
    kind, payload = "json", b""
    if ok:
        try:
            kind, payload = _encode(value)
        except (TypeError, ValueError):
            ok, reason = False, f"{function} returned a value that is not JSON data"
    line = " ".join(str(reason).split())
    reason = line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."
    head = json.dumps({"ok": ok, "kind": kind, "reason": reason}).encode() + b"\n"
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    data = memoryview(head + payload)
    while data:
        data = data[os.write(RESULT_FD, data) :]
    os._exit(0)


def _encode(value: Any) -> tuple[str, bytes]:
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        import io

        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return "npy", buffer.getvalue()
    return "json", json.dumps(value, allow_nan=True).encode()


# ---- the harnesses: how the code's function is called -------------------------------------------------
def _call(fn: Any, request: dict[str, Any], arrays: dict[str, Any]) -> Any:
    """fn(*args, **kwargs) with the request's JSON arguments."""
    return fn(*request["args"], **request["kwargs"])


def _fit_predict_proba(fn: Any, request: dict[str, Any], arrays: dict[str, Any]) -> Any:
    """For each split k: model = fn(X_train_k, y_train_k); model.predict_proba(X_test_k), shape-checked.
    Returns the predictions of all splits as one float array (splits, test rows, classes)."""
    import numpy as np

    classes = int(request["kwargs"]["classes"])
    out = []
    for k in range(int(request["kwargs"]["splits"])):
        x_test = arrays[f"X_test_{k}"]
        model = fn(arrays[f"X_train_{k}"].copy(), arrays[f"y_train_{k}"].copy())
        predict = getattr(model, "predict_proba", None)
        if not callable(predict):
            raise ValueError(
                f"{request['function']} must return a fitted estimator with predict_proba, "
                f"got {type(model).__name__}"
            )
        proba = np.asarray(predict(x_test.copy()), dtype=np.float64)
        if proba.shape != (len(x_test), classes):
            raise ValueError(
                f"predict_proba returned shape {proba.shape}, expected ({len(x_test)}, {classes})"
            )
        out.append(proba)
    return np.stack(out)


HARNESSES = {"call": _call, "fit_predict_proba": _fit_predict_proba}


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


# ---- the first filter: builtins, imports, audit hook ---------------------------------------------------
def _module_problem(module: str, allowed: list[str], forbidden: list[str]) -> str | None:
    parts = module.split(".")
    if parts[0] not in allowed:
        return f"import of {parts[0]!r} is not allowed"
    for k in range(2, len(parts) + 1):
        if ".".join(parts[:k]) in forbidden:
            return f"import of {'.'.join(parts[:k])!r} is not allowed"
    if any(p.startswith("__") and p.endswith("__") for p in parts):
        return f"import of {module!r} is not allowed"
    return None


def _restricted_builtins(finish: Any, allowed: list[str], forbidden: list[str]) -> dict[str, Any]:
    import builtins

    names = dict(vars(builtins))
    for name in _REMOVED_BUILTINS:
        names.pop(name, None)
    real_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        # The code's own import statements come here (its namespace's builtins); libraries keep theirs.
        problem = "relative imports are not allowed" if level else _module_problem(name, allowed, forbidden)
        if problem:
            finish(False, reason=problem)
        return real_import(name, globals, locals, fromlist, level)

    names["__import__"] = guarded_import
    return names


_PROCESS_EVENTS = (
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
_PATH_EVENTS = {
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


def _install_audit_hook(workdir: str, finish: Any, extra_read_roots: list[str]) -> None:
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    read_roots = tuple(os.path.realpath(p) for p in prefixes | set(extra_read_roots)) + (workdir,)
    write_roots = (workdir, "/dev/null")
    path_dirs = {os.path.realpath(p) for p in sys.path if p}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def inside(path: Any, roots: tuple[str, ...]) -> bool:
        real = os.path.realpath(os.fsdecode(path))
        return any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots)

    def check_open(path: Any, mode: Any, flags: Any) -> None:
        if isinstance(path, int) or path is None:
            if isinstance(path, int) and path > 2:
                finish(False, reason="opening a file descriptor is not allowed")
            return
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & write_flags
        )
        if writes and not inside(path, write_roots):
            finish(
                False, reason=f"writing {os.fsdecode(path)!r} is not allowed (outside the sandbox directory)"
            )
        if not writes and not inside(path, read_roots):
            finish(
                False,
                reason=f"reading {os.fsdecode(path)!r} is not allowed "
                "(outside the sandbox directory and the Python installation)",
            )

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            check_open(*(list(args) + [None, None, None])[:3])
        elif event in ("os.listdir", "os.scandir") and isinstance(args[0], str | bytes | os.PathLike):
            # the import system lists every sys.path directory
            if not inside(args[0], read_roots) and os.path.realpath(os.fsdecode(args[0])) not in path_dirs:
                finish(
                    False,
                    reason=f"listing {os.fsdecode(args[0])!r} is not allowed (outside the sandbox directory)",
                )
        elif event.startswith("socket."):
            finish(False, reason=f"network access is not allowed ({event})")
        elif event.startswith(_PROCESS_EVENTS):
            finish(False, reason=f"starting processes is not allowed ({event})")
        elif event == "sys.addaudithook":
            finish(False, reason="adding audit hooks is not allowed")
        elif event in _PATH_EVENTS:
            for k in _PATH_EVENTS[event]:
                if (
                    k < len(args)
                    and isinstance(args[k], str | bytes | os.PathLike)
                    and not inside(args[k], (workdir,))
                ):
                    where = os.fsdecode(args[k])
                    finish(
                        False, reason=f"{event} on {where!r} is not allowed (outside the sandbox directory)"
                    )

    sys.addaudithook(hook)


if __name__ == "__main__":
    main()
