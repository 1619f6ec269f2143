"""`--help` (per-command examples, config groups read from the config tree) and `agentrl play` (word
wrapping, move parsing, arrow keys, quitting, no terminal)."""

from __future__ import annotations

import io
import re
import shutil
import sys

import pytest
from typer.testing import CliRunner

from agentrl import config as config_module
from agentrl.agents import baselines
from agentrl.agents.baselines import HumanAgent, parse_move, short_names
from agentrl.cli import app
from agentrl.config import compose_config, group_options, split_sweep
from agentrl.console import console
from agentrl.envs import make_env
from agentrl.errors import ConfigError

runner = CliRunner()
COMMANDS = ("envs", "eval", "train", "sweep", "play", "config", "report")


def help_of(command: str) -> str:
    result = runner.invoke(app, [command, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def examples(output: str) -> list[str]:
    """The example command lines of a --help output."""
    return [line.strip() for line in output.splitlines() if line.strip().startswith("agentrl ")]


@pytest.fixture
def terminal(monkeypatch):
    """Pretend stdin is a terminal, so `play` reads the runner's input."""
    monkeypatch.setattr(baselines, "stdin_is_interactive", lambda: True)


# ---- --help ----------------------------------------------------------------------------------------
def test_each_command_has_its_own_examples():
    seen: dict[str, list[str]] = {}
    for command in COMMANDS:
        lines = examples(help_of(command))
        assert lines, f"agentrl {command} --help shows no example"
        assert lines[0].startswith(f"agentrl {command}"), lines
        seen[command] = lines
    for a in COMMANDS:
        for b in COMMANDS:
            if a < b:
                assert not set(seen[a]) & set(seen[b]), (a, b)


@pytest.mark.parametrize("command", ["eval", "train", "sweep", "config"])
def test_help_lists_every_group_option_and_its_default(command):
    output = help_of(command)
    assert "Config groups" in output
    rows: dict[str, str] = {}
    group = None
    for line in output.splitlines():
        if m := re.match(r"^\s*(\w+)\s+= (.+)$", line):
            group = m.group(1)
            rows[group] = m.group(2).strip()
        elif group and line.strip() and re.match(r"^\s{6,}\S", line):  # a continued option list
            rows[group] += " " + line.strip()
        else:
            group = None
    groups = ["env", "agent", "model", "experiment"] + ([] if command == "eval" else ["algo"])
    groups += ["distributed"] if command == "train" else []
    for group in groups:
        assert group in rows, f"{group} missing from agentrl {command} --help"
        listed = [o.replace(" (default)", "") for o in rows[group].split(", ")]
        assert set(group_options(group)) <= set(listed), (group, listed)
    assert rows["env"].startswith("frozenlake (default)") and rows["model"].startswith(
        "smollm2-135m (default)"
    )
    assert rows["agent"].startswith("llm (default)") and rows["experiment"].startswith("none by default")
    if command == "train":
        assert rows["algo"].startswith("msgrpo (default)")
    elif command != "eval":
        assert rows["algo"].startswith("none by default")


def test_help_groups_are_read_from_the_config_tree(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(config_module.CONF_DIR, conf)
    (conf / "env" / "zz_new_env.yaml").write_text((conf / "env" / "snake.yaml").read_text())
    root = conf / "config.yaml"
    root.write_text(root.read_text().replace("  - env: frozenlake", "  - env: snake"))
    monkeypatch.setattr(config_module, "CONF_DIR", conf)
    output = help_of("eval")
    flat = " ".join(output.split())  # the option list may continue over several lines
    assert (
        "env = snake (default), bandit, contextual_bandit, datascicoding, frozenlake, kitchen, openenv,"
        " snake_poison, tictactoe, zz_new_env" in flat
    )


@pytest.mark.parametrize("command", ["eval", "train", "config", "sweep", "play"])
def test_help_examples_compose(command):
    """Every example's overrides name existing options and keys and pass the config checks."""
    for line in examples(help_of(command)):
        if not line.startswith(f"agentrl {command}"):
            continue
        words = line.split()[2:]
        overrides = [w for w in words if "=" in w and not w.startswith(("-", "hydra/"))]
        task = "train" if command == "train" or any(o.startswith("algo=") for o in overrides) else "eval"
        if command == "train" and not any(o.startswith("algo=") for o in overrides):
            overrides.insert(0, "algo=msgrpo")
        for job in split_sweep([f"task={task}", *overrides]):
            compose_config(job)


# ---- play ------------------------------------------------------------------------------------------
def test_play_wraps_at_word_boundaries(terminal, monkeypatch):
    monkeypatch.setattr(console, "width", 40)
    result = runner.invoke(app, ["play", "env=tictactoe", "seed=1"], input="1\n2\n3\n4\n5\n6\n7\n8\n9\n")
    assert result.exit_code == 0, result.output
    text = make_env("tictactoe").instructions
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("You are playing tic-tac-toe"))
    block, words = [], text.split()
    while sum(len(line.split()) for line in block) < len(words):
        block.append(lines[start + len(block)])
    assert len(block) > 3 and all(len(line) <= 40 for line in block)
    # every printed line holds whole words, in order: nothing split mid-word
    assert [w for line in block for w in line.split()] == words
    assert "Episode over" in result.output


def test_play_snake_takes_prefixes_and_arrow_keys_then_eof_says_bye(terminal):
    # seed 3 starts the snake at row 8 with nothing above it: three moves up are safe
    result = runner.invoke(app, ["play", "env=snake", "seed=3"], input="u\n\x1b[A\nUP\n")
    assert result.exit_code == 0, result.output
    rows = [int(r) for r in re.findall(r"Your snake \(1\): head at \(row (\d+)", result.output)]
    assert rows == [8, 7, 6, 5], rows
    assert "Illegal" not in result.output and "could be" not in result.output
    assert result.output.rstrip().endswith("bye (game not finished)")
    assert "Traceback" not in result.output


def test_play_ctrl_c_exits_130_with_one_line(terminal, monkeypatch):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(console, "input", interrupted)
    result = runner.invoke(app, ["play", "env=frozenlake"])
    assert result.exit_code == 130 and "bye" in result.output and "Traceback" not in result.output


def test_play_reasks_illegal_moves_and_the_rules_say_so(terminal):
    # tic-tac-toe: after "5" the opponent takes a cell; "5" again is occupied and asked again
    result = runner.invoke(
        app, ["play", "env=tictactoe", "seed=1"], input="5\n5\nx\n" + "\n".join("12346789") * 2
    )
    assert result.exit_code == 0, result.output
    assert "Illegal move '5': 5 is not legal now." in result.output
    assert "Illegal move 'x'." in result.output and "Episode over" in result.output
    assert "An unknown or illegal move is asked again" in result.output
    assert "occupied cell loses" not in result.output


def test_play_refused_without_a_terminal():
    result = runner.invoke(app, ["play", "env=tictactoe"], input="1\n")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: agentrl play needs a person at a terminal, but stdin is not interactive (closed, a pipe or "
        "a file); run it in a terminal, or watch an agent play: agentrl eval env=<env> agent=planner"
    ]


def test_eval_human_refused_without_a_terminal(run_dir):
    result = runner.invoke(app, ["eval", "agent=human", "env=tictactoe", f"hydra.run.dir={run_dir}"])
    assert result.exit_code == 2
    assert "needs a person at a terminal" in result.output and "Traceback" not in result.output


def test_human_agent_needs_a_terminal_unless_given_an_input_function(monkeypatch):
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stdin", closed)
    with pytest.raises(ConfigError, match="needs a person at a terminal"):
        HumanAgent()
    monkeypatch.setattr(sys, "stdin", io.StringIO("up\n"))  # open, but a pipe rather than a terminal
    with pytest.raises(ConfigError, match="stdin is not interactive"):
        HumanAgent()
    assert HumanAgent(ask=lambda prompt: "up").ask("?") == "up"


# ---- move parsing ----------------------------------------------------------------------------------
def test_parse_move_names_prefixes_arrows_and_illegal_moves():
    snake = ["up", "down", "left", "right"]
    for answer, action in [
        ("up", "up"),
        (" Down ", "down"),
        ("u", "up"),
        ("l", "left"),
        ("R", "right"),
        ("\x1b[A", "up"),
        ("\x1b[B", "down"),
        ("\x1b[C", "right"),
        ("\x1b[D", "left"),
        ("\x1bOA", "up"),
    ]:
        assert parse_move(answer, snake, snake) == (action, ""), answer
    assert parse_move("x", snake, snake) == (None, "Illegal move 'x'.")
    assert parse_move("", snake, snake)[0] is None
    # tic-tac-toe: no arrow keys; an occupied cell is named but not legal
    cells = [str(i) for i in range(1, 10)]
    assert parse_move("\x1b[A", cells, cells)[0] is None
    assert parse_move("5", cells, ["1", "2"]) == (None, "Illegal move '5': 5 is not legal now.")
    # an ambiguous prefix names both candidates
    colours = ["blue", "black", "red"]
    assert parse_move("bl", colours, colours) == (None, "'bl' could be blue or black")
    assert parse_move("blu", colours, colours) == ("blue", "")
    assert short_names(snake) == {"up": "u", "down": "d", "left": "l", "right": "r"}
    assert short_names(cells) == {}
