"""Decision-making diagnostics of the RLFT paper (Schmied et al. 2025, "LLMs are Greedy Agents",
arXiv 2504.16078) over played episodes of a bandit-like env, for any agent.

Everything is recomputed from what an `Episode` records: the arm of each step (`Step.action`), its env
reward (`Step.env_reward`), the completion text of an LLM step (`Step.generation`) and, from the final
info, the arm means (fixed `arm_means`, or `step_arm_means` for means that change per step) and the arm
names of the episode (`decision_data`). An env qualifies when its final info carries both; evaluation
then writes `decision_diagnostics` to eval.json under `diagnostics`. Definitions
(docs/algorithms.md#rlft-diagnostics):

- **regret curve**: cumulative expected regret after t pulls, ``sum_{s<=t} (max_a mu_{s,a} - mu_{s,a_s})``;
- **coverage curve**: share of the K arms pulled at least once in the first t pulls;
  both are mean ± stderr over the episodes still running at step t;
- **greediness**: over pulls 2..T, the share that pick an arm already tried whose empirical mean is the
  highest among tried arms (ties: any arm that attains the highest mean counts; an untried arm never
  counts, however promising);
- **frequency bias**: over pulls 2..T, the share that pick a most frequent arm of the context (the
  previous pulls of the episode, or the last `window` of them); ties: any arm that attains the highest
  count counts. Binned by that highest count (1, 2-3, 4-7, 8-15, 16+), each bin with its cases, the
  share that repeated it and the chance share (tied arms / K, what a uniformly random agent scores);
- **knowing-doing gap** (steps whose completion has a rationale, `has_rationale`): the UCB-optimal arms
  before a step are the untried arms if any, else the argmax of UCB1 ``mean_a + sqrt(c ln t / n_a)`` (t = pulls so far;
  ties within 1e-9 all count). `ucb_arm_from_rationale` reads the arm the rationale calls best. A step is
  *knowing* when that arm is UCB-optimal, *doing* when the executed arm is UCB-optimal, *greedy* when it
  is not UCB-optimal but is an empirically best arm (greediness above). Steps whose answer was invalid
  (the env executed a fallback arm) and steps where every arm is UCB-optimal (the first pull) are not
  judged.

Tic-tac-toe (`tictactoe_diagnostics`; an episode qualifies when its final info carries `step_boards`, the
board before each agent move, and `state["agent_mark"]`) has no arms and means: each move is judged
against perfect play. The *optimal moves* of a position are those of highest perfect-play value for the
agent, the opponent playing to win (`envs/tictactoe.py perfect_moves`, the planner's negamax: a win beats
a draw beats a loss, a sooner win a later one, a later loss a sooner one). A step is *decisive* when some
legal move is not optimal (every opening move draws, and a last free cell is no choice).

- **optimal moves**: over every agent step of any agent, the share whose answer was valid and whose move
  is optimal (`optimal_move_rate`; an invalid answer, whose fallback the env played, is no optimal
  move), and the same over the decisive steps (`decisive_optimal_move_rate`: a random agent scores the
  others for free);
- **knowing-doing gap** (steps whose completion has a rationale, `has_rationale`): *judged* are the
  decisive steps whose answer was valid (the env played the model's own move). `listed_moves` reads the
  cells a rationale lists as the legal moves ("The valid actions are 1, 3, 5", "Legal moves: 2, 4 and
  9"), `move_from_rationale` the cell it picks (`parse_rationale`'s cue tiers over the nine cells: "I
  choose 5", "I will play 7", "the best move is 3"; else the last legal cell it names). A judged step
  *reads the board* when its list equals the legal moves exactly (`reads_board_rate` is over the judged
  steps that list them), is *knowing* when the picked cell is optimal, *doing* when the executed move is
  optimal, and *agrees* when the two are one cell: `knowing_rate`, `doing_rate`, `doing_given_knowing`,
  `doing_given_not_knowing`, `agreement_rate`, `parse_rate` and the counts.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

from agentrl.envs.tictactoe import empty_cells, perfect_moves
from agentrl.types import Episode

log = logging.getLogger(__name__)

#: UCB1's exploration constant where the agent has none of its own (conf/agent/planner.yaml's default)
DEFAULT_UCB_C = 2.0
#: frequency-bias bins by the count of the most frequent arm in the context: (label, low, high)
FREQUENCY_BINS: tuple[tuple[str, int, float], ...] = (
    ("1", 1, 1),
    ("2-3", 2, 3),
    ("4-7", 4, 7),
    ("8-15", 8, 15),
    ("16+", 16, math.inf),
)
_TIE = 1e-9
#: the fewest words outside a tagged answer that count as a rationale when there is no <think> block
MIN_RATIONALE_WORDS = 3

# ---------------------------------------------------------------------------------------------
# the rationale parser
# ---------------------------------------------------------------------------------------------
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.IGNORECASE | re.DOTALL)
_TAGGED = re.compile(r"<(\w+)>.*?</\1>", re.DOTALL)
#: sentence ends: . ! ? before whitespace or the end (so "0.75" stays whole), ; and newlines
_SENTENCE = re.compile(r"[.!?](?=\s|$)|[;\n]")
_UCB = r"(?:ucb1?|upper[- ]confidence(?:[- ]bounds?)?)"
#: tier 1: the rationale says which arm has the highest upper confidence bound
_UCB_CUES = re.compile(
    "|".join(
        (
            rf"\b(?:highest|largest|greatest|biggest|maximum|maximal|max|top|best)\s+(?:\w+\s+)?{_UCB}",
            rf"\b{_UCB}[- ]?optimal\b",
            rf"\bmaximi[sz](?:es|ing|e)\s+(?:the\s+)?{_UCB}",
            rf"\b{_UCB}\s+(?:value\s+|score\s+|index\s+)?(?:(?:of|for)\s+(?:the\s+)?\S+\s+(?:button\s+|arm\s+)?)?"
            r"(?:is\s+|are\s+)?(?:the\s+)?(?:highest|largest|greatest|biggest|maximal|infinite|infinity)\b",
            rf"\b(?:infinite|unbounded)\s+{_UCB}",
        )
    ),
    re.IGNORECASE,
)
#: tier 2: the rationale says which arm it means to pick, or calls one the best choice
_INTENT_CUES = re.compile(
    "|".join(
        (
            r"\b(?:should|will|shall|must|would|'ll|'d|going\s+to|decide\s+to|want\s+to|let\s+me|plan\s+to)\s+"
            r"(?:\w+\s+)?(?:press|pick|choose|select|pull|try|play|click|go\s+with|stick\s+with|exploit|explore)\b",
            r"\bi\s+(?:press|pick|choose|select|pull|try|play)\b",
            r"\b(?:best|optimal|right|smartest|wisest)\s+(?:arm|button|choice|option|action|move|bet)\b",
            r"\b(?:my|the)\s+(?:choice|answer|decision|pick)\s+(?:is|will\s+be)\b",
            r"\bnext\s+(?:press|pick|pull|action)\b",
        )
    ),
    re.IGNORECASE,
)
_NEGATED_CUE = re.compile(r"\b(?:not|never)\b|n't\b", re.IGNORECASE)
#: words just before a cue that make the arm named before it its subject ("green has the highest UCB")
_OWNS = re.compile(
    r"\b(?:has|had|have|gets|got|offers|shows|holds|carries|gives|yields|reaches|achieves)\s+"
    r"(?:the\s+|a\s+|an\s+)?(?:\w+\s+)?$",
    re.IGNORECASE,
)
#: words just before a mention that take it out of the running ("not the blue button", "rather than red")
_NEGATION_BEFORE = re.compile(
    r"(?:\bnot|n't|\bnever|\bno|\bnor|\binstead\s+of|\brather\s+than|\bthan|\bavoid(?:ing)?|\bother\s+than"
    r"|\bexcept|\bbesides|\bover|\bignore|\bskip|\bapart\s+from)\s+(?:the\s+|a\s+|an\s+)?(?:\w+\s+)?$",
    re.IGNORECASE,
)
#: words just after a mention that deny it ("blue is not the best")
_NEGATION_AFTER = re.compile(
    r"^\s*(?:button|arm)?\s*(?:(?:is|was|does|did|might|may|would|could|will|can|should)\s+(?:not|never|no\s+longer)\b"
    r"|(?:is|was|does|did|wo|ca|should|would|could)n't\b|cannot\b)",
    re.IGNORECASE,
)


def rationale_text(text: str) -> str:
    """The reasoning part of a completion: the `<think>` blocks when there are any (an unclosed one runs
    to the end), else the text without its tagged answers, so the action tag is never read as belief."""
    blocks = _THINK.findall(text)
    if blocks:
        return "\n".join(blocks)
    return _TAGGED.sub(" ", text)


def has_rationale(text: str | None) -> bool:
    """True when a completion carries reasoning: a `<think>` block, or at least `MIN_RATIONALE_WORDS`
    words besides its tagged answer (a bare answer such as "blue" or "<action>blue</action>" is none)."""
    if not text:
        return False
    return bool(_THINK.search(text)) or len(rationale_text(text).split()) >= MIN_RATIONALE_WORDS


def _mentions(sentence: str, arm_names: Sequence[str]) -> list[tuple[int, int, str]]:
    """(start, end, name) of each whole-word mention of an arm, in order, negated ones left out."""
    found = []
    for name in arm_names:
        for m in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", sentence, re.IGNORECASE):
            found.append((m.start(), m.end(), name))
    found.sort()
    return [
        (s, e, n)
        for s, e, n in found
        if not _NEGATION_BEFORE.search(sentence[max(0, s - 40) : s])
        and not _NEGATION_AFTER.match(sentence[e:])
    ]


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE.split(text) if s.strip()]


def _arm_at_cue(sentence: str, cue: re.Match[str], mentions: list[tuple[int, int, str]]) -> str | None:
    """The arm a cue is about: the last one named before a cue it owns ("green has the highest UCB"),
    else the first named in or after the cue in its sentence, else the last named before it."""
    after = [n for s, _, n in mentions if s >= cue.start()]
    before = [n for _, e, n in mentions if e <= cue.start()]
    if before and _OWNS.search(sentence[: cue.start()]):
        return before[-1]
    if after:
        return after[0]
    return before[-1] if before else None


def parse_rationale(text: str, arm_names: Sequence[str], fallback: bool = True) -> tuple[str | None, str]:
    """(arm name, rule) for the arm a rationale calls UCB-optimal or best to pick, rule one of `ucb`,
    `intent`, `fallback`, `none`. Rules, in order, on `rationale_text(text)` split into sentences:

    1. `ucb`: the last sentence with a highest-UCB cue ("highest UCB", "UCB-optimal", "maximises the
       upper confidence bound", "the UCB of red is highest", "UCB is infinite", ...) names the arm: the
       last arm named before a cue it owns ("blue has the highest UCB, but red ..."), else the first arm
       named in or after the cue in that sentence, else the last one before it;
    2. `intent`: the same with a cue of choice ("I should press", "I'll go with", "the best button is",
       "my choice is"); a negated cue ("should not press") is no cue;
    3. `fallback` (when `fallback`): the last arm named anywhere in the rationale.

    Mentions are whole words, case-insensitive; a mention preceded by a negation ("not the blue
    button", "rather than red", "instead of green", "higher than blue") or followed by one ("blue is not
    ...") is ignored by every rule."""
    body = rationale_text(str(text))
    sentences = [(s, _mentions(s, arm_names)) for s in _sentences(body)]
    for rule, cues in (("ucb", _UCB_CUES), ("intent", _INTENT_CUES)):
        for sentence, mentions in reversed(sentences):
            hits = [m for m in cues.finditer(sentence) if not _NEGATED_CUE.search(m.group(0))]
            for cue in reversed(hits):
                arm = _arm_at_cue(sentence, cue, mentions)
                if arm is not None:
                    return arm, rule
    if fallback:
        for _, mentions in reversed(sentences):
            if mentions:
                return mentions[-1][2], "fallback"
    return None, "none"


def ucb_arm_from_rationale(text: str, arm_names: Sequence[str]) -> str | None:
    """The arm a written rationale names as UCB-optimal / best to pick, or None (`parse_rationale`)."""
    return parse_rationale(text, arm_names)[0]


# ---------------------------------------------------------------------------------------------
# per-step quantities
# ---------------------------------------------------------------------------------------------
def decision_data(episode: Episode) -> tuple[list[str], list[list[float]]] | None:
    """(arm names, the arm means at each step) of a bandit-like episode, else None. Two forms qualify:
    a context-free bandit, whose final info has fixed `arm_means` and `state["names"]` (envs/bandit.py),
    and a bandit whose means change from step to step, whose final info has `step_arm_means` (one list
    of K means per step, the means the step's arm was drawn from) and `state["names"]` or
    `state["arm_names"]`. A final info with `arm_means` but only `arm_names` (means of the next context,
    not of the steps played) does not qualify."""
    info = episode.final_info or {}
    state = info.get("state") if isinstance(info.get("state"), dict) else {}
    per_step = info.get("step_arm_means")
    if isinstance(per_step, (list, tuple)):
        names = state.get("names", state.get("arm_names"))
        if isinstance(names, (list, tuple)) and len(per_step) == episode.length:
            if all(isinstance(m, (list, tuple)) and len(m) == len(names) for m in per_step):
                return [str(n) for n in names], [[float(v) for v in m] for m in per_step]
        return None
    names, means = state.get("names"), info.get("arm_means")
    if isinstance(names, (list, tuple)) and isinstance(means, (list, tuple)) and len(names) == len(means):
        fixed = [float(v) for v in means]
        return [str(n) for n in names], [fixed] * episode.length
    return None


def has_decision_data(episode: Episode) -> bool:
    """True when `decision_data` finds arm names and means in the episode (a bandit-like env)."""
    return decision_data(episode) is not None


def final_coverage_regret(episode: Episode) -> tuple[float, float] | None:
    """A bandit-like episode's share of arms tried by its last pull and its cumulative regret (the
    `final_coverage` and `final_regret` that `decision_diagnostics` averages); None for other episodes."""
    found = decision_data(episode) if episode.steps else None
    if found is None:
        return None
    names, step_means = found
    arms = [int(step.action) for step in episode.steps]
    regret = sum(max(means) - means[arm] for arm, means in zip(arms, step_means, strict=True))
    return len(set(arms)) / len(names), float(regret)


def empirical_best_arms(counts: Sequence[int], sums: Sequence[float]) -> set[int]:
    """Tried arms whose empirical mean is the highest among tried arms (empty before the first pull)."""
    means = {a: sums[a] / n for a, n in enumerate(counts) if n > 0}
    if not means:
        return set()
    top = max(means.values())
    return {a for a, m in means.items() if m >= top - _TIE}


def ucb_optimal_arms(counts: Sequence[int], sums: Sequence[float], c: float = DEFAULT_UCB_C) -> set[int]:
    """Arms of highest UCB1 index: every untried arm (infinite index) if any, else the argmax of
    ``sums/n + sqrt(c ln t / n)``, t = pulls so far, with ties."""
    untried = {a for a, n in enumerate(counts) if n == 0}
    if untried:
        return untried
    log_t = math.log(sum(counts))
    scores = [s / n + math.sqrt(c * log_t / n) for s, n in zip(sums, counts, strict=True)]
    top = max(scores)
    return {a for a, v in enumerate(scores) if v >= top - _TIE}


def most_frequent_arms(context: Sequence[int]) -> tuple[set[int], int]:
    """The arms that occur most often in `context` and that count (empty set, 0 for no context)."""
    counts: dict[int, int] = {}
    for a in context:
        counts[a] = counts.get(a, 0) + 1
    if not counts:
        return set(), 0
    top = max(counts.values())
    return {a for a, n in counts.items() if n == top}, top


def _bin_of(count: int) -> int:
    return next(i for i, (_, lo, hi) in enumerate(FREQUENCY_BINS) if lo <= count <= hi)


def _mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


# ---------------------------------------------------------------------------------------------
# the diagnostics
# ---------------------------------------------------------------------------------------------
def decision_diagnostics(
    episodes: Sequence[Episode], ucb_c: float | None = None, window: int | None = None
) -> dict[str, Any] | None:
    """The JSON-able diagnostics of the episodes that carry decision data (None when none does):
    `curves` (per step t = 1..T: episodes, regret_mean/stderr, coverage_mean/stderr), `final_regret`
    and `final_coverage` (mean, stderr), `greediness`, `frequency_bias` (overall and `bins`) and, when
    any step carries a rationale, `knowing_doing`. `ucb_c`: UCB1's c for the knowing-doing gap
    (default `DEFAULT_UCB_C`); `window`: the frequency-bias context, the last `window` pulls (default:
    every earlier pull of the episode)."""
    usable = [e for e in episodes if has_decision_data(e) and e.steps]
    if not usable:
        return None
    c = DEFAULT_UCB_C if ucb_c is None else float(ucb_c)
    regret_curves: list[list[float]] = []
    coverage_curves: list[list[float]] = []
    greedy = judged = 0
    bins = [{"cases": 0, "repeats": 0, "chance": 0.0} for _ in FREQUENCY_BINS]
    kd = {
        "steps_with_rationale": 0,
        "judged": 0,
        "skipped_invalid": 0,
        "parsed": 0,
        "parsed_by": {"ucb": 0, "intent": 0, "fallback": 0},
        "knowing": 0,
        "knowing_doing": 0,
        "knowing_greedy": 0,
        "not_knowing": 0,
        "not_knowing_doing": 0,
    }
    arms_seen: set[int] = set()
    for episode in usable:
        names, step_means = decision_data(episode)
        k = len(names)
        arms_seen.add(k)
        counts, sums = [0] * k, [0.0] * k
        history: list[int] = []
        regret, regret_curve, coverage_curve = 0.0, [], []
        for step, means in zip(episode.steps, step_means, strict=True):
            arm = int(step.action)
            if history:
                judged += 1
                greedy_set = empirical_best_arms(counts, sums)
                greedy += arm in greedy_set
                context = history[-window:] if window else history
                frequent, top = most_frequent_arms(context)
                if top:
                    cell = bins[_bin_of(top)]
                    cell["cases"] += 1
                    cell["repeats"] += arm in frequent
                    cell["chance"] += len(frequent) / k
            text = step.generation.completion_text if step.generation is not None else ""
            if has_rationale(text):
                kd["steps_with_rationale"] += 1
                _knowing_doing(kd, step.valid, text, names, arm, counts, sums, c)
            counts[arm] += 1
            sums[arm] += float(step.env_reward)
            history.append(arm)
            regret += max(means) - means[arm]
            regret_curve.append(regret)
            coverage_curve.append(sum(n > 0 for n in counts) / k)
        regret_curves.append(regret_curve)
        coverage_curves.append(coverage_curve)

    out: dict[str, Any] = {
        "episodes": len(usable),
        "steps": sum(e.length for e in usable),
        "arms": arms_seen.pop() if len(arms_seen) == 1 else sorted(arms_seen),
        "ucb_c": c,
        "frequency_window": window,
        "curves": _curves(regret_curves, coverage_curves),
        "final_regret": dict(
            zip(("mean", "stderr"), _mean_stderr([r[-1] for r in regret_curves]), strict=True)
        ),
        "final_coverage": dict(
            zip(("mean", "stderr"), _mean_stderr([v[-1] for v in coverage_curves]), strict=True)
        ),
        "greediness": {"cases": judged, "greedy": greedy, "share": _share(greedy, judged)},
        "frequency_bias": _frequency_table(bins),
    }
    if kd["steps_with_rationale"]:
        out["knowing_doing"] = _knowing_doing_rates(kd)
    return out


def _knowing_doing(
    kd: dict[str, Any],
    valid: bool,
    text: str,
    names: list[str],
    arm: int,
    counts: list[int],
    sums: list[float],
    c: float,
) -> None:
    """Tally one step with a rationale into `kd` (see the module doc for what is judged)."""
    if not valid:
        kd["skipped_invalid"] += 1
        return
    ucb_set = ucb_optimal_arms(counts, sums, c)
    if len(ucb_set) == len(counts):  # every arm is UCB-optimal: naming any is no knowledge
        return
    kd["judged"] += 1
    named, rule = parse_rationale(text, names)
    named_arm = names.index(named) if named is not None else None
    if named is not None:
        kd["parsed"] += 1
        kd["parsed_by"][rule] += 1
    doing = arm in ucb_set
    if named_arm is not None and named_arm in ucb_set:
        kd["knowing"] += 1
        kd["knowing_doing"] += doing
        kd["knowing_greedy"] += (not doing) and arm in empirical_best_arms(counts, sums)
    else:
        kd["not_knowing"] += 1
        kd["not_knowing_doing"] += doing


def _knowing_doing_rates(kd: dict[str, Any]) -> dict[str, Any]:
    knowing = kd["knowing"]
    return {
        **kd,
        "parse_rate": _share(kd["parsed"], kd["judged"]),
        "knowing_rate": _share(knowing, kd["judged"]),
        "doing_given_knowing": _share(kd["knowing_doing"], knowing),
        "greedy_given_knowing": _share(kd["knowing_greedy"], knowing),
        "other_given_knowing": _share(knowing - kd["knowing_doing"] - kd["knowing_greedy"], knowing),
        "doing_given_not_knowing": _share(kd["not_knowing_doing"], kd["not_knowing"]),
    }


def _frequency_table(bins: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for (label, lo, hi), cell in zip(FREQUENCY_BINS, bins, strict=True):
        rows.append(
            {
                "bin": label,
                "min_count": lo,
                "max_count": None if math.isinf(hi) else int(hi),
                "cases": cell["cases"],
                "repeats": cell["repeats"],
                "share": _share(cell["repeats"], cell["cases"]),
                "chance_share": _share(cell["chance"], cell["cases"]) if cell["cases"] else None,
            }
        )
    cases = sum(b["cases"] for b in bins)
    repeats = sum(b["repeats"] for b in bins)
    chance = sum(b["chance"] for b in bins)
    return {
        "cases": cases,
        "repeats": repeats,
        "share": _share(repeats, cases),
        "chance_share": chance / cases if cases else None,
        "bins": rows,
    }


def _curves(regret: list[list[float]], coverage: list[list[float]]) -> dict[str, list[Any]]:
    """Per step t = 1..T, mean and stderr over the episodes that reached step t."""
    horizon = max(len(r) for r in regret)
    out: dict[str, list[Any]] = {k: [] for k in ("step", "episodes", "regret_mean", "regret_stderr")}
    out.update(coverage_mean=[], coverage_stderr=[])
    for t in range(horizon):
        r = [curve[t] for curve in regret if len(curve) > t]
        v = [curve[t] for curve in coverage if len(curve) > t]
        out["step"].append(t + 1)
        out["episodes"].append(len(r))
        for key, values in (("regret", r), ("coverage", v)):
            mean, err = _mean_stderr(values)
            out[f"{key}_mean"].append(round(mean, 6))
            out[f"{key}_stderr"].append(round(err, 6))
    return out


# ---------------------------------------------------------------------------------------------
# tic-tac-toe: optimal moves and the knowing-doing gap
# ---------------------------------------------------------------------------------------------
CELL_NAMES = tuple(str(i) for i in range(1, 10))
#: a rationale that lists the legal moves: "The valid actions are 1, 3, 5", "Legal moves: [2, 4 and 9]"
_LISTING = re.compile(
    r"\b(?:valid|legal|available|possible|empty|open|free|remaining)\s+"
    r"(?:actions?|moves?|cells?|squares?|spaces?|positions?|options?)\s*(?:are|is)?\s*:?\s*[\[(]?\s*"
    r"([1-9](?:(?:\s*,\s*|\s+)(?:(?:and|or)\s+)?[1-9])*)\b",
    re.IGNORECASE,
)


def game_boards(episode: Episode) -> tuple[str, list[list[str]]] | None:
    """(the agent's mark, the board before each step) of a tic-tac-toe episode, else None: its final info
    has `step_boards` (one 9-cell board per step, envs/tictactoe.py) and `state["agent_mark"]`."""
    info = episode.final_info or {}
    state = info.get("state") if isinstance(info.get("state"), dict) else {}
    boards, mark = info.get("step_boards"), state.get("agent_mark")
    if mark not in ("X", "O") or not isinstance(boards, (list, tuple)) or len(boards) != episode.length:
        return None
    if not all(isinstance(b, (list, tuple)) and len(b) == 9 for b in boards):
        return None
    return mark, [list(b) for b in boards]


def listed_moves(text: str) -> set[str] | None:
    """The cells a rationale lists as the legal moves (its last such list), or None when it lists none."""
    found = _LISTING.findall(rationale_text(str(text)))
    return set(re.findall(r"[1-9]", found[-1])) if found else None


def move_from_rationale(text: str, legal: Sequence[str]) -> tuple[str | None, str]:
    """(cell, rule) of the move a rationale says it picks: `parse_rationale`'s cue tiers over the nine
    cells ("I choose 5", "I will play 7", "the best move is 3"), else (`fallback`) the last legal cell
    it names; (None, `none`) when it names none."""
    cell, rule = parse_rationale(text, CELL_NAMES, fallback=False)
    if cell is not None:
        return cell, rule
    named = [n for s in _sentences(rationale_text(str(text))) for _, _, n in _mentions(s, legal)]
    return (named[-1], "fallback") if named else (None, "none")


def tictactoe_diagnostics(episodes: Sequence[Episode]) -> dict[str, Any] | None:
    """The JSON-able move diagnostics of the tic-tac-toe episodes (None when there are none): `steps`,
    `optimal_moves` and `optimal_move_rate` over every agent step, the same over the decisive steps and,
    when any step carries a rationale, `knowing_doing` (see the module doc)."""
    usable = [(e, data) for e in episodes if e.steps and (data := game_boards(e)) is not None]
    if not usable:
        return None
    moves = dict.fromkeys(("steps", "optimal_moves", "decisive_steps", "decisive_optimal_moves"), 0)
    kd: dict[str, Any] = {
        "steps_with_rationale": 0,
        "judged": 0,
        "skipped_invalid": 0,
        "skipped_trivial": 0,
        "lists_moves": 0,
        "reads_board": 0,
        "parsed": 0,
        "parsed_by": {},
        "agree": 0,
        "doing": 0,
        "knowing": 0,
        "knowing_doing": 0,
        "not_knowing": 0,
        "not_knowing_doing": 0,
    }
    for episode, (mark, boards) in usable:
        for step, board in zip(episode.steps, boards, strict=True):
            legal = [CELL_NAMES[i] for i in empty_cells(board)]
            best = {CELL_NAMES[i] for i in perfect_moves(board, mark)}
            move = CELL_NAMES[int(step.action)]
            optimal, decisive = step.valid and move in best, len(best) < len(legal)
            moves["steps"] += 1
            moves["optimal_moves"] += optimal
            moves["decisive_steps"] += decisive
            moves["decisive_optimal_moves"] += optimal and decisive
            text = step.generation.completion_text if step.generation is not None else ""
            if has_rationale(text):
                kd["steps_with_rationale"] += 1
                _judge_move(kd, step.valid, text, legal, best, move)
    out: dict[str, Any] = {
        "episodes": len(usable),
        **moves,
        "optimal_move_rate": _share(moves["optimal_moves"], moves["steps"]),
        "decisive_optimal_move_rate": _share(moves["decisive_optimal_moves"], moves["decisive_steps"]),
    }
    if kd["steps_with_rationale"]:
        out["knowing_doing"] = {
            **kd,
            "reads_board_rate": _share(kd["reads_board"], kd["lists_moves"]),
            "parse_rate": _share(kd["parsed"], kd["judged"]),
            "knowing_rate": _share(kd["knowing"], kd["judged"]),
            "doing_rate": _share(kd["doing"], kd["judged"]),
            "doing_given_knowing": _share(kd["knowing_doing"], kd["knowing"]),
            "doing_given_not_knowing": _share(kd["not_knowing_doing"], kd["not_knowing"]),
            "agreement_rate": _share(kd["agree"], kd["judged"]),
        }
    return out


def _judge_move(
    kd: dict[str, Any], valid: bool, text: str, legal: list[str], best: set[str], move: str
) -> None:
    """Tally one tic-tac-toe step with a rationale into `kd` (see the module doc for what is judged)."""
    if not valid:
        kd["skipped_invalid"] += 1
        return
    if len(best) == len(legal):  # every legal move is optimal: naming any is no knowledge
        kd["skipped_trivial"] += 1
        return
    kd["judged"] += 1
    listed = listed_moves(text)
    if listed is not None:
        kd["lists_moves"] += 1
        kd["reads_board"] += listed == set(legal)
    pick, rule = move_from_rationale(text, legal)
    if pick is not None:
        kd["parsed"] += 1
        kd["parsed_by"][rule] = kd["parsed_by"].get(rule, 0) + 1
    doing = move in best
    kd["agree"] += pick == move
    kd["doing"] += doing
    knowing = "knowing" if pick in best else "not_knowing"
    kd[knowing] += 1
    kd[f"{knowing}_doing"] += doing


def diagnostics_section(episodes: Sequence[Episode], ucb_c: float | None = None) -> dict[str, Any] | None:
    """eval.json's `diagnostics`: `decision_diagnostics` for a bandit-like env, `tictactoe_diagnostics`
    for tic-tac-toe, else None. An error is logged, never raised: the diagnostics must not cost the
    evaluation its eval.json."""
    try:
        found = decision_diagnostics(episodes, ucb_c=ucb_c)
        return found if found is not None else tictactoe_diagnostics(episodes)
    except Exception:  # noqa: BLE001 - see the docstring
        log.exception("decision diagnostics failed; eval.json is written without them")
        return None


__all__ = [
    "CELL_NAMES",
    "DEFAULT_UCB_C",
    "FREQUENCY_BINS",
    "decision_data",
    "decision_diagnostics",
    "diagnostics_section",
    "empirical_best_arms",
    "final_coverage_regret",
    "game_boards",
    "has_rationale",
    "has_decision_data",
    "listed_moves",
    "most_frequent_arms",
    "move_from_rationale",
    "parse_rationale",
    "rationale_text",
    "tictactoe_diagnostics",
    "ucb_arm_from_rationale",
    "ucb_optimal_arms",
]
