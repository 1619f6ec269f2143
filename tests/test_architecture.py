"""The import graph: layers import only the layers above them, there are no cycles, envs know nothing
about language models, and trainers import no environment module but the base types (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentrl"

# Lower number = higher layer. A module may import modules of its own rank or a smaller one.
RANKS = {
    "agentrl": 1,  # the package root registers the envs' gymnasium ids
    "agentrl.errors": 0,
    "agentrl.types": 0,
    "agentrl.console": 0,
    "agentrl.runs.runlog": 0,
    "agentrl.config": 0,
    "agentrl.runs.rundir": 0,
    "agentrl.runs.checks": 0,
    "agentrl.runs.trackers": 0,  # report_to: MetricsLog mirrors its rows to the run's trackers  # what the layers' checks before launch share (CUDA, installed libraries)  # run directories, locks, status.json: read by the runner and by report
    "agentrl.sandbox": 1,  # the OS boundary for model-written code (DataSciCoding runs through it)
    "agentrl.envs": 1,
    "agentrl.kernels": 1,  # compute paths that agents/ and trainers/ both use
    "agentrl.models": 2,
    "agentrl.agents": 2,
    "agentrl.rollout": 3,
    "agentrl.evaluation": 4,
    "agentrl.algos": 4,
    "agentrl.trainers": 5,
    "agentrl.report": 5,
    "agentrl.runs.trained": 5,
    "agentrl.runs.card": 5,  # model cards of a trained run's weights, and push to the Hub  # runs as models: from_run (evaluate one) and init_from (train from one)
    "agentrl.runs.launch": 6,
    "agentrl.runs.plan": 6,  # the --dry-run summary of a run.dry_run plan
    "agentrl.runs.sweep": 6,
    "agentrl.runs.serve": 6,  # agentrl serve: an env behind openenv's server, answers read by the agent interface  # what `agentrl sweep` decides before and after the multirun
    "agentrl.cli": 7,
    "agentrl.__main__": 8,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: set[str]) -> set[str]:
    """agentrl modules imported anywhere in the file (module level and inside functions), except
    type-checking-only imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("agentrl")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentrl"):
            for alias in node.names:  # `from agentrl.x import y` may import the submodule agentrl.x.y
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    return found


def rank(module: str) -> int:
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        prefix = ".".join(parts[:k])
        if prefix in RANKS:
            return RANKS[prefix]
    raise AssertionError(f"{module} has no layer in RANKS")


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items()}


def test_every_module_has_a_layer_and_imports_only_upward():
    upward = [
        f"{name} (layer {rank(name)}) imports {dep} (layer {rank(dep)})"
        for name, deps in graph().items()
        for dep in deps
        if rank(dep) > rank(name)
    ]
    assert upward == []


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if dep == node or dep not in edges:
                continue
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_envs_know_nothing_about_language_models():
    heavy = {"torch", "transformers", "trl", "peft"}
    for path in (PACKAGE / "envs").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
        assert not names & heavy, path.name


def test_trainers_import_no_env_but_the_base_types():
    """Trainers receive the env factory from the runner (`agentrl.types.EnvFactory`): they import
    neither a concrete env nor the factory, only the env base types (`agentrl.envs.base`)."""
    for name, deps in graph().items():
        if name.startswith("agentrl.trainers"):
            envs = [
                d
                for d in deps
                if (d == "agentrl.envs" or d.startswith("agentrl.envs.")) and d != "agentrl.envs.base"
            ]
            assert envs == [], name


def test_every_layer_in_the_prelaunch_registry_has_its_check():
    """`check_job` walks `PRELAUNCH_CHECKS`: each named module contributes `prelaunch_check(cfg, machine)`,
    and no module outside the registry defines one that would never run."""
    import importlib
    import inspect

    from agentrl.runs.launch import PRELAUNCH_CHECKS

    for name in PRELAUNCH_CHECKS:
        check = importlib.import_module(name).prelaunch_check
        assert list(inspect.signature(check).parameters) == ["cfg", "machine"], name
    defined = {
        name for name, path in modules().items() if "def prelaunch_check(" in path.read_text(encoding="utf-8")
    }
    assert defined == set(PRELAUNCH_CHECKS)
