"""The `agentrl` command line. Every command is thin: it parses, then calls run.py / evaluation.py /
report.py. Overrides are plain Hydra syntax: `key=value`, `group=option`, `+new=value`."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from agentrl.console import console, setup_logging
from agentrl.errors import AgentRLError

app = typer.Typer(
    name="agentrl",
    help="RL post-training of language-model agents on text games: train, eval, sweep, play, report.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides: env=snake agent=planner eval.episodes=50 seed=3 ...", show_default=False
    ),
]


def _errors_to_exit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Library errors become one red line on stderr and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AgentRLError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


@app.command()
@_errors_to_exit
def envs() -> None:
    """List the environments, their gymnasium ids and variants."""
    from rich.table import Table

    from agentrl.config import group_options
    from agentrl.envs import ENV_SPECS, make_env

    table = Table(title="agentrl environments")
    for col in ("env", "gymnasium id", "actions", "variant", "description"):
        table.add_column(col)
    for name, spec in ENV_SPECS.items():
        try:
            env = make_env(name)
            actions = (
                ", ".join(env.action_names)
                if len(env.action_names) <= 9
                else f"{len(env.action_names)} actions"
            )
        except Exception as exc:  # an env that cannot be built is shown, not fatal
            actions = f"[red]unavailable: {exc}[/red]"
        variant = ", ".join(f"{k}={v}" for k, v in spec.defaults.items()) or "-"
        table.add_row(name, spec.gym_id, actions, variant, spec.description)
    console.print(table)
    console.print(f"config options (env=...): {', '.join(group_options('env'))}")


@app.command("eval")
@_errors_to_exit
def eval_(overrides: Overrides = None) -> None:
    """Evaluate an agent (LLM or classic) on held-out episodes; writes eval.json, episodes.jsonl."""
    from agentrl.run import launch

    setup_logging()
    launch("eval", list(overrides or []))


@app.command()
@_errors_to_exit
def train(
    overrides: Overrides = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Continue a killed run from its newest complete checkpoint"),
    ] = None,
) -> None:
    """Post-train an agent (algo=msgrpo by default; algo=dqn for the DQN baseline). Writes metrics.jsonl,
    TensorBoard events, checkpoints, eval.json (before/after) into the run directory."""
    from agentrl.run import launch, resume_overrides

    setup_logging()
    overrides = list(overrides or [])
    resume_dir = resume
    for item in list(overrides):
        if item.startswith("resume="):
            resume_dir = Path(item.split("=", 1)[1])
            overrides.remove(item)
    if resume_dir is not None:
        overrides = resume_overrides(str(resume_dir), overrides)
    elif not any(o.split("=", 1)[0] == "algo" for o in overrides):
        overrides.insert(0, "algo=msgrpo")
    launch("train", overrides)


@app.command()
@_errors_to_exit
def report(
    dirs: Annotated[list[Path], typer.Argument(help="Run or sweep directories to search for runs")],
    out: Annotated[Path | None, typer.Option(help="Where to write report.md, report.csv and plots")] = None,
) -> None:
    """Tables (markdown, CSV) and plots across runs: one row per run and aggregates over seeds."""
    from agentrl.errors import RunDirError
    from agentrl.report import build_report

    missing = [str(d) for d in dirs if not d.exists()]
    if missing:
        raise RunDirError(f"no such directory: {', '.join(missing)}")
    build_report(list(dirs), out, console=console)


@app.command()
@_errors_to_exit
def sweep(
    overrides: Overrides = None,
    task: Annotated[
        str, typer.Option(help="eval or train for every job (default: train when algo= is given)")
    ] = "",
) -> None:
    """Hydra multirun over comma-separated values, e.g. env=frozenlake,snake agent=random,planner.
    Add hydra/launcher=joblib for parallel local jobs, hydra/launcher=slurm for a SLURM cluster."""
    from agentrl.run import launch

    setup_logging()
    overrides = list(overrides or [])
    task = task or ("train" if any(o.split("=", 1)[0] == "algo" for o in overrides) else "eval")
    if not any(o.startswith("hydra.sweep.dir=") for o in overrides):
        stamp = datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
        overrides.append(f"hydra.sweep.dir=outputs/multirun/{stamp}")
    sweep_dir = Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.dir=")))
    launch(task, overrides, multirun=True)
    _print_sweep_summary(sweep_dir)


def _print_sweep_summary(sweep_dir: Path) -> None:
    import json

    from rich.table import Table

    table = Table(title=f"sweep {sweep_dir}")
    for col in ("job", "env", "agent", "seed", "success", "return ± stderr", "length", "invalid"):
        table.add_column(col)
    jobs = sorted(
        (p for p in sweep_dir.iterdir() if p.is_dir() and (p / ".hydra").is_dir()),
        key=lambda p: int(p.name.split("_", 1)[0]) if p.name.split("_", 1)[0].isdigit() else 0,
    )
    for job in jobs:
        try:
            m = json.loads((job / "eval.json").read_text())
        except (OSError, ValueError):
            table.add_row(job.name, "[red]no eval.json[/red]", "", "", "", "", "", "")
            continue
        table.add_row(
            job.name,
            str(m.get("env")),
            str(m.get("agent")),
            str(m.get("seed")),
            f"{m['success_rate']:.2f}",
            f"{m['mean_return']:.3f} ± {m['return_stderr']:.3f}",
            f"{m['mean_length']:.1f}",
            f"{m['invalid_rate']:.2f}",
        )
    console.print(table)
    console.print(f"[bold]sweep directory:[/bold] {sweep_dir}")


@app.command()
@_errors_to_exit
def play(overrides: Overrides = None) -> None:
    """Play an environment yourself in the terminal (illegal moves are asked again)."""
    from agentrl.agents.baselines import HumanAgent
    from agentrl.envs import env_factory
    from agentrl.rollout import rollout
    from agentrl.run import check_job

    cfg = check_job(["agent=human", *(overrides or [])])
    make_env = env_factory(cfg.env)
    console.rule(f"[bold]{cfg.env.name}")
    console.print(make_env().instructions)
    console.rule()
    episode = rollout(make_env, HumanAgent(console=console), [int(cfg.seed)])[0]
    console.print(episode.final_observation)
    outcome = "success" if episode.success else "no success"
    console.print(
        f"[bold]Episode over:[/bold] return {episode.episode_return:.2f} in {episode.length} moves ({outcome})"
    )


@app.command()
@_errors_to_exit
def config(
    overrides: Overrides = None,
    show_prompt: Annotated[
        bool, typer.Option("--show-prompt", help="Print the exact first prompt an LLM agent sees")
    ] = False,
    describe: Annotated[
        bool,
        typer.Option(
            "--describe",
            help="List the keys of each group option named (e.g. algo=msgrpo; none: the root keys) "
            "with type, default, help and source",
        ),
    ] = False,
) -> None:
    """Print the composed config for the given overrides (and optionally the LLM prompt); with
    --describe, what every key of the named group options means."""
    from omegaconf import OmegaConf

    from agentrl.config import compose_config

    overrides = list(overrides or [])
    cfg = compose_config(overrides)
    if describe:
        console.print(_describe_config(cfg, overrides), markup=False, highlight=False, soft_wrap=True)
        return
    console.print(OmegaConf.to_yaml(cfg), markup=False, highlight=False)
    if show_prompt:
        from agentrl.agents.llm import format_prompt_preview

        console.rule("prompt")
        console.print(format_prompt_preview(cfg), markup=False, highlight=False)


def _describe_config(cfg: Any, overrides: list[str]) -> str:
    """Help text for the group options named in `overrides` (the root keys when none is), one block per
    option: each key (nested keys dotted), its type, its value in the YAML file, help, source, range."""
    from omegaconf import OmegaConf

    from agentrl.config import CONF_DIR, CONFIG_GROUPS, AgentRLConfig, field_rows, typed

    selected = [
        (key, value)
        for key, _, value in (o.partition("=") for o in overrides)
        if key.lstrip("+") in CONFIG_GROUPS and value and value != "null"
    ]
    only_groups = len(selected) == len(overrides)
    label = "default" if only_groups else "value"
    blocks = []
    root = typed(cfg)
    if not selected:
        rows = [
            r
            for r in field_rows(AgentRLConfig, OmegaConf.to_container(cfg, resolve=True))
            if r["type"] != "any"
        ]
        blocks.append(_describe_block("root config (conf/config.yaml)", AgentRLConfig, rows, label))
    for key, option in selected:
        group = key.lstrip("+")
        if group == "experiment":
            preset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{option}.yaml"))
            preset.pop("defaults", None)
            known = {}
            for name in ("env", "agent", "model", "algo"):
                node = getattr(root, name)
                if node is not None:
                    known.update({f"{name}.{r['key']}": r for r in field_rows(type(node))})
            known.update({r["key"]: r for r in field_rows(AgentRLConfig)})
            rows = []
            for dotted in _dotted_keys(preset):
                row = dict(known.get(dotted, {"type": "?", "help": "", "source": "", "allowed": ""}))
                row.update(key=dotted, value=OmegaConf.select(cfg, dotted))
                rows.append(row)
            blocks.append(
                _describe_block(f"experiment={option}: the keys this preset sets", None, rows, "value")
            )
            continue
        node = cfg[group]
        cls = type(getattr(root, group))
        rows = field_rows(cls, OmegaConf.to_container(node, resolve=True))
        blocks.append(_describe_block(f"{group}={option}", cls, rows, label))
    return "\n\n".join(blocks)


def _dotted_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            keys.extend(_dotted_keys(value, f"{prefix}{key}."))
        else:
            keys.append(f"{prefix}{key}")
    return keys


def _describe_block(title: str, cls: Any, rows: list[dict[str, Any]], label: str) -> str:
    from agentrl.config.schema import show

    doc = " ".join((cls.__doc__ or "").split("\n\n")[0].split()) if cls is not None else ""
    head = f"{title}  ({cls.__name__}) {doc}".rstrip() if cls is not None else title
    lines = [head]
    for row in rows:
        optional = " or null" if row["type"].endswith("| None") else ""
        allowed = f"; must be {row['allowed']}{optional}" if row.get("allowed") else ""
        source = f"  [{row['source']}]" if row.get("source") else ""
        lines.append(f"  {row['key']}: {row['type']}  ({label}: {show(row['value'])}){source}")
        lines.append(f"      {row['help']}{allowed}")
    return "\n".join(lines)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
