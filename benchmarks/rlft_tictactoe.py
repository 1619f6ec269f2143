"""RLFT on tic-tac-toe with rationales: the return of the embedded SmolLM2-135M against the random and the
MCTS opponent, before and after RLFT (`experiment=rlft_tictactoe`, trained against the random opponent, or
against MCTS with `--train-opponent mcts`), on the same held-out games (the eval seeds of `--seed`), CPU
(docs/algorithms.md#rlft; Schmied et al., arXiv 2504.16078).

Runs, one after another, each through the runner itself (`python -m agentrl.cli`), `--threads` torch threads (default 1):

1. `eval experiment=rlft_tictactoe` against `env.opponent=random` and `env.opponent=mcts` (the base model,
   greedy, with rationales: `base_random/`, `base_mcts/`);
2. `eval agent=random` against both opponents with the preset's env (a reference row: `random_random/`,
   `random_mcts/`);
3. `train experiment=rlft_tictactoe_warmup` (`warmup/`): the format warm-up, TRL's SFTTrainer on random
   legal moves written with the templated rationale the strict parser reads; its final greedy eval on the
   same eval seeds is the "format warm-up" row against the random opponent;
4. `train experiment=rlft_tictactoe init_from=<out>/warmup algo.time_limit_minutes=<--minutes>` (`train/`;
   without `init_from` when the warm-up step is not run and `warmup/` holds no complete run); its final
   greedy eval on the same `--episodes` eval seeds is the trained model against the random opponent;
5. `eval from_run=<out>/train env.opponent=mcts` (`trained_mcts/`).

With `--train-opponent mcts` step 4 trains against the MCTS opponent (the RLFT paper trains one model per
opponent), its final eval is the trained row against MCTS, and the extra step `trained_random` gives its row
against the random opponent. `--train-mcts-simulations N` makes the training opponent a weaker MCTS (N UCT
simulations a move instead of the env's 100): every eval still plays the full one, so the trained row
against MCTS is then step 5's eval (`trained_mcts/`), never training's own.

Two returns are reported, both mean ± stderr over the games: `return`, eval.json's `mean_return` (the game
result plus the -5 penalty of each unusable answer, what training maximises), and `game return`, the
result alone (+1 win, 0 draw, -1 loss: win rate - loss rate). Beside them, from eval.json's `diagnostics`
(agentrl/diagnostics.py), the share of optimal moves and the knowing-doing figures of the rationales:
`knowing` (the rationale picks an optimal move) and `doing given knowing` (the move then played is
optimal); summary.json's rows also carry decisive_optimal_move_rate, reads_board_rate, doing_rate and
agreement_rate. From transcripts.jsonl (`fact_use`): `facts right`, the rationales that state the
winning and blocking cells (`--state-facts` warm-ups teach it) with exactly the board's, and `win/block taken`,
the valid answers that played a winning cell (else a blocking one) where the board had one. It writes `summary.json`, `summary.md` and `rlft_tictactoe.png` into `--out`.

    .venv/bin/python benchmarks/rlft_tictactoe.py                                 # 35 min of training
    .venv/bin/python benchmarks/rlft_tictactoe.py --minutes 10 algo.learning_rate=2e-5
    .venv/bin/python benchmarks/rlft_tictactoe.py --summarize outputs/bench/rlft_tictactoe
    .venv/bin/python benchmarks/rlft_tictactoe.py --steps train        # one step (two invocations on one
                                                                 # --out may run different steps)
    .venv/bin/python benchmarks/rlft_tictactoe.py --steps warmup_random   # re-evaluate the warm-up
                                         # (trained_random: the trained model) into its own directory,
                                         # which then replaces the row's eval.json in the table

`--state-facts` puts the winning and blocking cells in the warm-up's demonstration rationales
(`algo.state_facts=true`); `--warmup-episodes N` and `--warmup-updates N` size the warm-up (`algo.episodes`,
`algo.max_updates`; the preset's 32 episodes and ~15 updates of 8 rows otherwise).

Extra arguments are Hydra overrides: `env.*` ones go to every run, `agent.*`/`model.*` to the LLM runs,
everything else to the training run only. A step whose run directory holds a complete eval.json is
skipped (rerun into the same `--out` to resume).
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.envs.tictactoe import winning_cells

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rlft_bandit import (  # noqa: E402 - the shared runner helpers
    BenchmarkError,
    change,
    complete,
    count_cells,
    display_path,
    fmt,
    preset_env_overrides,
    provenance,
    provenance_lines,
    run_step,
    runner_parser,
    share,
    split_overrides,
    training_info,
    warmup_overrides,
)

PRESET = "rlft_tictactoe"
OPPONENTS = ("random", "mcts")
STEPS = ("random_random", "random_mcts", "base_random", "base_mcts", "warmup", "train", "trained_mcts")
WARMUP = "rlft_tictactoe_warmup"
#: not run by default: the trained (warm-up) model against the random opponent through `eval from_run=`
#: (for a training run stopped before its own final eval, or whose eval predates a figure of the table);
#: then it replaces train/eval.json (warmup/eval.json)
EXTRA_STEPS = ("trained_random", "warmup_random")
#: steps that evaluate a run of this benchmark again: step -> (run directory, opponent)
EVALS_OF_RUNS = {
    "warmup_random": ("warmup", "random"),
    "trained_random": ("train", "random"),
    "trained_mcts": ("train", "mcts"),
}
#: row -> the extra step whose eval replaces the row's own
REPLACEMENTS = {"train": "trained_random", "warmup": "warmup_random"}
#: the knowing-doing figures a row carries (eval.json `diagnostics.knowing_doing`)
KNOWING_DOING = (
    "judged",
    "reads_board_rate",
    "knowing_rate",
    "doing_rate",
    "doing_given_knowing",
    "agreement_rate",
)
#: run directory -> (model label, opponent); `train`'s opponent is the one it was trained against
#: (`--train-opponent`, read back from its .hydra config by `runs_of`)
RUNS = {
    "base_random": ("base model", "random"),
    "warmup": ("format warm-up", "random"),
    "train": ("RLFT-trained", "random"),
    "base_mcts": ("base model", "mcts"),
    "trained_mcts": ("RLFT-trained", "mcts"),
    "random_random": ("random agent", "random"),
    "random_mcts": ("random agent", "mcts"),
}


def train_opponent(out: Path) -> str:
    """The opponent `out/train` was trained (and finally evaluated) against: its config's env.opponent."""
    config = out / "train" / ".hydra" / "config.yaml"
    if config.is_file():
        from omegaconf import OmegaConf

        return str(OmegaConf.load(config).env.get("opponent", "random"))
    return "random"


def config_value(run: Path, key: str) -> Any:
    """A value of a run's composed config (.hydra/config.yaml), or None without one."""
    config = run / ".hydra" / "config.yaml"
    if not config.is_file():
        return None
    from omegaconf import OmegaConf

    return OmegaConf.select(OmegaConf.load(config), key)


def weaker_training_mcts(out: Path) -> int | None:
    """The MCTS simulations `out/train` trained against when they differ from those of the evals against
    MCTS (`--train-mcts-simulations`); None when training played the evals' opponent."""
    if train_opponent(out) != "mcts":
        return None
    trained = config_value(out / "train", "env.mcts_simulations")
    evals = [config_value(out / name, "env.mcts_simulations") for name in ("base_mcts", "trained_mcts")]
    reference = next((v for v in evals if v is not None), eval_mcts_simulations([]))
    return None if trained is None or int(trained) == int(reference) else int(trained)


def eval_mcts_simulations(overrides: list[str]) -> int:
    """The MCTS simulations the evals play: an `env.mcts_simulations=` override, else the preset's."""
    for item in reversed(overrides):
        if item.lstrip("+").startswith("env.mcts_simulations="):
            return int(item.split("=", 1)[1])
    return preset_mcts_simulations()


@functools.cache
def preset_mcts_simulations() -> int:
    """The preset's MCTS simulations (composed once: the summary asks for each row)."""
    from agentrl.config import compose_config

    return int(compose_config([f"experiment={PRESET}"]).env.mcts_simulations)


def runs_of(out: Path) -> dict[str, tuple[str, str]]:
    """Row -> (model label, opponent) for `out`. Trained against MCTS (`--train-opponent mcts`), `train/`'s
    own final eval is the trained model against MCTS, so the `trained_random/` step gives its row against
    the random opponent and `trained_mcts/` replaces `train/` (an eval of it again)."""
    opponent = train_opponent(out)
    if opponent == "random":
        return dict(RUNS)
    weaker = weaker_training_mcts(out)
    if weaker is not None:  # training's own eval played the weaker MCTS: only trained_mcts/ is the MCTS row
        label = f"RLFT-trained vs MCTS-{weaker}"
        order = (
            "base_random",
            "warmup",
            "trained_random",
            "base_mcts",
            "trained_mcts",
            "random_random",
            "random_mcts",
        )
        runs = {**RUNS, "trained_random": (label, "random"), "trained_mcts": (label, "mcts")}
        return {name: runs[name] for name in order}
    label = f"RLFT-trained vs {opponent}"
    order = ("base_random", "warmup", "trained_random", "base_mcts", "train", "random_random", "random_mcts")
    runs = {**RUNS, "trained_random": (label, "random"), "train": (label, opponent)}
    return {name: runs[name] for name in order}


def replacements_of(out: Path) -> dict[str, str]:
    """Row -> the extra step whose eval replaces the row's own (the same model and opponent)."""
    if train_opponent(out) == "random":
        return dict(REPLACEMENTS)
    if weaker_training_mcts(out) is not None:
        return {"warmup": "warmup_random"}
    return {"train": "trained_mcts", "warmup": "warmup_random"}


def target_pairs(out: Path) -> tuple[tuple[str, str, str], ...]:
    """(opponent, base row, trained row) for the before/after targets."""
    if train_opponent(out) == "random" or weaker_training_mcts(out) is not None:
        return (
            ("random", "base_random", "train" if train_opponent(out) == "random" else "trained_random"),
            ("mcts", "base_mcts", "trained_mcts"),
        )
    return (("random", "base_random", "trained_random"), ("mcts", "base_mcts", "train"))


def game_return(data: dict[str, Any]) -> dict[str, float]:
    """Mean ± stderr of the game result (+1/0/-1) from the win and loss rates: with shares w, l over n
    games, the sample variance of the result is (w + l - (w - l)^2) * n / (n - 1)."""
    n = int(data["episodes"])
    w, loss = float(data.get("mean_win_rate", math.nan)), float(data.get("mean_loss_rate", math.nan))
    mean = w - loss
    if n < 2 or math.isnan(mean):
        return {"mean": mean, "stderr": 0.0 if n < 2 else math.nan}
    var = max(w + loss - mean**2, 0.0) * n / (n - 1)
    return {"mean": mean, "stderr": math.sqrt(var / n)}


def load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise BenchmarkError(f"{path} not found")
    data = json.loads(path.read_text())
    if "mean_win_rate" not in data:
        raise BenchmarkError(f"{path} has no mean_win_rate (not a tic-tac-toe eval?)")
    if "rationale_rate" not in data:
        data["rationale_rate"] = rationale_rate(path.parent / "transcripts.jsonl")
    return data


def rationale_rate(transcripts: Path) -> float | None:
    """The share of answers with a closed, non-empty `<think>`, from an eval's transcripts.jsonl, for an
    eval.json written before it carried `rationale_rate`; None without transcripts or rationales asked."""
    from agentrl.agents.llm import TextInterface

    if not transcripts.is_file():
        return None
    rows = [json.loads(line) for line in transcripts.read_text().splitlines() if line.strip()]
    asked = [r for r in rows if "inside <think>" in str(r.get("prompt", ""))]
    if not asked:
        return None
    judge = TextInterface(cot=True)
    return sum(judge.has_rationale(str(r.get("completion", ""))) for r in asked) / len(asked)


#: one row of a board as the observation draws it: " X | 2 | O"
_BOARD_ROW = re.compile(r"^ ?([XO1-9]) \| ([XO1-9]) \| ([XO1-9])[ \t]*$", re.MULTILINE)
_STATED_WINS = re.compile(r"Winning cells for [XO]: ([^.<]*)\.")
_STATED_BLOCKS = re.compile(r"Cells that block [XO]: ([^.<]*)\.")
_STATED_NONE = "No line can be completed"


def fact_use(transcripts: Path) -> dict[str, int] | None:
    """From an eval's transcripts.jsonl, how the answers use the env's facts (`TextEnv.facts`: the cells
    that win now and those that block the opponent's win; `algo.state_facts` demonstrations state them):
    `stated`, the rationales that state them in that form; `exact`, those whose winning and blocking cells
    are the board's; `chances`, the valid answers on a board with a winning or blocking cell; `taken`, those
    that played a winning cell, or a blocking one where none wins. The board is the last one drawn in the
    prompt. None without transcripts."""
    if not transcripts.is_file():
        return None
    out = {"stated": 0, "exact": 0, "chances": 0, "taken": 0}
    for line in transcripts.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        prompt, completion = str(r.get("prompt", "")), str(r.get("completion") or "")
        rows, mark = _BOARD_ROW.findall(prompt)[-3:], re.search(r"You play ([XO])", prompt)
        if len(rows) != 3 or mark is None:
            continue
        board = ["" if c.isdigit() else c for row in rows for c in row]
        wins = {str(c + 1) for c in winning_cells(board, mark.group(1))}
        blocks = {str(c + 1) for c in winning_cells(board, "O" if mark.group(1) == "X" else "X")}
        stated_wins, stated_blocks = _STATED_WINS.search(completion), _STATED_BLOCKS.search(completion)
        if stated_wins or stated_blocks or _STATED_NONE in completion:
            out["stated"] += 1
            cells = [
                set(re.findall(r"[1-9]", m.group(1))) if m else set() for m in (stated_wins, stated_blocks)
            ]
            out["exact"] += cells == [wins, blocks]
        if (wins or blocks) and r.get("valid"):
            out["chances"] += 1
            out["taken"] += str(r.get("action")) in (wins or blocks)
    return out


def row_of(data: dict[str, Any], transcripts: Path) -> dict[str, Any]:
    return {
        "episodes": data["episodes"],
        "seed": data.get("seed"),
        "return": {"mean": data["mean_return"], "stderr": data["return_stderr"]},
        "game_return": game_return(data),
        "win_rate": data.get("mean_win_rate"),
        "draw_rate": data.get("mean_draw_rate"),
        "loss_rate": data.get("mean_loss_rate"),
        "invalid_rate": data.get("invalid_rate"),
        "untagged_rate": data.get("untagged_rate"),
        "rationale_rate": data.get("rationale_rate"),
        **move_figures(data),
        "facts": fact_use(transcripts),
    }


def move_figures(data: dict[str, Any]) -> dict[str, Any]:
    """eval.json's move diagnostics (agentrl/diagnostics.py `tictactoe_diagnostics`): the share of optimal
    moves and the knowing-doing figures of the rationales; None where the eval predates them or has no
    rationales."""
    d = data.get("diagnostics") if isinstance(data.get("diagnostics"), dict) else {}
    kd = d.get("knowing_doing") if isinstance(d.get("knowing_doing"), dict) else {}
    moves = {k: d.get(k) for k in ("optimal_move_rate", "decisive_optimal_move_rate")}
    return {**moves, **{k: kd.get(k) for k in KNOWING_DOING}}


def run_eval_path(out: Path, name: str) -> Path:
    """eval.json of a row: its replacement's (`replacements_of`) when that exists, else its own."""
    extra = replacements_of(out).get(name)
    if extra and (out / extra / "eval.json").is_file():
        return out / extra / "eval.json"
    return out / name / "eval.json"


def summarize(out: Path, results: Path | None = None) -> dict[str, Any]:
    runs = runs_of(out)
    evals = {name: load(run_eval_path(out, name)) for name in runs if run_eval_path(out, name).is_file()}
    if not evals:
        raise BenchmarkError(f"no eval.json under {out}/{{{','.join(runs)}}}")
    seeds = {e.get("seed") for e in evals.values()}
    counts = {e.get("episodes") for e in evals.values()}
    if len(seeds) > 1 or len(counts) > 1:
        raise BenchmarkError(f"the evals differ in seed ({seeds}) or episode count ({counts})")
    dirs = {name: run_eval_path(out, name).parent for name in evals}
    rows = {
        name: {
            **row_of(e, dirs[name] / "transcripts.jsonl"),
            "model": runs[name][0],
            "opponent": runs[name][1],
            "made_by": provenance(dirs[name]),
        }
        for name, e in evals.items()
    }
    summary: dict[str, Any] = {
        "preset": PRESET,
        "out": display_path(out),
        "train_opponent": train_opponent(out),
        "train_mcts_simulations": weaker_training_mcts(out),
        "runs": rows,
        "missing": [name for name in runs if name not in evals],
    }
    if (out / "train").is_dir():
        summary["training"] = training_info(out / "train")
        own = out / "train" / "eval.json"  # training's own eval (not a row when it played a weaker MCTS)
        summary["training"]["train_time_s"] = (
            json.loads(own.read_text()).get("train_time_s") if own.is_file() else None
        )
    targets = {}
    for opponent, before, after in target_pairs(out):
        if before in rows and after in rows:
            targets[f"return_vs_{opponent}_rises"] = change(rows[before]["return"], rows[after]["return"], +1)
            targets[f"game_return_vs_{opponent}_rises"] = change(
                rows[before]["game_return"], rows[after]["game_return"], +1
            )
    summary["targets"] = targets
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    md = markdown(summary)
    (out / "summary.md").write_text(md)
    plot(rows, out / "rlft_tictactoe.png")
    if results is not None:
        results.mkdir(parents=True, exist_ok=True)
        (results / "rlft_tictactoe.md").write_text(md)
        small = json.loads(json.dumps(summary))
        small.get("training", {}).pop("curve", None)
        (results / "rlft_tictactoe.json").write_text(json.dumps(small, indent=2))
        plot(rows, results / "rlft_tictactoe.png")
    print(md, flush=True)
    return summary


def fact_cells(facts: dict[str, int] | None) -> str:
    """The two markdown cells of `fact_use`."""
    return count_cells(facts, ("exact", "stated"), ("taken", "chances"))


def markdown(summary: dict[str, Any]) -> str:
    rows = summary["runs"]
    opponent = summary.get("train_opponent", "random")
    if summary.get("train_mcts_simulations"):
        opponent += f" (MCTS with {summary['train_mcts_simulations']} simulations a move; every eval plays the full one)"
    first = next(iter(rows.values()))
    lines = [
        "# RLFT on tic-tac-toe (SmolLM2-135M, CPU)",
        "",
        f"Same {first['episodes']} held-out games (eval seeds of seed={first['seed']}) for every row; the agent "
        "plays X and moves first; greedy LLM decoding with rationales (`experiment=rlft_tictactoe`, trained "
        f"against the {opponent} opponent). `return`: eval.json's mean_return (game result plus -5 per unusable "
        "answer); `game return`: win rate - loss rate. Mean ± stderr over games. `rationale`: the share of answers "
        "with a closed, non-empty `<think>` (the strict parser also accepts a bare tagged answer; `-`: an eval "
        "without this figure or without rationales). `optimal moves`: the share of "
        "the agent's moves that perfect play would make (an invalid answer counts as none); `knowing`: over "
        "the valid answers with a rationale in positions where some move is not optimal, the share whose "
        "rationale picks an optimal move; `doing given knowing`: of those, the share that then play an optimal "
        "move (agentrl/diagnostics.py; `-`: no rationales, or an eval without these figures). `facts right`: of "
        "the rationales that state the winning and blocking cells (`algo.state_facts` demonstrations teach "
        'it: "Winning cells for X: 3. Cells that block O: 7."), those that name exactly the board\'s; `win/block '
        "taken`: of the valid answers on a board where a cell wins or blocks, those that played a winning cell "
        "(a blocking one where none wins); both from transcripts.jsonl.",
        "",
        "| model | opponent | n | return | game return | win | draw | loss | invalid rate | untagged rate |"
        " rationale | optimal moves | knowing | doing given knowing | facts right | win/block taken |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows.values():
        lines.append(
            f"| {r['model']} | {r['opponent']} | {r['episodes']} | {fmt(r['return'], 2)} | {fmt(r['game_return'], 2)} |"
            f" {share(r['win_rate'])} | {share(r['draw_rate'])} | {share(r['loss_rate'])} | {share(r['invalid_rate'])} |"
            f" {share(r.get('untagged_rate'))} | {share(r.get('rationale_rate'))} | {share(r.get('optimal_move_rate'))} |"
            f" {share(r.get('knowing_rate'))} | {share(r.get('doing_given_knowing'))} | {fact_cells(r.get('facts'))} |"
        )
    training = summary.get("training")
    if training:
        lines += [
            "",
            f"Training (against the {opponent} opponent): {training.get('iterations')} iterations in "
            f"{training.get('train_minutes')} min (train_time_s {training.get('train_time_s')}; run status "
            f"{training.get('status')}"
            + (f": {training['reason']}" if training.get("reason") else "")
            + ").",
        ]
    if summary.get("targets"):
        lines += [
            "",
            "| target (base → RLFT) | before | after | change ± stderr of change | met |",
            "|---|---|---|---|---|",
        ]
        for key, t in summary["targets"].items():
            lines.append(
                f"| {key.replace('_', ' ')} | {fmt(t['before'], 2)} | {fmt(t['after'], 2)} |"
                f" {t['change']:+.2f} ± {t['stderr_of_change']:.2f} | {'yes' if t['met'] else 'no'} |"
            )
    labels = {name: f"{r['model']}, opponent {r['opponent']}" for name, r in rows.items()}
    lines += provenance_lines(rows, labels)
    if summary.get("missing"):
        lines += ["", f"Missing runs: {', '.join(summary['missing'])}."]
    return "\n".join(lines) + "\n"


def plot(rows: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    trained = next(
        (r["model"] for r in rows.values() if r["model"].startswith("RLFT-trained")), "RLFT-trained"
    )
    models = [("base model", "C0"), ("format warm-up", "C1"), (trained, "C3"), ("random agent", "0.5")]
    width = 0.2
    for ax, key, ylabel in (
        (axes[0], "return", "return (game result, -5 per unusable answer)"),
        (axes[1], "game_return", "game return (win - loss)"),
    ):
        for i, (model, color) in enumerate(models):
            xs, ys, es = [], [], []
            for j, opponent in enumerate(OPPONENTS):
                match = [r for r in rows.values() if r["model"] == model and r["opponent"] == opponent]
                if match:
                    xs.append(j + (i - 1.5) * width)
                    ys.append(match[0][key]["mean"])
                    es.append(match[0][key]["stderr"])
            if xs:
                ax.bar(xs, ys, width, yerr=es, capsize=3, color=color, label=model)
        ax.set_xticks(range(len(OPPONENTS)))
        ax.set_xticklabels([f"vs {o} opponent" for o in OPPONENTS])
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xlabel("opponent")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_ylim(-1.05, 1.05)
    axes[1].legend(fontsize=9, loc="upper right")
    n = next(iter(rows.values()))["episodes"]
    fig.suptitle(f"Tic-tac-toe, {n} held-out games per bar: mean ± stderr")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = runner_parser(__doc__, PRESET, STEPS, EXTRA_STEPS, "games per row")
    parser.add_argument(
        "--train-opponent",
        choices=OPPONENTS,
        default="random",
        help="the opponent RLFT trains against (the warm-up and base rows do not depend on it)",
    )
    parser.add_argument(
        "--train-mcts-simulations",
        type=int,
        default=None,
        metavar="N",
        help="with --train-opponent mcts: train against MCTS with N simulations a move (a weaker opponent "
        "that loses more often); every eval plays the env's MCTS (default: train against that one too)",
    )
    args, extra = parser.parse_known_args(argv)
    try:
        if args.summarize:
            summarize(args.summarize, args.results)
            return 0
        if args.episodes < 1 or args.minutes <= 0:
            raise BenchmarkError("--episodes must be >= 1 and --minutes > 0")
        if args.train_mcts_simulations is not None and (
            args.train_opponent != "mcts" or args.train_mcts_simulations < 1
        ):
            raise BenchmarkError("--train-mcts-simulations needs --train-opponent mcts and N >= 1")
        routed = split_overrides(extra)
        # the evals against MCTS play the same opponent whatever training played (from_run keeps the run's env)
        eval_mcts = [f"env.mcts_simulations={eval_mcts_simulations(routed['all'])}"]
        train_mcts = (
            [f"env.mcts_simulations={args.train_mcts_simulations}"]
            if args.train_mcts_simulations is not None
            else []
        )
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
        common = [f"seed={args.seed}", f"eval.episodes={args.episodes}"]
        env = [o for o in preset_env_overrides(PRESET) if not o.startswith("env.opponent=")]
        start = time.perf_counter()
        for opponent in [o for o in OPPONENTS if f"random_{o}" in args.steps]:
            run_step(
                f"random_{opponent}",
                ["eval", *env, f"env.opponent={opponent}", "agent=random", *common, *routed["all"]],
                out,
                args.threads,
            )
        for opponent in [o for o in OPPONENTS if f"base_{o}" in args.steps]:
            run_step(
                f"base_{opponent}",
                ["eval", f"experiment={PRESET}", f"env.opponent={opponent}", *common, *routed["llm"]],
                out,
                args.threads,
            )
        if "warmup" in args.steps:
            run_step(
                "warmup",
                [
                    "train",
                    f"experiment={WARMUP}",
                    *warmup_overrides(args),
                    *common,
                    f"algo.torch_threads={args.threads}",
                    "algo.eval_before=false",  # the base model's rows are base_*/
                    *routed["llm"],
                ],
                out,
                args.threads,
            )
        if "train" in args.steps:
            init = [f"init_from={out / 'warmup'}"] if complete(out / "warmup") else []
            run_step(
                "train",
                [
                    "train",
                    f"experiment={PRESET}",
                    f"env.opponent={args.train_opponent}",
                    *common,
                    f"algo.time_limit_minutes={args.minutes}",
                    f"algo.iterations={args.iterations}",
                    f"algo.torch_threads={args.threads}",
                    "algo.eval_before=false",  # the base model's rows are base_*/, the warm-up's warmup/
                    *init,
                    *routed["train"],
                    *train_mcts,
                ],
                out,
                args.threads,
            )
        for name, (run, opponent) in EVALS_OF_RUNS.items():
            if name in args.steps:
                eval_args = ["eval", f"from_run={out / run}", f"env.opponent={opponent}", *eval_mcts]
                run_step(name, [*eval_args, *common, *routed["all"]], out, args.threads)
        print(f"all steps done in {(time.perf_counter() - start) / 60:.1f} min", flush=True)
        summarize(out, args.results)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
