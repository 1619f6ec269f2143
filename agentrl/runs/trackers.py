"""`report_to=`: the experiment trackers a training run reports to, besides metrics.jsonl.

`report_to` names one tracker or a list: `tensorboard` (the default: run_dir/tb/, as every run writes),
`wandb`, `mlflow`, `trackio`, or `none`. The runner opens each named tracker's run before training,
under the run directory's name with the run's whole config, and closes it after the evaluation that
follows training. Every row `MetricsLog` writes to metrics.jsonl goes to each tracker at step = the
iteration, under the same names: TRL's loss statistics (loss, kl, entropy, clip_fraction, ...) and
agentrl's own (train/success_rate, train/invalid_rate, train/untagged_rate, the periodic eval/* rows,
timings). The evaluation before training is logged as before/* at step 0 and the one after as final/* at
the last iteration. One writer for every series keeps one name per number and the same series for every
trainer (DQN has no TRL trainer); TRL's and transformers' own reporting stays off (`report_to="none"`
in their configs), so nothing is written twice.

Where each tracker writes (docs/sharing.md):
- wandb: project $WANDB_PROJECT (default agentrl), files under run_dir/wandb/; WANDB_MODE=offline keeps it
  on this machine (sync later with `wandb sync`);
- mlflow: $MLFLOW_TRACKING_URI when set, else a file store in run_dir/mlruns/ (MLflow 3 wants
  MLFLOW_ALLOW_FILE_STORE=true for it, which agentrl sets), experiment $MLFLOW_EXPERIMENT_NAME (default
  agentrl);
- trackio: project $TRACKIO_PROJECT (default agentrl), trackio's local store unless it is told otherwise.

A resumed run continues the same tracker runs (their ids are kept in run_dir/trackers.json), and
MetricsLog never logs an iteration twice. A tracker that is not installed is refused before launch, in
one line, before a run directory exists (`prelaunch_check`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.runs import checks

log = logging.getLogger(__name__)

#: tracker -> (the module it needs, the pip package that brings it)
TRACKERS = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "trackio": ("trackio", "trackio"),
}
CHOICES = (*TRACKERS, "none")
DEFAULT_PROJECT = "agentrl"
IDS_FILE = "trackers.json"


def selected(value: Any) -> list[str]:
    """The trackers `report_to` names: a name, a comma-separated string or a list; `none` (or an empty
    list) is none. An unknown name is a one-line error naming the valid choices."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for item in items for n in str(item).split(",") if n.strip()]
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        raise ConfigError(f"report_to={unknown[0]}: unknown tracker; valid choices: {', '.join(CHOICES)}")
    if "none" in names and len(names) > 1:
        raise ConfigError(f"report_to={','.join(names)}: none reports to no tracker; give it alone")
    return list(dict.fromkeys(n for n in names if n != "none"))


def check_installed(name: str) -> None:
    module, package = TRACKERS[name]
    if not checks.installed(module):
        raise ConfigError(
            f"report_to={name} needs {package}, which is not installed: pip install 'agentrl[trackers]' "
            f"(or pip install {package})"
        )


def prelaunch_check(cfg: Any, machine: Any) -> None:
    """`report_to` names known trackers (a config rule), and a training run's trackers are installed."""
    names = selected(cfg.get("report_to", "tensorboard"))
    if cfg.task == "train":
        for name in names:
            machine(check_installed, name)


# ---------------------------------------------------------------------------------------------
# the trackers
# ---------------------------------------------------------------------------------------------
def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row (no flags, texts or lists)."""
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[str(key)] = float(value)
    return out


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys with text values (MLflow's params)."""
    if isinstance(config, dict):
        out: dict[str, str] = {}
        for key, value in config.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: json.dumps(config) if isinstance(config, (list, tuple)) else str(config)}


class WandbTracker:
    """A W&B run (wandb.init) with `iteration` as every metric's step."""

    def __init__(self, run_dir: Path, name: str, group: str, config: dict[str, Any], run_id: str | None):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            name=name,
            group=group,
            config=config,
            dir=str(run_dir),
            id=run_id,
            resume="allow" if run_id else None,
        )
        self.run.define_metric("iteration")
        self.run.define_metric("*", step_metric="iteration")
        self.id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, "iteration": step})

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """An MLflow run through MlflowClient (no process-global active run)."""

    #: MLflow's limits: a parameter's text, and parameters / metrics per log_batch call
    MAX_PARAM = 6000
    BATCH = 100

    def __init__(self, run_dir: Path, name: str, group: str, config: dict[str, Any], run_id: str | None):
        from mlflow import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 refuses a file store unless asked for it: the run directory's own store is asked for
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run = self.client.create_run(
                experiment_id, run_name=name, tags={"agentrl.name": group, "agentrl.run_dir": str(run_dir)}
            )
            run_id = run.info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.id = run_id
        known = self.client.get_run(run_id).data.params
        params = {self._key(k): v[: self.MAX_PARAM] for k, v in flatten(config).items()}
        self._batches(params={k: v for k, v in params.items() if k not in known})

    @staticmethod
    def _key(key: str) -> str:
        return re.sub(r"[^0-9A-Za-z_\-. :/]", "_", key)

    def _batches(
        self, metrics: dict[str, float] | None = None, params: dict[str, str] | None = None, step: int = 0
    ) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        items: list[Any] = [Metric(self._key(k), v, now, step) for k, v in (metrics or {}).items()]
        items += [Param(k, v) for k, v in (params or {}).items()]
        for start in range(0, len(items), self.BATCH):
            chunk = items[start : start + self.BATCH]
            self.client.log_batch(
                self.id,
                metrics=[m for m in chunk if isinstance(m, Metric)],
                params=[p for p in chunk if isinstance(p, Param)],
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._batches(metrics=metrics, step=step)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.id, status="FAILED" if failed else "FINISHED")


class TrackioTracker:
    """A Trackio run (trackio.init; its local store unless TRACKIO_* settings say otherwise)."""

    def __init__(self, run_dir: Path, name: str, group: str, config: dict[str, Any], run_id: str | None):
        import trackio

        self.trackio = trackio
        trackio.init(
            project=os.environ.get("TRACKIO_PROJECT") or DEFAULT_PROJECT,
            name=name,
            group=group,
            config=config,
            resume="allow",
        )
        self.id = name

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.trackio.log(metrics, step=step)

    def close(self, failed: bool) -> None:
        self.trackio.finish()


OPENERS = {"wandb": WandbTracker, "mlflow": MlflowTracker, "trackio": TrackioTracker}


class Trackers:
    """The open trackers of one training run (tensorboard is MetricsLog's own writer)."""

    def __init__(self, names: list[str], opened: dict[str, Any]):
        self.names, self.opened = names, opened
        self.last_step = 0  # the last iteration logged: the final evaluation is logged there

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.last_step = max(self.last_step, int(step))
        row = numbers({k: v for k, v in metrics.items() if k != "iteration"})
        for name, tracker in self.opened.items():
            try:
                tracker.log(int(step), row)
            except Exception as exc:  # noqa: BLE001 - a tracker's hiccup never stops training
                log.warning("report_to=%s: could not log iteration %d: %s", name, step, exc)

    def log_evaluations(self, before: dict[str, Any] | None, final: dict[str, Any]) -> None:
        """The evaluations around training: before/* at step 0, final/* at the last iteration."""
        if isinstance(before, dict):
            self.log(0, {f"before/{k}": v for k, v in before.items()})
        self.log(self.last_step, {f"final/{k}": v for k, v in final.items()})


_ACTIVE: Trackers | None = None


def active() -> Trackers | None:
    """The trackers of the training run in progress in this process (None outside one)."""
    return _ACTIVE


def tensorboard_on() -> bool:
    """Whether MetricsLog writes run_dir/tb/: always outside a run's trackers, else if report_to names it."""
    return _ACTIVE is None or "tensorboard" in _ACTIVE.names


@contextlib.contextmanager
def tracking(
    cfg: Any, run_dir: Path, resume: bool = False, enabled: bool = True
) -> Iterator[Trackers | None]:
    """Open the trackers `cfg.report_to` names for a training run in `run_dir` (under the directory's
    name, `cfg.name` as the group, the resolved config), active until the block ends; `enabled` False
    (a process other than the first of a distributed run) opens none."""
    global _ACTIVE
    from omegaconf import OmegaConf

    names = selected(cfg.get("report_to", "tensorboard"))
    if not enabled:
        yield None
        return
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ids_path = run_dir / IDS_FILE
    ids = json.loads(ids_path.read_text(encoding="utf-8")) if resume and ids_path.is_file() else {}
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    config = {k: v for k, v in config.items() if k != "hydra"}
    opened: dict[str, Any] = {}
    try:
        for name in names:
            if name in OPENERS:
                opened[name] = OPENERS[name](run_dir, run_dir.name, str(cfg.name), config, ids.get(name))
                log.info("report_to=%s: run %s", name, opened[name].id)
    except Exception as exc:
        for tracker in opened.values():
            with contextlib.suppress(Exception):
                tracker.close(failed=True)
        raise ConfigError(f"report_to={name}: could not start its run: {exc}") from exc
    if opened:
        tmp = ids_path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({**ids, **{n: t.id for n, t in opened.items()}}, indent=2), encoding="utf-8"
        )
        os.replace(tmp, ids_path)
    _ACTIVE = Trackers(names, opened)
    failed = True
    try:
        yield _ACTIVE
        failed = False
    finally:
        _ACTIVE = None
        for name, tracker in opened.items():
            try:
                tracker.close(failed)
            except Exception as exc:  # noqa: BLE001 - the run's own results are already on disk
                log.warning("report_to=%s: could not close its run: %s", name, exc)
