"""Keep a run's results without its weights, so `agentrl report` can rebuild a table from the repository.

    keep_run(out / "msgrpo", RESULTS / "learning" / "frozenlake_maps_msgrpo")

copies what the report reads (`.hydra/`, status.json, eval.json, eval_before.json, metrics.jsonl,
demonstrations.json and the first transcript line, which names the prefill a run chose at launch) and
nothing else: no checkpoints, no final/ model, no episodes. `agentrl report benchmarks/results/learning
--table learning` then gives the learning table of docs/results.md from the kept runs, each row with the
command that made it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
LEARNING = RESULTS / "learning"
KEPT_FILES = ("status.json", "eval.json", "eval_before.json", "metrics.jsonl", "demonstrations.json")


def keep_run(run: Path, dest: Path) -> Path:
    """Copy `run`'s results (KEPT_FILES, `.hydra/*.yaml`, the first transcript line) into `dest`, replacing
    what was there. Raises FileNotFoundError when `run` has no eval.json (not a finished run)."""
    run, dest = Path(run), Path(dest)
    if not (run / "eval.json").is_file():
        raise FileNotFoundError(f"{run}: no eval.json (not a finished run)")
    if dest.exists():
        shutil.rmtree(dest)
    (dest / ".hydra").mkdir(parents=True)
    for config in (run / ".hydra").glob("*.yaml"):
        shutil.copy2(config, dest / ".hydra" / config.name)
    for name in KEPT_FILES:
        if (run / name).is_file():
            shutil.copy2(run / name, dest / name)
    transcripts = run / "transcripts.jsonl"
    if transcripts.is_file():
        with transcripts.open(encoding="utf-8") as fh:
            (dest / "transcripts.jsonl").write_text(fh.readline())
    return dest
