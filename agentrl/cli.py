"""The `agentrl` command line. Every command is thin: it parses, then calls runs/launch.py / evaluation.py /
report/. Overrides are plain Hydra syntax: `key=value`, `group=option`, `+new=value`."""

from __future__ import annotations

import functools
import sys
import textwrap
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from typer.core import TyperCommand

from agentrl.console import console, setup_logging
from agentrl.errors import AgentRLError


def _examples(*rows: tuple[str, str]) -> str:
    """An "Examples" help block: what each command does as a shell comment, then the command."""
    from rich.markup import escape

    lines = [line for cmd, what in rows for line in (f"  [dim]# {escape(what)}[/dim]", f"  {escape(cmd)}")]
    return "[bold]Examples[/bold]\n\n" + "\n".join(lines)


app = typer.Typer(
    name="agentrl",
    help="RL post-training of language-model agents on text games: train, eval, sweep, play, report.",
    epilog=_examples(
        ("agentrl envs", "the environments and their actions"),
        ("agentrl eval env=frozenlake agent=planner", "evaluate any agent, LLM or classic"),
        ("agentrl train env=snake model=qwen2.5-3b", "post-train an LLM agent (MS-GRPO)"),
        ("agentrl sweep env=frozenlake,snake agent=random,planner", "one job per combination, then a table"),
        ("agentrl play env=tictactoe", "play it yourself"),
        ("agentrl report outputs/", "tables and plots across runs"),
    )
    + "\n\nagentrl COMMAND --help shows that command's examples and config groups.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DryRun = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Compose and check the config, run the pre-launch checks and print what would run; "
        "no model loads, no run directory is created",
    ),
]

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Hydra overrides: group=option, key=value, +new.key=value (examples below)", show_default=False
    ),
]

#: the algorithm `train` uses when no algo= is given
TRAIN_DEFAULT_ALGO = "msgrpo"
#: what `agentrl report --table` writes
REPORT_TABLES = ("runs", "paper", "learning")
#: the config groups each command's --help lists (algo only where a run trains)
HELP_WIDTH = 78  # the config-group lines of --help fit an 80-column terminal
HELP_GROUPS = {
    "eval": ("env", "agent", "model", "experiment"),
    "train": ("env", "algo", "model", "agent", "distributed", "experiment"),
    "sweep": ("env", "agent", "model", "algo", "experiment"),
    "config": ("env", "agent", "model", "algo", "experiment"),
    "play": ("env",),
    "serve": ("env", "agent"),
}


def root_defaults() -> dict[str, str | None]:
    """Each config group's default option, from the defaults list of conf/config.yaml (None: none)."""
    from omegaconf import OmegaConf

    from agentrl.config import CONF_DIR, CONFIG_GROUPS

    defaults: dict[str, str | None] = {}
    for item in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml")).get("defaults", []):
        if isinstance(item, dict):
            for key, option in item.items():
                group = key.split()[-1]  # "optional algo" -> algo
                if group in CONFIG_GROUPS and not key.startswith("override"):
                    defaults[group] = option
    return defaults


def config_groups_help(command: str) -> str:
    """The config groups `command` takes, each with its options and default, read from agentrl/conf/."""
    from agentrl.config import group_options

    defaults = root_defaults()
    if command == "train":
        defaults["algo"] = TRAIN_DEFAULT_ALGO
    groups = HELP_GROUPS[command]
    width = max(len(g) for g in groups)
    lines = ["[bold]Config groups[/bold] (group=option)", ""]
    for group in groups:
        default = defaults.get(group)
        options = [o for o in group_options(group) if o != default]
        first = f"{default} (default)" if default else "none by default"
        # long lists continue on lines of their own (the terminal would wrap them to column 0)
        rows = textwrap.wrap(", ".join([first, *options]), HELP_WIDTH - width - 5, break_on_hyphens=False)
        lines.append(f"  {group:<{width}} = {rows[0]}")
        lines += [f"  {'':<{width}}   {row}" for row in rows[1:]]
    lines += ["", "Every key of an option, its default and help: agentrl config <group>=<option> --describe"]
    return "\n".join(lines)


class _Command(TyperCommand):
    """Every agentrl command: a flag's help shows no `<bool>` (a flag takes no value; typer's rich help
    would show its type)."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class _GroupsHelpCommand(_Command):
    """A command whose --help ends with the config groups, read from the config tree only when help is
    shown (so the CLI does not load it on every start)."""

    help_groups_for = ""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if self.help_groups_for and "Config groups" not in (self.epilog or ""):
            self.epilog = f"{self.epilog or ''}\n\n{config_groups_help(self.help_groups_for)}".strip()
        super().format_help(ctx, formatter)


def _groups_help(command: str) -> type[TyperCommand]:
    return type(f"_{command.title()}Command", (_GroupsHelpCommand,), {"help_groups_for": command})


#: words a user may put after a flag, taking it for an option with a value (`--dry-run true`)
FLAG_VALUES = ("true", "false", "yes", "no", "on", "off", "1", "0")


def _overrides(given: list[str] | None) -> list[str]:
    """The command line's overrides; a word that is none (no `=`, not a `~key` deletion) is refused in
    one line, before Hydra's parser would report it."""
    overrides = list(given or [])
    for word in overrides:
        if "=" in word or word.startswith("~"):
            continue
        from agentrl.errors import ConfigError

        if word.lower() in FLAG_VALUES:
            raise ConfigError(
                f"{word!r} is not an override: --dry-run, --show-prompt and --describe are flags and take "
                "no value (give the flag alone)"
            )
        raise ConfigError(f"{word!r} is not an override: write key=value or group=option (e.g. env=snake)")
    return overrides


def _one_job(task: str, overrides: list[str]) -> None:
    """A comma list (env=frozenlake,snake) asks for one job per value, which `agentrl sweep` runs: the
    error line gives that command."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from agentrl.errors import ConfigError
    from agentrl.runs.sweep import sweep_trains

    try:
        swept = [
            o.input_line for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()
        ]
    except Exception:  # noqa: BLE001 - composing the config reports what does not parse
        return
    if swept:
        flag = [] if (task == "train") == sweep_trains(overrides) else [f"--task {task}"]
        command = " ".join(["agentrl sweep", *flag, *map(shlex.quote, overrides)])
        raise ConfigError(f"{swept[0]}: several values make one job each; run them all with: {command}")


def _keys(overrides: list[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides}


def _with_default_algo(overrides: list[str]) -> list[str]:
    """A training job's overrides with `algo=` + TRAIN_DEFAULT_ALGO first, unless they name the algo or
    an experiment preset that picks one (experiment=rlft_bandit)."""
    from agentrl.runs.sweep import preset_sets_algo

    if "algo" in _keys(overrides) or preset_sets_algo(overrides):
        return overrides
    return [f"algo={TRAIN_DEFAULT_ALGO}", *overrides]


def _errors_to_exit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Library errors become one red line on stderr and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AgentRLError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            # Ctrl-C: what finished is written and the run says so; exit as a process stopped by SIGINT
            raise typer.Exit(130) from None

    return wrapper


@app.command(
    cls=_Command,
    epilog=_examples(
        ("agentrl envs", "the table"),
        ("agentrl play env=snake", "try one yourself"),
        ("agentrl config env=snake --describe", "every option of an env, with its default"),
    ),
)
@_errors_to_exit
def envs() -> None:
    """List the environments, their gymnasium ids, actions and variants."""
    from rich.markup import escape
    from rich.table import Table

    from agentrl.config import group_options
    from agentrl.envs import ENV_SPECS, make_env

    rows = []
    for name, spec in ENV_SPECS.items():
        try:
            env = make_env(name)
            actions = (
                ", ".join(env.action_names)
                if len(env.action_names) <= 9
                else f"{len(env.action_names)} actions"
            )
        except Exception as exc:  # an env that cannot be built is shown, not fatal
            actions = f"unavailable: {exc}"
        variant = ", ".join(f"{k}={v}" for k, v in spec.defaults.items()) or "-"
        rows.append((name, spec.gym_id, actions, variant, spec.description))
    # the names and gymnasium ids are what a user copies: never cut or folded. Where five columns
    # would squeeze the text, the name and id share a column and the rest wraps beside them.
    fixed = max(len(r[0]) for r in rows) + max(len(r[1]) for r in rows)
    wide = console.width >= fixed + 90
    table = Table(title="agentrl environments", show_lines=not wide)
    if wide:
        table.add_column("env", no_wrap=True)
        table.add_column("gymnasium id", no_wrap=True)
        for col in ("actions", "variant", "description"):
            table.add_column(col, ratio=1)
    else:
        table.add_column("env\ngymnasium id", no_wrap=True)
        table.add_column("actions · variant · description", ratio=1)
    for name, gym_id, actions, variant, description in rows:
        unavailable = actions.startswith("unavailable: ")
        shown = f"[red]{escape(actions)}[/red]" if unavailable else escape(actions)
        if wide:
            table.add_row(name, gym_id, shown, escape(variant), escape(description))
        else:
            details = f"actions: {shown}\nvariant: {escape(variant)}\n{escape(description)}"
            table.add_row(f"{name}\n{gym_id}", details)
    console.print(table)
    console.print(f"config options (env=...): {', '.join(group_options('env'))}", soft_wrap=False)


@app.command(
    "eval",
    cls=_groups_help("eval"),
    epilog=_examples(
        ("agentrl eval env=frozenlake agent=planner", "a classic agent"),
        ("agentrl eval env=snake agent=random eval.episodes=50 seed=1", "more episodes, other seeds"),
        ("agentrl eval env=tictactoe env.opponent=mcts", "the default LLM (embedded SmolLM2) vs MCTS"),
        ("agentrl eval env=bandit model=qwen2.5-3b agent.cot=true", "a hub model that thinks first"),
        (
            "agentrl eval model=openai model.base_url=http://host:8000/v1 model.name=Qwen/Qwen2.5-72B-Instruct",
            "any OpenAI-compatible endpoint",
        ),
        (
            "agentrl eval env=snake agent=dqn agent.path=outputs/2026-12-01/10-00-00.000-1a2b_train_snake",
            "a trained DQN",
        ),
        (
            "agentrl eval model.name_or_path=outputs/2026-12-01/10-00-00.000-1a2b_train_frozenlake/final",
            "a trained LLM",
        ),
    ),
)
@_errors_to_exit
def eval_(overrides: Overrides = None, dry_run: DryRun = False) -> None:
    """Evaluate an agent (LLM or classic) on held-out episodes.

    Plays eval.episodes episodes on held-out seeds and writes eval.json, episodes.jsonl (and
    transcripts.jsonl for LLM agents) into a new run directory."""
    from agentrl.runs.launch import launch

    setup_logging()
    overrides = _overrides(overrides)
    _one_job("eval", overrides)
    if dry_run:
        _print_plan("eval", overrides)
        return
    launch("eval", overrides)


def _print_plan(task: str, overrides: list[str], resume: Path | None = None) -> None:
    """--dry-run: the checked config's summary and the run directory, then every check that failed
    (one `error:` line each, exit 2); nothing run."""
    from agentrl.runs.launch import dry_run
    from agentrl.runs.plan import plan_lines

    plan = dry_run(task, overrides, resume=resume)
    console.print("\n".join(plan_lines(plan)), markup=False, highlight=False, soft_wrap=True)
    for problem in plan.problems:
        typer.echo(f"error: {problem}", err=True)
    if plan.problems:
        raise typer.Exit(max(p.exit_code for p in plan.problems))


@app.command(
    cls=_groups_help("train"),
    epilog=_examples(
        ("agentrl train", "MS-GRPO, embedded SmolLM2 on Frozen Lake (CPU)"),
        ("agentrl train experiment=frozenlake_learn", "the tuned CPU preset"),
        ("agentrl train env=snake model=qwen2.5-3b algo.iterations=500 algo.beta=0.1", "a GPU run"),
        ("agentrl train algo.aaw.enabled=false", "the uniform-sampling ablation"),
        ("agentrl train env=snake algo=dqn", "the DQN baseline (Stable-Baselines3)"),
        (
            "agentrl train --resume outputs/2026-12-01/10-00-00.000-1a2b_train_frozenlake",
            "continue a killed run",
        ),
    ),
)
@_errors_to_exit
def train(
    overrides: Overrides = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Continue a killed run from its newest complete checkpoint"),
    ] = None,
    dry_run: DryRun = False,
) -> None:
    """Post-train an agent (algo=msgrpo by default; algo=dqn for the DQN baseline).

    Writes metrics.jsonl, TensorBoard events, checkpoints and eval.json (before and after training)
    into a new run directory."""
    from agentrl.runs.launch import launch

    setup_logging()
    overrides = _overrides(overrides)
    _one_job("train", overrides)
    # a resumed run keeps its own algo (launch reads it from the run's overrides)
    if resume is None and "resume" not in _keys(overrides):
        overrides = _with_default_algo(overrides)
    if dry_run:
        _print_plan("train", overrides, resume)
        return
    launch("train", overrides, resume=resume)


@app.command(
    cls=_Command,
    epilog=_examples(
        ("agentrl report outputs/", "every run found under outputs/"),
        (
            "agentrl report outputs/multirun/2026-12-01/10-00-00.000-1a2b --table paper",
            "the paper's tables and plots",
        ),
        (
            "agentrl report outputs/multirun/2026-12-01/10-00-00.000-1a2b --out reports/",
            "one sweep, written elsewhere",
        ),
        (
            "agentrl report outputs/multirun/2026-12-01/10-00-00.000-1a2b --target 0.8",
            "time until the greedy eval success first reaches 0.8",
        ),
    ),
)
@_errors_to_exit
def report(
    dirs: Annotated[list[Path], typer.Argument(help="Run or sweep directories to search for runs")],
    out: Annotated[Path | None, typer.Option(help="Where to write report.md, report.csv and plots")] = None,
    table: Annotated[
        str,
        typer.Option(
            help="runs: the standard report; paper: env x method table (mean ± stderr over seeds), "
            "zero-shot vs trained, transfer, paper_curves.png and paper_bars.png; learning: one row per "
            "training run (answer format, before, after ± stderr, untagged, minutes, command)"
        ),
    ] = "runs",
    target: Annotated[
        float,
        typer.Option(
            help="Time-to-target table: minutes and iterations until the greedy eval first reaches "
            "(and stays at) this value, mean ± stderr over seeds"
        ),
    ] = 0.9,
    target_metric: Annotated[
        str,
        typer.Option(help="The metrics.jsonl eval metric --target applies to (e.g. eval/mean_return)"),
    ] = "eval/success_rate",
    best: Annotated[
        bool,
        typer.Option(
            "--best",
            help="--table learning: one row per env, algorithm and answer format, the run with the highest "
            "primary metric after training",
        ),
    ] = False,
) -> None:
    """Tables (markdown, CSV) and plots across runs.

    Writes report.md, report.csv (one row per run), report_groups.csv (mean ± stderr over seeds) and
    PNG plots; for training runs with periodic evals also the time to --target (report_target.csv,
    report_target_runs.csv, target_<env>.png); incomplete runs are listed, never fatal. --table paper
    writes paper.md, paper.csv and the paper's plots instead; --table learning writes learning.md and
    learning.csv."""
    from agentrl.errors import ConfigError, RunDirError, UnknownChoiceError
    from agentrl.report import build_report

    if table not in REPORT_TABLES:
        raise UnknownChoiceError("--table", table, REPORT_TABLES)
    if best and table != "learning":
        raise ConfigError(f"--best applies to --table learning only (not --table {table})")
    missing = [str(d) for d in dirs if not d.exists()]
    if missing:
        raise RunDirError(f"no such directory: {', '.join(missing)}")
    if table == "paper":
        from agentrl.report.paper import build_paper_report

        build_paper_report(list(dirs), out, console=console)
        return
    if table == "learning":
        from agentrl.report.learning import build_learning_report

        build_learning_report(list(dirs), out, console=console, best_only=best)
        return
    build_report(list(dirs), out, console=console, target=target, target_metric=target_metric)


@app.command(
    cls=_groups_help("sweep"),
    epilog=_examples(
        ("agentrl sweep env=frozenlake,snake agent=random,planner", "4 eval jobs, then a table"),
        ("agentrl sweep algo=msgrpo seed=0,1,2", "3 training runs (a sweep with algo= trains)"),
        ("agentrl sweep seed=0,1,2 hydra/launcher=joblib", "jobs in parallel on this machine"),
        ("agentrl sweep algo=msgrpo seed=0,1,2 hydra/launcher=slurm", "jobs submitted to SLURM"),
    ),
)
@_errors_to_exit
def sweep(
    overrides: Overrides = None,
    task: Annotated[
        str,
        typer.Option(
            help="eval or train for every job (default: train when algo=, an algo.* key or a training "
            "preset is given; a training sweep without algo= trains msgrpo)"
        ),
    ] = "",
    dry_run: DryRun = False,
) -> None:
    """Run one job per combination of comma-separated values (Hydra multirun).

    Each job gets its own run directory under outputs/multirun/<date>/<time>/; a summary table follows.
    hydra/launcher=joblib runs jobs in parallel, hydra/launcher=slurm submits them to SLURM."""
    from agentrl.runs.launch import launch
    from agentrl.runs.sweep import check_launcher, print_summary, sweep_trains

    setup_logging()
    overrides = _overrides(overrides)
    check_launcher(overrides)
    task = task or ("train" if sweep_trains(overrides) else "eval")
    if task == "train":  # as `agentrl train`: an algo.* key alone sweeps the default algorithm
        overrides = _with_default_algo(overrides)
    if not any(o.startswith("hydra.sweep.dir=") for o in overrides):
        from agentrl.runs.rundir import new_run_id, run_time

        # fixed here (not left to Hydra's resolvers) so the summary below knows the directory; the id keeps
        # two sweeps started in the same millisecond apart
        stamp = f"{datetime.now():%Y-%m-%d}/{run_time()}-{new_run_id()}"
        overrides.append(f"hydra.sweep.dir=outputs/multirun/{stamp}")
    sweep_dir = Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("hydra.sweep.dir=")))
    if dry_run:
        from agentrl.runs.launch import sweep_plan

        lines, problems = sweep_plan(task, overrides)
        console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
        for problem in problems:
            typer.echo(f"error: {problem}", err=True)
        if problems:
            raise typer.Exit(2)
        return
    from agentrl.config import split_sweep

    launch(task, overrides, multirun=True)
    failed = print_summary(sweep_dir, expected=len(split_sweep(overrides)))
    if failed:
        typer.echo(
            f"error: {failed} sweep job(s) failed (see the table above and their status.json)", err=True
        )
        raise typer.Exit(1)


@app.command(
    cls=_groups_help("play"),
    epilog=_examples(
        ("agentrl play env=tictactoe", "against a random opponent"),
        ("agentrl play env=tictactoe env.opponent=perfect env.agent_mark=O", "second, against perfect play"),
        ("agentrl play env=snake seed=3", "Snake: u/d/l/r or the arrow keys"),
        ("agentrl play env=frozenlake env.map=random env.slippery=true", "a random, slippery lake"),
    ),
)
@_errors_to_exit
def play(overrides: Overrides = None) -> None:
    """Play an environment yourself in the terminal.

    A move is an action's name, a prefix only it has (u for up) or an arrow key; an unknown or illegal
    move is asked again. Ctrl-D or Ctrl-C quits. Needs an interactive terminal."""
    from agentrl.agents import baselines
    from agentrl.agents.baselines import HumanAgent
    from agentrl.envs import env_factory
    from agentrl.errors import ConfigError
    from agentrl.rollout import rollout
    from agentrl.runs.launch import check_job

    overrides = _overrides(overrides)
    picked = [o for o in overrides if o.partition("=")[0].lstrip("+") == "agent"]
    if picked:
        raise ConfigError(
            f"{picked[-1]}: in agentrl play you are the agent; to watch an agent play: agentrl eval "
            f"{picked[-1]} env=<env>"
        )
    if not baselines.stdin_is_interactive():
        raise ConfigError(
            "agentrl play needs a person at a terminal, but stdin is not interactive (closed, a pipe or a "
            "file); run it in a terminal, or watch an agent play: agentrl eval env=<env> agent=planner"
        )
    cfg = check_job(["agent=human", *overrides])
    agent = HumanAgent(console=console)  # refuses to start when stdin is not a terminal
    make_env = env_factory(cfg.env)
    env = make_env()
    console.rule(f"[bold]{cfg.env.name}")
    # Wrapped at word boundaries to the terminal's width; markup off: env text is plain text.
    console.print(env.instructions, markup=False, highlight=False, soft_wrap=False)
    console.print(HumanAgent.controls(env.action_names), markup=False, highlight=False, soft_wrap=False)
    console.rule()
    try:
        episode = rollout(make_env, agent, [int(cfg.seed)])[0]
    except (EOFError, KeyboardInterrupt) as exc:
        console.print("\nbye (game not finished)", highlight=False)
        raise typer.Exit(130 if isinstance(exc, KeyboardInterrupt) else 0) from None
    console.print(episode.final_observation, markup=False, highlight=False, soft_wrap=False)
    outcome = "success" if episode.success else "no success"
    console.print(
        f"[bold]Episode over:[/bold] return {episode.episode_return:.2f} in {episode.length} moves ({outcome})",
        soft_wrap=False,
    )


@app.command(
    cls=_groups_help("config"),
    epilog=_examples(
        ("agentrl config env=snake model=qwen2.5-3b", "the composed config"),
        ("agentrl config env=frozenlake --show-prompt", "and the first prompt the LLM sees"),
        ("agentrl config algo=msgrpo --describe", "every key of an option: type, default, source, help"),
        ("agentrl config --describe", "the top-level keys (seed, eval.episodes, ...)"),
    ),
)
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
    """Print the composed config for the given overrides.

    --show-prompt adds the exact first prompt an LLM agent sees; --describe explains every key of the
    group options named (type, default, allowed values, source, help) instead."""
    from omegaconf import OmegaConf

    from agentrl.config import compose_config
    from agentrl.config.describe import describe_config

    overrides = _overrides(overrides)
    cfg = compose_config(overrides)
    if describe:
        text = describe_config(cfg, overrides, width=console.width)  # wrapped to the terminal or $COLUMNS
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    console.print(OmegaConf.to_yaml(cfg), markup=False, highlight=False)
    if show_prompt and cfg.agent.name != "llm":
        console.rule("prompt")
        console.print(
            f"agent={cfg.agent.name} reads no prompt (only an LLM agent does: agent=llm)", highlight=False
        )
    elif show_prompt:
        from agentrl.agents.llm import describe_interface, format_prompt_preview

        console.rule("prompt")
        console.print(format_prompt_preview(cfg), markup=False, highlight=False)
        console.rule("answer mode")
        console.print(describe_interface(cfg), markup=False, highlight=False)


@app.command(
    cls=_Command,
    epilog=_examples(
        (
            "agentrl push outputs/2026-12-01/10-00-00.000-1a2b_train_frozenlake me/smollm2-frozenlake",
            "final/ and its model card to a Hub model repository",
        ),
        ("agentrl push RUN me/private-model --private", "a private repository"),
    ),
)
@_errors_to_exit
def push(
    run: Annotated[Path, typer.Argument(help="A training run directory (its final/ is uploaded)")],
    repo_id: Annotated[
        str, typer.Argument(help="The Hub model repository, e.g. user/name (created if needed)")
    ],
    private: Annotated[bool, typer.Option("--private", help="Create the repository private")] = False,
) -> None:
    """Upload a trained run's final/ model with its model card to the Hugging Face Hub.

    The card (final/README.md: base model, algorithm, env, eval before and after, command, config) is
    the one the run wrote, or written first where final/ has none. Needs a Hub token (huggingface-cli
    login or HF_TOKEN) and network access."""
    from agentrl.runs.card import push as push_run

    setup_logging()
    url = push_run(run, repo_id, private=private)
    console.print(f"pushed {run / 'final'} to {url}", highlight=False)


@app.command(
    cls=_groups_help("serve"),
    epilog=_examples(
        ("agentrl serve env=frozenlake", "Frozen Lake on http://127.0.0.1:8000 (OpenEnv protocol)"),
        ("agentrl serve env=snake env.size=8 --port 9000", "a variant, on another port"),
        ("agentrl serve env=tictactoe --host 0.0.0.0", "reachable from other machines"),
        ("agentrl eval env=openenv env.url=http://127.0.0.1:8000 agent=random", "play it from agentrl"),
    ),
)
@_errors_to_exit
def serve(
    overrides: Overrides = None,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free port, printed)")] = 8000,
    max_sessions: Annotated[int, typer.Option(help="Clients served at once, one env each")] = 256,
    idle_timeout: Annotated[
        float, typer.Option(help="Seconds after which an idle session is closed (0: never)")
    ] = 600.0,
) -> None:
    """Serve an environment as an OpenEnv environment server (pip install 'agentrl[openenv]').

    Each client (TRL's environment_factory, OpenEnv's clients, agentrl's env=openenv) gets a session
    with its own env; observations carry the text and the valid actions, an action is an action name
    or the agent's answer in the agent.* answer format. Ctrl-C stops it."""
    from agentrl.runs.serve import serve as run_server

    setup_logging()

    def ready(url: str, env: str) -> None:
        console.print(f"serving env={env} on {url} (OpenEnv; Ctrl-C stops)", highlight=False)

    if idle_timeout < 0:
        from agentrl.errors import ConfigError

        raise ConfigError(f"--idle-timeout {idle_timeout}: must be >= 0 seconds (0: never)")
    try:
        run_server(
            _overrides(overrides),
            host=host,
            port=port,
            max_sessions=max_sessions,
            idle_timeout_s=idle_timeout or None,
            ready=ready,
        )
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
