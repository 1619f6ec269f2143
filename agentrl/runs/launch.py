"""Composes config -> builds objects -> dispatches; owns the run directory.

Every run goes through Hydra's own entry point (`hydra.main`), so `.hydra/` (resolved config,
overrides) and multirun launchers (basic, joblib, submitit) are Hydra's. Before Hydra starts, each
job's config is composed and checked here, so bad input fails with one line and no run directory is
created. A single run's directory is then chosen and locked here too (agentrl/runs/rundir.py), before Hydra
writes into it: a directory that already holds a run is never reused except by `resume`, and a second
process aimed at a directory in use is refused. Every job records `status.json`.

agentrl.distributed (and with it torch) is imported where a job starts, not with this module: the checks
before launch and `--dry-run` do without torch's import time.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from agentrl.algos import LLM_ALGORITHMS
from agentrl.config import CONF_DIR, CONFIG_GROUPS, compose_config, split_sweep
from agentrl.config.presets import preset_for_agent
from agentrl.errors import AgentRLError, ConfigError, RunDirError, TrainingInterrupted
from agentrl.runs import checks, trackers
from agentrl.runs.checks import Machine
from agentrl.runs.rundir import (
    STATUS_FILE,
    RunLock,
    SavedRun,
    claim,
    end_status,
    is_complete,
    last_metrics_time,
    load_train_run,
    merge_overrides,
    metrics_rows,
    override_key,
    override_value,
    quote,
    shell_override,
    start_status,
    under,
)
from agentrl.runs.trained import (
    eval_overrides,
    plays_trained_model,
    start_description,
    trained_model,
    with_init_weights,
)
from agentrl.types import Episode

log = logging.getLogger(__name__)

TASKS = ("eval", "train")
LLM_ALGOS = (*LLM_ALGORITHMS, "sft")  # RL on trainers/multistep.py; sft on TRL's SFTTrainer
TRAINERS = {
    "dqn": "agentrl.trainers.dqn:train_dqn",
    **{name: "agentrl.trainers.multistep:train_llm" for name in LLM_ALGORITHMS},
    "sft": "agentrl.trainers.sft:train_sft",
}
#: the algo key that says how much training a run asks for (resume continues a complete run only when
#: it grows)
BUDGET_KEYS = {"dqn": "total_timesteps"}
DEFAULT_BUDGET_KEY = "iterations"
#: keys of a run's overrides that a resume does not repeat: the command sets them again
NOT_REPEATED = ("task", "resume", "from_run", "hydra")
#: the modules whose `prelaunch_check(cfg, machine)` `check_job` runs, in this order (agentrl/runs/checks.py)
PRELAUNCH_CHECKS = (
    "agentrl.runs.launch",  # the task, the algo's trainer, launching several processes
    "agentrl.envs",  # the env builds
    "agentrl.agents",  # the agent, its generation backend, what the trainers can train
    "agentrl.models",  # the weights a training run loads
    "agentrl.trainers",  # what a trainer needs of the env (SFT's demonstrator)
    "agentrl.runs.trained",  # a run to train from (init_from=)
    "agentrl.runs.trackers",  # the experiment trackers report_to names are installed
)


# ---------------------------------------------------------------------------------------------
# checks before launch
# ---------------------------------------------------------------------------------------------
def check_job(overrides: list[str], problems: list[AgentRLError] | None = None) -> DictConfig:
    """Compose one job's config and check, before a run directory exists, what would make the run fail:
    config rules (raised at once), and what the run needs from this machine and its files (a model's
    weights, a library, CUDA, a trained model that fits the env). With `problems`, each failure of the
    second kind is appended there and the checks go on (--dry-run lists them all); else it raises.
    Each layer contributes its own checks (`PRELAUNCH_CHECKS`)."""
    import importlib

    cfg = compose_config(overrides)

    def machine(check: Any, *args: Any) -> None:
        try:
            check(*args)
        except AgentRLError as exc:
            if problems is None:
                raise
            problems.append(exc)

    for module in PRELAUNCH_CHECKS:
        importlib.import_module(module).prelaunch_check(cfg, machine)
    return cfg


def prelaunch_check(cfg: DictConfig, machine: Machine) -> None:
    """The runner's own checks: the task and the keys that only some tasks take, a trainer for the algo,
    and what launching several processes needs."""
    if cfg.task not in TASKS:
        raise ConfigError(f"unknown task {cfg.task!r}; valid choices: {', '.join(TASKS)}")
    from agentrl.kernels.features import requested

    requested()  # AGENTRL_CPU_FEATURES names only switches that exist
    if cfg.get("resume") is not None:
        raise ConfigError(f"resume={cfg.resume}: continues one training run: agentrl train resume=<run dir>")
    if cfg.task == "train" and cfg.get("from_run") is not None:
        raise ConfigError(f"from_run={cfg.from_run}: is for eval (agentrl eval from_run=<run dir>)")
    # A transfer preset without a run would quietly evaluate the base LLM; a baseline agent (random,
    # planner, ...) has no run to transfer, and plays the preset's env as the floor of its table.
    baseline = cfg.task == "eval" and cfg.agent.name != "llm"
    if cfg.get("from_run_env") is not None and cfg.get("from_run") is None and not baseline:
        raise ConfigError(
            f"from_run_env={cfg.from_run_env}: evaluates a trained run on another env; give the run: "
            "agentrl eval from_run=<run dir> (with this preset or from_run_env=<env>)"
        )
    if cfg.task == "train":
        if cfg.get("algo") is None:
            raise ConfigError(
                f"train needs algo=<name>; valid choices: {', '.join(sorted(TRAINERS))}" + _baseline_hint(cfg)
            )
        if cfg.algo.name not in TRAINERS:
            raise ConfigError(
                f"no trainer for algo {cfg.algo.name!r}; valid choices: {', '.join(sorted(TRAINERS))}"
            )
        machine(check_distributed, cfg)
        machine(check_deepspeed, cfg)


def _baseline_hint(cfg: DictConfig) -> str:
    """A training job whose agent is a baseline is an evaluation the command took for training."""
    if cfg.agent.name in ("random", "planner", "human", "dqn"):
        return (
            f" (agent={cfg.agent.name} is evaluated, not trained: agentrl eval, or agentrl sweep --task eval)"
        )
    return ""


def check_distributed(cfg: DictConfig) -> None:
    """What `distributed=` needs on this machine: CUDA for every engine but ddp (which runs on the CPU
    over gloo), a process count when there is no GPU to count. Checked where the command would launch
    the processes; a process a launcher started is past that point (its launcher chose the engine)."""
    engine = str(OmegaConf.select(cfg, "distributed.name", default="none"))
    if cfg.task != "train" or engine == "none":
        return
    from agentrl import distributed as dist

    if dist.launched():
        return
    if _processes(cfg) > 1:
        from agentrl.config import typed

        dist.launcher_command(
            typed(cfg.distributed), [], cuda=checks.cuda_available()
        )  # raises what it cannot launch


def check_deepspeed(cfg: DictConfig) -> None:
    engine = str(OmegaConf.select(cfg, "distributed.name", default="none"))
    if cfg.task == "train" and engine in ("zero2", "zero3") and not checks.installed("deepspeed"):
        raise ConfigError(f"distributed={engine} needs DeepSpeed: pip install 'agentrl[deepspeed]'")


def check_sweep(jobs: list[list[str]]) -> DictConfig:
    """`check_job` for every job of a sweep before the first starts. A sweep with failing jobs is refused
    as a whole, naming each failing job and why (one line): nothing half-run to clean up or fill in
    later, and every job's problem is seen at once. Returns the last job's config."""
    cfg, failures = _sweep_failures(jobs)
    if failures:
        swept = _swept_keys(jobs)
        listed = "; ".join(
            f"job {number} ({' '.join(o for o in jobs[number] if override_key(o) in swept) or 'every job'}): "
            f"{exc}"
            for number, exc in failures
        )
        raise ConfigError(
            f"{len(failures)} of {len(jobs)} sweep jobs fail their checks, so none ran: {listed}"
        )
    assert cfg is not None
    return cfg


def _sweep_failures(jobs: list[list[str]]) -> tuple[DictConfig | None, list[tuple[int, AgentRLError]]]:
    """`check_job` of each job: the last good job's config and (job number, error) of each failing one."""
    failures: list[tuple[int, AgentRLError]] = []
    cfg: DictConfig | None = None
    for number, job in enumerate(jobs):
        try:
            cfg = check_job(job)
        except AgentRLError as exc:
            failures.append((number, exc))
            continue
        if _processes(cfg) > 1:
            raise ConfigError(
                "a sweep runs its jobs in one process each: run distributed training with agentrl train"
            )
    return cfg, failures


def sweep_plan(task: str, overrides: list[str]) -> tuple[list[str], list[str]]:
    """`agentrl sweep --dry-run`: (plan lines: the jobs, each by its swept values; one error line per
    failing job). Composed and checked as `launch` would, nothing run or created."""
    overrides = list(overrides)
    if task == "eval":
        overrides = eval_overrides(overrides)
    overrides = [f"task={task}", *preset_for_agent(overrides, CONF_DIR, CONFIG_GROUPS)]
    jobs = split_sweep(overrides)
    _, failures = _sweep_failures(jobs)
    swept = _swept_keys(jobs)
    where = next((o.split("=", 1)[1] for o in overrides if override_key(o) == "hydra.sweep.dir"), "?")
    lines = [
        f"dry run: agentrl sweep, {len(jobs)} {task} jobs (each checked; nothing run, no directory created)"
    ]
    lines += [
        f"  job {n}  {' '.join(o for o in job if override_key(o) in swept) or '(one job)'}"
        for n, job in enumerate(jobs)
    ]
    lines.append(f"  sweep dir  {where}")
    return lines, [f"job {number}: {exc}" for number, exc in failures]


def _swept_keys(jobs: list[list[str]]) -> set[str]:
    """The keys whose values differ between the jobs of a sweep."""
    values: dict[str, set[str]] = {}
    for job in jobs:
        for override in job:
            values.setdefault(override_key(override), set()).add(override)
    return {key for key, seen in values.items() if len(seen) > 1}


def resume_overrides(run: SavedRun, extra: list[str]) -> list[str]:
    """The overrides that recreate a run's config (its .hydra/overrides.yaml), with `extra` replacing
    what it sets. Nothing the command sets itself (task, resume, the run directory) is repeated, so
    overrides.yaml stays the run's own however often it is resumed."""
    previous = [o for o in run.overrides if not under(override_key(o), NOT_REPEATED)]
    return merge_overrides(previous, extra, CONFIG_GROUPS)


# ---------------------------------------------------------------------------------------------
# launching through Hydra
# ---------------------------------------------------------------------------------------------
_RESULTS: list[tuple[Path, dict[str, Any]]] = []
_LOCK: RunLock | None = None  # the directory launch() chose and locked for the job Hydra runs now


def launch(
    task: str,
    overrides: list[str],
    *,
    multirun: bool = False,
    resume: str | Path | None = None,
) -> list[tuple[Path, dict[str, Any]]]:
    """Check every job's config, choose and lock a single run's directory, then hand the command line
    to Hydra. `resume` (or a `resume=<dir>` override) continues a training run in its own directory.
    Returns (run_dir, metrics) for the jobs that ran in this process (the basic launcher); multirun
    callers read the sweep dir. A complete run asked for no more training returns [] untouched."""
    from agentrl import distributed as dist

    global _LOCK
    overrides = list(overrides)
    if task == "train" and not multirun:
        overrides, resume = _pop_resume(overrides, resume)
    if task == "eval":
        overrides = eval_overrides(overrides)
    overrides = preset_for_agent(overrides, CONF_DIR, CONFIG_GROUPS)
    given = list(overrides)  # what a relaunch passes on to its processes
    lock: RunLock | BorrowedLock | None = None
    if resume is not None:
        run = load_train_run(Path(resume), "cannot resume")
        overrides = [f"task={task}", *resume_overrides(run, overrides)]
        cfg = check_job(overrides)
        if cfg.algo.name != run.algo:
            raise RunDirError(
                f"cannot resume {run.root}: it trained algo={run.algo}, not algo={cfg.algo.name}"
            )
        if is_complete(run.root) and not _asks_for_more(cfg, run):
            _say_complete(run, cfg)
            return []
        if is_complete(run.root):
            check_continuable(run)
        lock = _claim(lambda: claim(run.root, resume=True), resume=True)
    else:
        overrides = [f"task={task}", *overrides]
        if multirun:
            cfg = check_sweep(split_sweep(overrides))
        else:
            cfg = check_job(overrides)
        if not multirun:
            lock = _claim(lambda: _claim_new(overrides), resume=False)
    if lock is not None and not dist.launched() and _processes(cfg) > 1:
        try:
            return _relaunch(task, given, resume, lock, cfg)
        finally:
            lock.release()
    if lock is not None:
        overrides = [o for o in overrides if override_key(o) != "hydra.run.dir"]
        overrides.append(f"hydra.run.dir={quote(lock.path)}")
    _RESULTS.clear()
    argv = sys.argv
    sys.argv = ["agentrl", *(["--multirun"] if multirun else []), *overrides]
    _LOCK = lock
    try:
        _hydra_main()
    finally:
        sys.argv = argv
        _LOCK = None
        if lock is not None:
            lock.release()
    return list(_RESULTS)


class BorrowedLock:
    """A run directory another process holds the lock of (the relaunching parent, or process 0 of a
    distributed run): this process writes into it but neither takes nor releases the lock."""

    def __init__(self, path: Path, resume: bool):
        self.path = Path(path).resolve()
        self.resume = resume

    def release(self) -> None:
        return None


def _claim(take: Any, *, resume: bool) -> RunLock | BorrowedLock | None:
    """`take()` the run directory's lock; under a launcher only process 0 takes it (or nobody, when the
    relaunching parent holds it) and every process learns the directory from it."""
    from agentrl import distributed as dist

    if not dist.launched():
        return take()
    dist.ensure_process_group()
    borrowed = os.environ.get(dist.LOCKED_RUN_DIR)
    if borrowed:
        return BorrowedLock(Path(borrowed), resume)
    lock, error = None, None
    if dist.is_main():
        try:
            lock = take()
        except AgentRLError as exc:  # the others learn of it below, then process 0 raises it
            error = exc
    path = dist.gather(str(lock.path) if lock is not None else None)[0]
    if error is not None:
        raise error
    if path is None:
        raise RunDirError("process 0 chose no run directory: name one with hydra.run.dir=<dir>")
    return lock if dist.is_main() else BorrowedLock(Path(path), resume)


def _processes(cfg: DictConfig) -> int:
    """How many processes a composed job asks for (1 without `distributed`, or outside train)."""
    node = cfg.get("distributed")
    if cfg.get("task") != "train" or node is None or str(node.name) == "none":
        return 1
    return int(node.num_processes) if node.num_processes is not None else 2  # null: every GPU (>= 2)


def _relaunch(
    task: str, given: list[str], resume: str | Path | None, lock: RunLock | BorrowedLock, cfg: DictConfig
) -> list[tuple[Path, dict[str, Any]]]:
    """Run this command again as several processes (accelerate launch; torchrun without CUDA) in the
    directory this process has locked; wait for them and return the run's result."""
    import json
    import subprocess

    import torch

    from agentrl import distributed as dist
    from agentrl.config import typed
    from agentrl.trainers.settings import resolve_precision

    cuda = torch.cuda.is_available()
    precision = resolve_precision(str(cfg.algo.get("precision", "auto")), "cuda" if cuda else "cpu")
    where = [f"resume={lock.path}"] if resume is not None else [f"hydra.run.dir={quote(lock.path)}"]
    args = [task, *[o for o in given if override_key(o) != "hydra.run.dir"], *where]
    cmd = dist.launcher_command(
        typed(cfg.distributed), args, cuda=cuda, mixed_precision="bf16" if precision == "bf16-mixed" else "no"
    )
    log.info("distributed=%s: %s", cfg.distributed.name, " ".join(cmd))
    # its own session: a Ctrl-C in the terminal reaches this process only, which forwards it once
    launcher = subprocess.Popen(
        cmd, env={**os.environ, dist.LOCKED_RUN_DIR: str(lock.path)}, start_new_session=True
    )
    with _forward_stop_signals(launcher.pid) as forwarded:
        code = launcher.wait()
    if code != 0:
        # a forwarded stop signal: the processes saved and stopped; exit as a one-process run would
        raise SystemExit(128 + forwarded[0] if forwarded else code)
    result = lock.path / "eval.json"
    return [(lock.path, json.loads(result.read_text()))] if result.is_file() else []


@contextlib.contextmanager
def _forward_stop_signals(launcher_pid: int) -> Iterator[list[int]]:
    """While the training processes run, a stop signal to this process goes to each of them (not to the
    launcher, which would kill them before they save): they stop together after the iteration in
    progress, save a checkpoint and exit, and so does the launcher."""
    import signal

    import psutil

    from agentrl.trainers.signals import STOP_SIGNALS

    forwarded: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        forwarded.append(signum)
        try:
            workers = psutil.Process(launcher_pid).children(recursive=True)
        except psutil.Error:
            return
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in STOP_SIGNALS}
    try:
        yield forwarded
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _pop_resume(overrides: list[str], resume: str | Path | None) -> tuple[list[str], str | Path | None]:
    """A train command's `resume=<dir>` overrides taken out (the command reads them; they never land in
    the run's overrides.yaml); the last one names the run to continue."""
    kept = [o for o in overrides if override_key(o) != "resume"]
    for item in (o for o in overrides if override_key(o) == "resume"):
        value = override_value(item)
        if value is not None and str(value) not in ("", "null"):
            resume = str(value)
    return kept, resume


@dataclass
class Plan:
    """What a command would run (`--dry-run`): the checked config, the run directory it would use
    (None when only Hydra can resolve it) and, for a resume, whether the run would continue."""

    task: str
    cfg: DictConfig
    run_dir: Path | None
    resume: bool = False
    nothing_to_do: bool = False  # a complete run asked for no more training
    problems: list[AgentRLError] = field(default_factory=list)  # checks of this machine that failed


def dry_run(task: str, overrides: list[str], *, resume: str | Path | None = None) -> Plan:
    """`launch` up to the point where it would start: the config composed and validated, the cheap
    pre-launch checks (`check_job`: env options, agent, model source, from_run) run, the run directory
    named; no model loads, no directory is created or locked. A config error raises as in `launch`; the
    checks of this machine (model files, libraries, CUDA) are all run and their failures kept in
    `Plan.problems`, so the plan is shown whole first."""
    problems: list[AgentRLError] = []
    overrides = list(overrides)
    if task == "train":
        overrides, resume = _pop_resume(overrides, resume)
    if task == "eval":
        overrides = eval_overrides(overrides)
    if resume is not None:
        run = load_train_run(Path(resume), "cannot resume")
        cfg = check_job([f"task={task}", *resume_overrides(run, overrides)], problems)
        if cfg.algo.name != run.algo:
            raise RunDirError(
                f"cannot resume {run.root}: it trained algo={run.algo}, not algo={cfg.algo.name}"
            )
        done = is_complete(run.root) and not _asks_for_more(cfg, run)
        if is_complete(run.root) and not done:
            try:
                check_continuable(run)
            except AgentRLError as exc:
                problems.append(exc)
        return Plan(task, cfg, run.root, resume=True, nothing_to_do=done, problems=problems)
    overrides = [f"task={task}", *overrides]
    cfg = check_job(overrides, problems)
    return Plan(task, cfg, planned_run_dir(overrides), problems=problems)


def _asks_for_more(cfg: DictConfig, run: SavedRun) -> bool:
    """Whether a resume asks a complete run for more training: a larger budget (`algo.iterations`; DQN:
    `algo.total_timesteps`), or, for a run its time limit stopped short of its iterations, a larger
    `algo.time_limit_minutes` (or none). Never while the limit asked for is spent: the limit counts the
    run's training clock over every part (metrics.jsonl `time_s`)."""
    key = BUDGET_KEYS.get(str(run.algo), DEFAULT_BUDGET_KEY)
    asked, done = cfg.algo.get(key), run.config.algo.get(key)
    if asked is None or done is None:
        return False
    more = int(asked) > int(done)
    if key != DEFAULT_BUDGET_KEY:  # DQN has no time limit
        return more
    if _time_spent(cfg, run):
        return False
    old = run.config.algo.get("time_limit_minutes")
    trained = [int(r["iteration"]) for r in metrics_rows(run.root) if isinstance(r.get("iteration"), int)]
    stopped_on_time = bool(old) and last_metrics_time(run.root) >= float(old) * 60
    return more or (stopped_on_time and max(trained, default=0) < int(asked))


def _time_spent(cfg: DictConfig, run: SavedRun) -> bool:
    """The run's training clock has reached the `algo.time_limit_minutes` that `cfg` asks for."""
    limit = cfg.algo.get("time_limit_minutes")
    return bool(limit) and last_metrics_time(run.root) >= float(limit) * 60


def check_continuable(run: SavedRun) -> None:
    """A complete run asked for more training continues from its newest checkpoint (DQN: or its final
    model); a run with neither is refused here, never restarted from step 0 over its own results."""
    from agentrl.runs.runlog import newest_valid_checkpoint

    if run.algo == "dqn":
        from agentrl.trainers.dqn import resume_point

        if resume_point(run.root) is not None:
            return
    elif newest_valid_checkpoint(run.root, kind="dir") is not None:
        return
    every = run.config.algo.get("checkpoint_every")
    raise RunDirError(
        f"cannot continue {run.root}: it is complete and kept no checkpoint to continue from "
        f"(algo.checkpoint_every={every}; final/ holds the weights but not the optimizer state); "
        "train a new run instead (set algo.checkpoint_every to make a run extensible)"
    )


def _say_complete(run: SavedRun, cfg: DictConfig) -> None:
    from agentrl.console import console

    key = BUDGET_KEYS.get(str(run.algo), DEFAULT_BUDGET_KEY)
    done = run.config.algo.get(key)
    if key == DEFAULT_BUDGET_KEY and _time_spent(cfg, run):
        state = (
            f"its training clock ({last_metrics_time(run.root) / 60:.1f} min) has reached "
            f"algo.time_limit_minutes={cfg.algo.time_limit_minutes}"
        )
        more = "a larger algo.time_limit_minutes (or null), and a larger algo.iterations if it ran them all"
    else:
        state, more = f"algo.{key}={done}", f"a larger algo.{key}"
    console.print(
        f"run {run.root} is complete ({state}); nothing changed. To train further pass {more}; "
        f"to evaluate it again: agentrl eval {shell_override('from_run', run.root)}",
        markup=False,
        highlight=False,
    )


def planned_run_dir(overrides: list[str]) -> Path | None:
    """The directory `hydra.run.dir` names for these overrides (None if it cannot be resolved before
    Hydra runs, e.g. a pattern that reads Hydra's job state: then the job locks it itself)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        return Path(os.path.abspath(str(OmegaConf.select(cfg, "hydra.run.dir"))))
    except Exception as exc:  # noqa: BLE001 - the job falls back to locking what Hydra chose
        log.debug("run directory not known before launch: %s", exc)
        return None
    finally:
        GlobalHydra.instance().clear()


def _claim_new(overrides: list[str], attempts: int = 5) -> RunLock | None:
    """Lock a fresh directory for a new run. A name of the default pattern that is taken (or in use) is
    drawn again; a directory named with hydra.run.dir is refused instead."""
    named = any(override_key(o) == "hydra.run.dir" for o in overrides)
    for attempt in range(attempts):
        path = planned_run_dir(overrides)
        if path is None:
            return None
        try:
            return claim(path)
        except RunDirError:
            if named or attempt == attempts - 1:
                raise
            log.debug("run directory %s is taken: drawing another name", path)
    return None


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    from agentrl import distributed as dist

    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    held = _LOCK if _LOCK is not None and _LOCK.path == run_dir else None
    try:
        # a sweep's job directory: Hydra has written .hydra/ already, so only a status or result counts
        lock = held or claim(run_dir, markers=(STATUS_FILE, "eval.json"))
    except RunDirError as exc:
        log.error("%s", exc)
        raise SystemExit(exc.exit_code) from exc
    resume = held is not None and held.resume
    main = dist.is_main()  # of several processes, the first writes the run's status
    if not main:
        logging.getLogger("agentrl").setLevel(logging.WARNING)  # one process tells the story
    try:
        if main:
            start_status(run_dir, str(cfg.task), resume=resume)
        try:
            metrics = run_job(cfg, run_dir, resume=resume)
        except BaseException as exc:
            if main:
                end_status(run_dir, exc)
            stop = isinstance(exc, (KeyboardInterrupt, TrainingInterrupted))
            if _in_sweep() and isinstance(exc, Exception) and not stop:
                # one failed job does not stop a sweep: status.json says why, the summary lists it
                log.error("job %s failed: %s", run_dir.name, exc, exc_info=not isinstance(exc, AgentRLError))
                return
            if isinstance(exc, AgentRLError):
                # Hydra would print a traceback; a user error is one line and a non-zero exit, naming the
                # run directory that now holds the failed run's status.json and log
                log.error("%s (run directory: %s)", exc, run_dir)
                raise SystemExit(exc.exit_code) from exc
            raise
        done = {"train_time_s": metrics["train_time_s"]} if "train_time_s" in metrics else {}
        if main:
            end_status(run_dir, None, **done)
    finally:
        if held is None:
            lock.release()
    _RESULTS.append((run_dir, metrics))


def _in_sweep() -> bool:
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


def run_job(cfg: DictConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Run one composed job in `run_dir` (created by Hydra); `resume`: a training job continues the
    run already there."""
    from agentrl.console import console

    start = time.perf_counter()
    if cfg.task == "eval":
        metrics = run_eval(cfg, run_dir)
    elif cfg.task == "train":
        metrics = run_train(cfg, run_dir, resume=resume)
    else:
        raise ConfigError(f"unknown task {cfg.task!r}; valid choices: {', '.join(TASKS)}")
    log.info("%s done in %.1f s", cfg.task, time.perf_counter() - start)
    console.print(f"[bold]run directory:[/bold] {run_dir}")
    return metrics


def run_eval(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    from agentrl.agents import build_agent
    from agentrl.envs import env_factory
    from agentrl.evaluation import EvalInterrupted, episode_metrics, eval_seeds, evaluate, write_eval

    info = describe(cfg)
    trained = trained_model(cfg.from_run) if cfg.get("from_run") is not None else None
    if trained is not None and not plays_trained_model(cfg, trained):
        # the command named another model (e.g. the base model): the run lent only its settings, so
        # eval.json labels the model that played and says where the settings came from
        info["settings_from_run"] = str(trained.run.root)
    elif trained is not None:
        # the trained algo is the agent, and eval.json says which run and checkpoint it evaluated
        created = info.pop("created")
        info.update(
            agent=trained.run.algo,
            algo=trained.run.algo,
            from_run=str(trained.run.root),
            checkpoint=trained.checkpoint,
        )
        trained_env = OmegaConf.select(trained.run.config, "env.name")
        if trained_env is not None and str(trained_env) != str(cfg.env.name):
            info["trained_env"] = str(trained_env)  # a zero-shot transfer: report shows it apart
        info["created"] = created
    make_env = env_factory(cfg.env)
    agent = build_agent(cfg)
    start = time.perf_counter()
    written = functools.partial(
        write_eval,
        run_dir,
        transcripts=cfg.eval.transcripts,
        ucb_c=cfg.agent.get("ucb_c"),  # the planner's own c; other agents are judged at UCB1's default
        **info,
    )
    try:
        metrics, episodes = evaluate(
            make_env,
            agent,
            eval_seeds(cfg),
            lockstep=cfg.eval.lockstep,
            description=f"eval {cfg.env.name}",
            agent_seed=int(cfg.seed),
        )
    except EvalInterrupted as stop:
        # the finished episodes are kept: eval.json says interrupted and how many of how many
        partial = episode_metrics(stop.episodes)
        written(
            partial,
            stop.episodes,
            interrupted=True,
            episodes_planned=stop.planned,
            wall_time_s=round(time.perf_counter() - start, 3),
        )
        from agentrl.console import console

        console.print(
            f"interrupted after {len(stop.episodes)} of {stop.planned} episodes: eval.json (marked "
            f"interrupted) and episodes.jsonl hold them\n[bold]run directory:[/bold] {run_dir}",
            highlight=False,
        )
        raise
    written(metrics, episodes, wall_time_s=round(time.perf_counter() - start, 3))
    print_metrics(f"{cfg.env.name} / {info['agent']}", metrics)
    print_reasons(episodes)
    return metrics


def run_train(cfg: DictConfig, run_dir: Path, resume: bool | None = None) -> dict[str, Any]:
    """Train (`resume`: continue the run in `run_dir`; None: when the config names one, for callers
    that compose `resume=<dir>` themselves), then write eval.json (the identifying fields, the
    trainer's extra fields, the final evaluation's metrics), episodes.jsonl and transcripts.jsonl: the
    runner is their only writer."""
    import importlib

    from agentrl import distributed as dist
    from agentrl.envs import env_factory
    from agentrl.evaluation import write_eval

    module, _, fn = TRAINERS[cfg.algo.name].partition(":")
    train = getattr(importlib.import_module(module), fn)
    if resume is None:
        resume = cfg.get("resume") is not None
    with trackers.tracking(cfg, run_dir, resume=resume, enabled=dist.is_main()) as tracked:
        result = train(with_init_weights(cfg), run_dir, env_factory, resume=resume)
        if tracked is not None:  # a resumed run logged its evaluation before training already
            tracked.log_evaluations(None if resume else result.extra.get("before"), result.metrics)
    extra = {"start": start_description(cfg), **result.extra}
    if not dist.is_main():  # of several processes, the first writes the results
        return {**result.metrics, **extra}
    if resume and "train_time_s" in extra:
        # A trainer times the part it ran (or, DQN, since its checkpoint); metrics.jsonl's time_s runs on
        # across parts, so the larger of the two is the training time of the whole run.
        extra["train_time_s"] = round(max(float(extra["train_time_s"]), last_metrics_time(run_dir)), 3)
    write_eval(
        run_dir,
        result.metrics,
        result.episodes,
        transcripts=cfg.eval.transcripts,
        **describe(cfg),
        **extra,
    )
    write_model_cards(run_dir)
    print_metrics(f"{cfg.env.name} / {cfg.algo.name}", result.metrics)
    print_reasons(result.episodes)
    line = outcome_line(cfg, result.metrics, extra)
    if line is not None:
        from agentrl.console import console

        console.print(line, markup=False, highlight=False)
    return {**result.metrics, **extra}


def outcome_line(cfg: DictConfig, metrics: dict[str, Any], extra: dict[str, Any]) -> str | None:
    """A training run in one line: the eval success before and after and the training minutes, e.g.
    "greedy success 0.00 -> 1.00 in 2.9 min" (None without an eval before training)."""
    before = (extra.get("before") or {}).get("success_rate")
    after, seconds = metrics.get("success_rate"), extra.get("train_time_s")
    if before is None or after is None or seconds is None:
        return None
    temperature = float(cfg.algo.get("eval_temperature") or 0.0)
    kind = "greedy success" if temperature == 0 else f"eval success (temperature {temperature:g})"
    return f"{kind} {before:.2f} -> {after:.2f} in {seconds / 60:.1f} min"


# ---------------------------------------------------------------------------------------------
# small shared pieces
# ---------------------------------------------------------------------------------------------
def agent_label(cfg: DictConfig) -> str:
    if cfg.task == "train" and cfg.get("algo") is not None:
        return str(cfg.algo.name)
    if cfg.agent.name == "llm":
        return f"llm:{cfg.model.name}"
    return str(cfg.agent.name)


def describe(cfg: DictConfig) -> dict[str, Any]:
    """The identifying fields every eval.json starts with (report groups runs by them)."""
    info: dict[str, Any] = {"env": cfg.env.name, "agent": agent_label(cfg), "seed": int(cfg.seed)}
    uses_llm = cfg.algo.name in LLM_ALGOS if cfg.task == "train" else cfg.agent.name == "llm"
    if uses_llm:
        info["model"] = cfg.model.name
    # an eval of a training preset (`agentrl eval experiment=kitchen_learn`) carries the preset's algo keys
    # without an algo group: no algo to name
    if cfg.get("algo") is not None and cfg.algo.get("name") is not None:
        info["algo"] = cfg.algo.name
    info["created"] = datetime.now().isoformat(timespec="seconds")
    return info


def write_model_cards(run_dir: Path) -> None:
    """The model cards of final/ and the checkpoints (agentrl/runs/card.py). A card that cannot be written
    leaves the run's results as they are: `agentrl push` writes it again."""
    from agentrl.runs.card import write_cards

    try:
        written = write_cards(run_dir)
    except Exception as exc:  # noqa: BLE001 - the weights and results are saved; only the card is missing
        log.warning("model card not written: %s", exc, exc_info=True)
        return
    if written:
        log.info("model cards: %s", ", ".join(str(p.relative_to(run_dir)) for p in written))


def print_metrics(title: str, metrics: dict[str, Any]) -> None:
    from rich.table import Table

    from agentrl.console import console

    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)


#: the most common reasons `print_reasons` lists
REASONS_SHOWN = 3


def print_reasons(episodes: Sequence[Episode]) -> None:
    """Under the metrics: the reasons the env gave for its rewards, where it gives them (DataSciCoding's
    -1: `no code was submitted`, `build_model raised ...`), the most common first, each with the steps'
    reward (which includes an invalid answer's penalty)."""
    from collections import Counter

    from agentrl.console import console

    counts = Counter((s.reward, s.reason) for e in episodes for s in e.steps if s.reason)
    if not counts:
        return
    steps = sum(e.length for e in episodes)
    lines = [f"the env's reasons ({sum(counts.values())} of {steps} steps; episodes.jsonl lists each):"]
    lines += [
        f"  {n} step{'s' if n > 1 else ''}, reward {reward:g}: {reason}"
        for (reward, reason), n in counts.most_common(REASONS_SHOWN)
    ]
    if len(counts) > REASONS_SHOWN:
        lines.append(f"  and {len(counts) - REASONS_SHOWN} other reasons")
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
