"""What `agentrl sweep` decides before and after Hydra's multirun: the launcher is usable here, whether
the sweep trains or evaluates, and the summary table of its jobs."""

from __future__ import annotations

from pathlib import Path

from agentrl.console import console

#: agents that are played, never trained: a preset's algo does not make their sweep a training sweep
BASELINE_AGENTS = ("random", "planner", "human", "dqn")


#: the launchers `hydra/launcher=` takes: Hydra's own, its joblib and submitit plugins, and conf/hydra/launcher/
def sweep_launchers() -> list[str]:
    from agentrl.config import CONF_DIR

    ours = {p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml")}
    return sorted({"basic", "joblib", "submitit_local", "submitit_slurm", *ours})


def check_launcher(overrides: list[str]) -> None:
    """A launcher that is unknown, or that cannot submit from this machine, is one line before any job."""
    import importlib.util
    import shutil

    from agentrl.errors import ConfigError, UnknownChoiceError

    given = [o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == "hydra/launcher"]
    if not given:
        return
    launcher = given[-1]
    if launcher not in sweep_launchers():
        raise UnknownChoiceError("hydra/launcher", launcher, sweep_launchers())
    needs = {
        "joblib": "hydra_plugins.hydra_joblib_launcher",
        "submitit": "hydra_plugins.hydra_submitit_launcher",
    }
    for prefix, module in needs.items():
        if launcher.startswith(prefix) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"hydra/launcher={launcher} needs pip install hydra-{prefix}-launcher")
    if launcher in ("slurm", "submitit_slurm") and shutil.which("sbatch") is None:
        raise ConfigError(
            f"hydra/launcher={launcher} submits jobs with sbatch, which this machine does not have: run the "
            "sweep on a SLURM login node, or locally with hydra/launcher=basic or joblib"
        )


def sweep_trains(overrides: list[str]) -> bool:
    """A sweep trains when it names `algo=`, an `algo.*` key, or an experiment preset that sets the algo
    (`agentrl sweep experiment=frozenlake_learn algo.aaw.enabled=true,false`), unless the preset's algo
    is all there is and `agent=` names only baselines (`agentrl sweep experiment=rlft_bandit
    agent=random,planner` evaluates them on the preset's env)."""
    for override in overrides:
        key = override.partition("=")[0].lstrip("+~")
        if key == "algo" or key.startswith("algo."):
            return True
    agents = [
        name.strip()
        for override in overrides
        if override.partition("=")[0].lstrip("+") == "agent"
        for name in override.partition("=")[2].split(",")
    ]
    if agents and all(name in BASELINE_AGENTS for name in agents):
        return False
    return preset_sets_algo(overrides)


def preset_sets_algo(overrides: list[str]) -> bool:
    """An `experiment=` preset among the overrides names its algo (`override /algo: ...`)."""
    from omegaconf import OmegaConf

    from agentrl.config import CONF_DIR

    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") != "experiment":
            continue
        for option in value.split(","):
            path = CONF_DIR / "experiment" / f"{option.strip()}.yaml"
            preset = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else None
            defaults = preset.get("defaults") if isinstance(preset, dict) else None
            if any(isinstance(d, dict) and "override /algo" in d for d in defaults or []):
                return True
    return False


def _sweep_jobs(sweep_dir: Path) -> list[Path]:
    """The job directories of a sweep (each holds Hydra's .hydra/), in job order."""
    jobs = [p for p in Path(sweep_dir).iterdir() if p.is_dir() and (p / ".hydra").is_dir()]
    return sorted(jobs, key=lambda job: int(_job_number(job)) if _job_number(job).isdigit() else -1)


def _job_number(job: Path) -> str:
    """The job's number, which starts its directory's name (`3_1a2b_env=snake,...`)."""
    return job.name.partition("_")[0]


def _job_overrides(job: Path) -> list[str]:
    """The job's own overrides (.hydra/overrides.yaml): whole, unlike its directory's name."""
    from omegaconf import OmegaConf

    try:
        return [str(o) for o in OmegaConf.load(job / ".hydra" / "overrides.yaml")]
    except Exception:  # noqa: BLE001 - a job that wrote none is labelled by its number alone
        return []


def _job_identity(job: Path) -> tuple[str, str, str]:
    """env, agent (the algo of a training job) and seed from the job's .hydra/config.yaml."""
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
    except Exception:  # noqa: BLE001 - a job that wrote no config: its row shows the number and state only
        return "", "", ""
    algo = OmegaConf.select(cfg, "algo.name") if cfg.get("task") == "train" else None
    agent = algo or OmegaConf.select(cfg, "agent.name")
    return str(OmegaConf.select(cfg, "env.name") or ""), str(agent or ""), str(cfg.get("seed", ""))


def print_summary(sweep_dir: Path, expected: int | None = None) -> int:
    """The sweep's table, one row per job, then one line per job that did not complete, saying why (its
    status.json's reason; in the table a reason would widen its column over every other). Returns how
    many jobs did not complete, counting the `expected` jobs that left no directory."""
    import json

    from rich.markup import escape
    from rich.table import Table

    from agentrl.runs.rundir import effective_status, read_status

    # A job is labelled by its number and the overrides that set it apart from the other jobs beyond
    # env, agent and seed, as words the table can wrap.
    table = Table(title=f"sweep {sweep_dir}")
    table.add_column("job", overflow="fold")
    for col in ("env", "agent", "seed", "success", "return ± stderr", "length", "invalid"):
        table.add_column(col, no_wrap=col != "return ± stderr")  # the job column gives way first
    jobs = _sweep_jobs(sweep_dir)
    settings = {job: _job_overrides(job) for job in jobs}
    shared = set.intersection(*(set(s) for s in settings.values())) if len(jobs) > 1 else set()
    problems: list[str] = []
    for job in jobs:
        shown = ("task", "env", "agent", "seed")  # the task is the sweep's; the others have columns
        own = " ".join(
            o for o in settings[job] if o not in shared and o.partition("=")[0].lstrip("+~") not in shown
        )
        number = _job_number(job)
        label = f"{number} {own}".strip()
        try:
            m = json.loads((job / "eval.json").read_text())
        except (OSError, ValueError):
            state = effective_status(job) or "no eval.json"
            reason = (read_status(job) or {}).get("reason", "") if state != "no eval.json" else ""
            problems.append(f"job {number} {state}" + (f": {reason}" if reason else ""))
            env, agent, seed = _job_identity(job)
            table.add_row(escape(label), env, agent, seed, f"[red]{escape(state)}[/red]", "", "", "")
            continue
        table.add_row(
            escape(label),
            str(m.get("env")),
            str(m.get("agent")),
            str(m.get("seed")),
            _number(m.get("success_rate"), ".2f"),
            f"{_number(m.get('mean_return'), '.3f')} ± {_number(m.get('return_stderr'), '.3f')}",
            _number(m.get("mean_length"), ".1f"),
            _number(m.get("invalid_rate"), ".2f"),
        )
    console.print(table, soft_wrap=False)
    for problem in problems:
        console.print(problem, style="red", markup=False, highlight=False, soft_wrap=True)
    missing = max(0, (expected or 0) - len(jobs))
    if missing:
        console.print(
            f"{missing} of {expected} jobs left no directory under {sweep_dir} (see the log above)",
            style="red",
            markup=False,
            highlight=False,
        )
    console.print(f"[bold]sweep directory:[/bold] {escape(str(sweep_dir))}")
    return len(problems) + missing


def _number(value: object, spec: str) -> str:
    """A metric as the table shows it: `-` where eval.json has none (an eval stopped before its first
    episode)."""
    return format(value, spec) if isinstance(value, int | float) else "-"
