"""agentrl.sandbox: every limit and refusal gives a failed result with a clear reason, correct code returns
its value, the first filter (static check, the child's own checks) gives its clear reasons, and a machine
without the OS sandbox refuses with one line. tests/test_sandbox_escapes.py attacks the OS boundary."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from agentrl import sandbox
from agentrl.sandbox import SandboxLimits, check_code, run_function, sandbox_problem

FAST = SandboxLimits(timeout_s=20, memory_mb=1024)
NO_SANDBOX = sandbox_problem()
needs_sandbox = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no OS sandbox here: {NO_SANDBOX}")
#: the modes this machine can run (unsafe-local always)
MODES = [pytest.param("bwrap", marks=needs_sandbox), "unsafe-local"]
#: the OS sandbox where this machine has it, else the plain child: the first filter's reasons are the same
HERE = "bwrap" if NO_SANDBOX is None else "unsafe-local"


def run_here(*args, **kwargs):
    return run_function(*args, mode=HERE, **kwargs)


@pytest.fixture(autouse=True)
def _sandbox_dirs_in_tmp(tmp_path, monkeypatch):
    """Sandbox directories go under tmp_path/sandboxes, so each test can check they are removed."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield
    assert list(root.iterdir()) == [], "a sandbox directory was left behind"


def test_a_correct_function_returns_its_value():
    code = (
        "import math\n\ndef f(a, b, scale=1):\n    return {'sum': (a + b) * scale, 'pi': round(math.pi, 2)}\n"
    )
    result = run_here(code, "f", [2, 3], {"scale": 10}, limits=FAST)
    assert result.ok and result.reason == ""
    assert result.value == {"sum": 50, "pi": 3.14}
    assert 0 < result.elapsed < 20


@pytest.mark.parametrize("mode", MODES)
def test_numpy_code_runs_and_may_use_its_own_directory(mode):
    code = (
        "import numpy as np\nimport random\n\n"
        "def f():\n"
        "    np.save('local.npy', np.arange(4))\n"
        "    return [float(np.load('local.npy').sum()), random._os.getcwd()]\n"
    )
    # random._os: to see the directory
    result = run_function(code, "f", limits=FAST, static_check=False, mode=mode)
    assert result.ok, result.reason
    total, workdir = result.value
    assert total == 6.0
    if mode == "bwrap":
        assert workdir == "/sandbox"  # a tmpfs of the sandbox's own
    else:
        assert os.path.basename(workdir).startswith("agentrl-sandbox-")
        assert not os.path.exists(workdir)  # removed afterwards


def test_the_child_interpreter_writes_no_bytecode(monkeypatch):
    """Packages installed without compiling (`pip install --no-compile`, a bare GPU image's numpy) have no
    __pycache__: the child interpreter runs with -B in both modes, so an allowed import writes nothing
    beside the package (outside the sandbox directory, which the unsafe-local child refuses: "os.mkdir on
    .../numpy/__pycache__ is not allowed")."""
    from agentrl.sandbox import bwrap as sandbox_bwrap

    argv = sandbox_bwrap.bwrap_command("child.py", {}, 64, None, ["out"])
    assert argv[argv.index("--") + 1 :][1:3] == ["-I", "-B"]
    seen: list[list[str]] = []

    def refuse(args, **kwargs):
        seen.append(list(args))
        raise OSError("not started")

    monkeypatch.setattr(sandbox.subprocess, "Popen", refuse)
    run_function("def f():\n    return 1\n", "f", limits=FAST, mode="unsafe-local")
    assert seen and seen[0][1:3] == ["-I", "-B"]


def test_arrays_go_in_and_an_array_comes_back():
    code = "def f(X, y):\n    return X * 2 + y[:, None]\n"
    model = (
        "import numpy as np\n\nclass M:\n    def predict_proba(self, X):\n"
        "        return np.tile([0.25, 0.75], (len(X), 1))\n\ndef f(X, y):\n    return M()\n"
    )
    arrays = {"X_train_0": np.ones((4, 2)), "y_train_0": np.arange(4), "X_test_0": np.zeros((3, 2))}
    result = run_here(
        model,
        "f",
        kwargs={"splits": 1, "classes": 2},
        arrays=arrays,
        harness="fit_predict_proba",
        limits=FAST,
    )
    assert result.ok, result.reason
    assert result.value.dtype == np.float64 and result.value.shape == (1, 3, 2)
    assert np.all(result.value[0] == [0.25, 0.75])
    result = run_here(
        code, "f", kwargs={"splits": 1, "classes": 3}, arrays=arrays, harness="fit_predict_proba", limits=FAST
    )
    assert not result.ok and result.reason.startswith("ValueError: f must return a fitted estimator")


def test_an_infinite_loop_times_out_and_its_process_group_is_killed():
    code = "def f():\n    while True:\n        pass\n"
    result = run_here(code, "f", limits=SandboxLimits(timeout_s=1, cpu_s=30))
    assert not result.ok and result.reason == "timeout after 1 s"
    assert result.elapsed < 10


def test_cpu_time_limit():
    code = "def f():\n    x = 0\n    while True:\n        x += 1\n"
    result = run_here(code, "f", limits=SandboxLimits(timeout_s=30, cpu_s=1))
    assert not result.ok and result.reason == "CPU time limit 1 s exceeded"


@pytest.mark.parametrize(
    "body",
    ["x = bytearray(8 * 1024 ** 3)", "x = []\n    while True:\n        x.append(bytearray(50 * 1024 ** 2))"],
    ids=["one-allocation", "growing"],
)
def test_memory_bomb(body):
    code = f"def f():\n    {body}\n    return 1\n"
    result = run_here(code, "f", limits=SandboxLimits(timeout_s=20, memory_mb=512))
    assert not result.ok and result.reason == "memory limit 512 MB exceeded"


def test_file_size_limit():
    code = "def f():\n    import numpy as np\n    np.save('big.npy', np.zeros(1_000_000))\n    return 1\n"
    result = run_here(code, "f", limits=SandboxLimits(timeout_s=20, file_mb=1))
    assert not result.ok and result.reason == "file size limit 1 MB exceeded (output or a written file)"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import socket", "import of 'socket' is not allowed (line 1)"),
        ("import os", "import of 'os' is not allowed (line 1)"),
        ("from subprocess import run", "import of 'subprocess' is not allowed (line 1)"),
        ("import numpy.ctypeslib", "import of 'numpy.ctypeslib' is not allowed (line 1)"),
        ("from . import x", "relative imports are not allowed (line 1)"),
        ("x = __import__('os')", "use of '__import__' is not allowed (line 1)"),
        ("x = open('/etc/passwd').read()", "use of 'open' is not allowed (line 1)"),
        ("eval('1 + 1')", "use of 'eval' is not allowed (line 1)"),
        ("exec('x = 1')", "use of 'exec' is not allowed (line 1)"),
        ("c = compile('1', 'f', 'eval')", "use of 'compile' is not allowed (line 1)"),
        ("g = globals()", "use of 'globals' is not allowed (line 1)"),
        ("x = ().__class__.__bases__[0].__subclasses__()", "access to attribute '__subclasses__'"),
        ("x = getattr((), '__class__')", "use of 'getattr' is not allowed (line 1)"),
        ("x = '{0.__class__}'.format(1)", "strings that name dunder attributes are not allowed"),
        ("import random\nrandom._os.system('true')", "access to attribute 'system' is not allowed (line 2)"),
        ("b = __builtins__", "use of '__builtins__' is not allowed (line 1)"),
        ("import numpy as np\nnp.argsort = sorted", "assigning to attributes of the imported 'np'"),
        ("def f(:\n  pass", "syntax error"),
    ],
)
def test_the_static_check_refuses(code, reason):
    assert reason in (check_code(code) or "")
    result = run_here(code, "f", limits=FAST)
    assert not result.ok and reason in result.reason


def test_the_static_check_allows_ordinary_modelling_code():
    code = (
        "import numpy as np\nfrom sklearn.linear_model import LogisticRegression\n"
        "from collections import Counter\n\n"
        "class Wrapper:\n    def __init__(self, m):\n        self.m = m\n\n"
        "def build_model(X, y):\n    if __name__ == 'submission':\n        pass\n"
        "    return Wrapper(LogisticRegression().fit(X, y))\n"
    )
    assert check_code(code) is None


# ---- the child's own defences (the static check bypassed or not catching the trick) ------------------
@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import socket\ndef f():\n    return 1\n", "import of 'socket' is not allowed"),
        ("def f():\n    return __import__('os').getcwd()\n", "import of 'os' is not allowed"),
        ("def f():\n    return open('/etc/passwd').read()\n", "NameError: name 'open' is not defined"),
        ("def f():\n    return eval('1')\n", "NameError: name 'eval' is not defined"),
    ],
)
def test_without_the_static_check_the_child_still_refuses(code, reason):
    result = run_here(code, "f", limits=FAST, static_check=False)
    assert not result.ok and reason in result.reason


def test_os_system_through_a_module_attribute_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    code = f"import random\ndef f():\n    random._os.system('touch {marker}')\n    return 1\n"
    result = run_here(code, "f", limits=FAST, static_check=False)
    assert not result.ok and result.reason == "starting processes is not allowed (os.system)"
    assert not marker.exists()


@pytest.mark.parametrize("mode", MODES)
def test_reading_outside_the_sandbox_is_refused_even_when_caught(mode):
    # /etc/ld.so.cache: a file outside the Python installation that the OS sandbox shows too
    code = (
        "import numpy as np\ndef f():\n    try:\n"
        "        return np.loadtxt('/etc/ld.so.cache', dtype=str, delimiter='\\n').tolist()\n"
        "    except BaseException:\n        return 'caught'\n"
    )
    assert check_code(code) is None  # only the child can see this one
    result = run_function(code, "f", limits=FAST, mode=mode)
    assert not result.ok and result.reason.startswith("reading '/etc/ld.so.cache' is not allowed")
    listing = "import random\ndef f():\n    return random._os.listdir('/etc')\n"
    result = run_function(listing, "f", limits=FAST, static_check=False, mode=mode)
    assert not result.ok and result.reason == "listing '/etc' is not allowed (outside the sandbox directory)"


def test_writing_or_deleting_outside_the_sandbox_is_refused(tmp_path):
    target, keep = tmp_path / "escape.npy", tmp_path / "keep.txt"
    keep.write_text("precious")
    write = f"import numpy as np\ndef f():\n    np.save({str(target)!r}, np.zeros(3))\n    return 1\n"
    result = run_here(write, "f", limits=FAST)
    assert (
        not result.ok
        and result.reason == f"writing {str(target)!r} is not allowed (outside the sandbox directory)"
    )
    delete = f"import random\ndef f():\n    random._os.remove({str(keep)!r})\n    return 1\n"
    result = run_here(delete, "f", limits=FAST, static_check=False)
    assert not result.ok and result.reason.startswith("os.remove on ")
    assert not target.exists() and keep.read_text() == "precious"


def test_network_access_is_refused():
    # the builtins module's own __import__, reached through sys.modules, bypasses the import guard; the
    # audit hook still refuses
    code = (
        "import random\ndef f():\n"
        "    socket = random._os.sys.modules['builtins'].__import__('socket')\n"
        "    socket.create_connection(('127.0.0.1', 9))\n"
    )
    assert "is not allowed" in check_code(code)  # refused statically too (private and dunder attributes)
    result = run_here(code, "f", limits=FAST, static_check=False)
    assert not result.ok and result.reason.startswith("network access is not allowed (socket.")


def test_failures_of_the_code_are_reported_with_the_line():
    result = run_here("def f():\n    x = 1\n    return x / 0\n", "f", limits=FAST)
    assert not result.ok and result.reason == "f raised ZeroDivisionError: division by zero (line 3)"
    result = run_here("def g():\n    return 1\n", "f", limits=FAST)
    assert not result.ok and result.reason == "the code defines no function 'f'"
    result = run_here("def f():\n    return {1, 2}\n", "f", limits=FAST)
    assert not result.ok and result.reason == "f returned a value that is not JSON data"


# ---- where the OS sandbox cannot run -------------------------------------------------------------------
def test_without_bubblewrap_the_sandbox_refuses_with_one_line(monkeypatch):
    from agentrl.envs.datascicoding import DataSciCodingEnv
    from agentrl.errors import ConfigError

    monkeypatch.setattr(sandbox.sandbox_bwrap, "BWRAP", "bwrap-not-installed")
    monkeypatch.setattr(sandbox, "_probe_result", [])
    problem = sandbox_problem()
    assert problem.startswith(
        "the DataSciCoding sandbox needs bubblewrap: install it (Debian/Ubuntu: apt-get"
    )
    assert "env.sandbox=unsafe-local" in problem and "\n" not in problem
    with pytest.raises(ConfigError, match="needs bubblewrap"):
        DataSciCodingEnv(dataset="iris")
    assert sandbox.main(["--check"]) == 1
    env = DataSciCodingEnv(dataset="iris", splits=1, sandbox="unsafe-local")  # the explicit opt-out runs
    env.reset(seed=0)
    _, reward, _, _, info = env.step(env.action_names.index("constant_prior"))
    assert reward == 0.5, info["reason"]


def test_unsafe_local_warns_once_per_process(caplog, monkeypatch):
    monkeypatch.setattr(sandbox, "_warned_unsafe", [])
    with caplog.at_level("WARNING", logger="agentrl.sandbox"):
        for _ in range(2):
            assert run_function("def f():\n    return 1\n", "f", limits=FAST, mode="unsafe-local").ok
    (record,) = caplog.records
    assert record.message.startswith(
        "env.sandbox=unsafe-local: model-written code runs without an OS boundary"
    )
