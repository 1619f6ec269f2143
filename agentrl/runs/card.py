"""Model cards: a Hugging Face Hub README.md in a trained run's final/ and in each checkpoint holding
weights, and `agentrl push RUN REPO_ID`, which uploads final/ with its card.

The card is written from the run directory alone (.hydra/, eval.json, eval_before.json, metrics.jsonl,
transcripts.jsonl), so it can be written again at any time (`write_cards`); the runner writes it when a
training run ends. It holds the Hub's metadata (base_model, license, library_name, tags, pipeline_tag),
then what a reader needs to trust and reuse the model: the base model and its license, the algorithm, the
env and its variant, the evaluation before and after training on held-out seeds with the invalid and
untagged rates beside the success rate, the training time and machine, the exact command and the whole
config, and how to play the model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agentrl.errors import AgentRLError, RunDirError
from agentrl.runs.rundir import load_train_run
from agentrl.runs.runlog import (
    atomic_file,
    checkpoint_problem,
    file_fingerprint,
    list_checkpoints,
    manifest_path,
    write_json,
)

log = logging.getLogger(__name__)

CARD = "README.md"
ALGORITHMS = {
    "msgrpo": "MS-GRPO (multi-step GRPO)",
    "poad": "POAD (policy optimization with action decomposition)",
    "ntpo": "NTPO (naive token-level policy optimization)",
    "twosome": "TWOSOME (action-level PPO over the valid actions)",
    "rlft": "RLFT (RL fine-tuning on chain-of-thought answers)",
    "sft": "SFT (supervised fine-tuning on demonstrations)",
    "dqn": "DQN (Stable-Baselines3)",
}
#: the hub ids of the builtin models (agentrl/models.py), and what the others are
BUILTIN_BASES = {"builtin:smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
BUILTIN_NAMES = {
    "builtin:tiny-random": "agentrl's tiny random test model (random weights, SmolLM2's tokenizer)"
}
#: the licenses of the models the presets name (their Hub cards), for machines that cannot read the Hub
KNOWN_LICENSES: dict[str, dict[str, str]] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": {"license": "apache-2.0"},
    "builtin:tiny-random": {"license": "apache-2.0"},  # its only pretrained part is SmolLM2's tokenizer
    "Qwen/Qwen2.5-0.5B-Instruct": {"license": "apache-2.0"},
    "Qwen/Qwen2.5-7B-Instruct": {"license": "apache-2.0"},
    "Qwen/Qwen2.5-3B-Instruct": {
        "license": "other",
        "license_name": "qwen-research",
        "license_link": "https://huggingface.co/Qwen/Qwen2.5-3B-Instruct/blob/main/LICENSE",
    },
    "Qwen/Qwen2.5-72B-Instruct": {
        "license": "other",
        "license_name": "qwen",
        "license_link": "https://huggingface.co/Qwen/Qwen2.5-72B-Instruct/blob/main/LICENSE",
    },
}
WEIGHT_FILES = ("*.safetensors", "*.bin", "model.zip")
#: the eval metrics a card's table shows, in order
EVAL_COLUMNS = (
    ("success_rate", "success"),
    ("mean_return", "mean return"),
    ("invalid_rate", "invalid"),
    ("untagged_rate", "untagged"),
    ("episodes", "episodes"),
)
PROMPT_CHARS = 3000


def holds_weights(path: Path) -> bool:
    return path.is_dir() and any(any(path.glob(pattern)) for pattern in WEIGHT_FILES)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def base_model(cfg: Any) -> str | None:
    """The base model's hub id (None for a local directory or the random test model)."""
    source = str(OmegaConf.select(cfg, "model.name_or_path", default=None) or "")
    if source in BUILTIN_BASES:
        return BUILTIN_BASES[source]
    if source.startswith("builtin:") or not source or Path(source).expanduser().exists():
        return None
    return source if source.count("/") == 1 else None


def license_of(base: str | None, cfg: Any) -> dict[str, str]:
    """The base model's license metadata: the presets' known licenses, else the license a local model's
    own README.md declares, else unknown."""
    source = str(OmegaConf.select(cfg, "model.name_or_path", default="") or "")
    if (base or source) in KNOWN_LICENSES:
        return dict(KNOWN_LICENSES[base or source])
    readme = Path(source).expanduser() / CARD
    if readme.is_file():
        with contextlib.suppress(Exception):
            from huggingface_hub import ModelCard

            data = ModelCard.load(readme).data.to_dict()
            if data.get("license"):
                return {k: str(data[k]) for k in ("license", "license_name", "license_link") if data.get(k)}
    return {"license": "unknown"}


def machine() -> str:
    """This machine in a line: CPU model and cores, memory, and the GPUs this process sees."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    parts = [f"{cpu} ({os.cpu_count()} cores)"]
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        parts.append(f"{kib / 2**20:.0f} GiB memory")
    torch = sys.modules.get("torch")  # a training process has it; a bare `agentrl push` need not load it
    if torch is not None and torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        parts.append(f"{len(names)} x {names[0]}")
    else:
        parts.append("no GPU")
    return ", ".join(parts)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def eval_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    lines = [
        "| | " + " | ".join(label for _, label in EVAL_COLUMNS) + " |",
        "|---|" + "---:|" * len(EVAL_COLUMNS),
    ]
    for name, metrics in rows:
        cells = []
        for key, _ in EVAL_COLUMNS:
            value = metrics.get(key)
            if key == "mean_return" and metrics.get("return_stderr") is not None:
                cells.append(f"{_fmt(value)} ± {_fmt(metrics['return_stderr'])}")
            else:
                cells.append(_fmt(value))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def periodic_eval(run_dir: Path, iteration: int) -> dict[str, Any]:
    """The last periodic evaluation at or before `iteration` (metrics.jsonl's eval/* keys), with its
    iteration; {} when there is none."""
    found: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if int(row.get("iteration", 0)) <= iteration and "eval/success_rate" in row:
                    found = {k[5:]: v for k, v in row.items() if k.startswith("eval/")}
                    found["iteration"] = int(row["iteration"])
    return found


def first_prompt(run_dir: Path) -> tuple[str, str] | None:
    """(prompt, completion) of the first step of transcripts.jsonl: the format the model was trained in."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with (run_dir / "transcripts.jsonl").open(encoding="utf-8") as lines:
            first = json.loads(next(lines))
        if isinstance(first.get("prompt"), str):
            return first["prompt"][-PROMPT_CHARS:], str(first.get("completion", ""))
    return None


def card_text(run_dir: Path, target: Path, machine_line: str | None = None) -> str:
    """The model card of `target` (final/ or a checkpoint-N/ inside the training run `run_dir`).
    `machine_line`: the machine the run trained on (None: the one of status.json's host, as far as is
    known after the fact)."""
    run = load_train_run(run_dir, "cannot write a model card for")
    cfg, algo = run.config, str(run.algo)
    results = _read_json(run.root / "eval.json")
    env = OmegaConf.to_container(cfg.env, resolve=True)
    assert isinstance(env, dict)
    variant = ", ".join(f"{k}={v}" for k, v in env.items() if k != "name")
    env_line = f"`env={env['name']}`" + (f" ({variant})" if variant else "")
    if machine_line is None:
        host = _read_json(run.root / "status.json").get("host")
        machine_line = f"not recorded (this card was written after training; host {host or 'unknown'})"
    lines = [*_header(run, cfg, algo, target, env_line), *_evaluation(run, cfg, results, target)]
    lines += _training(run, cfg, results, target, machine_line)
    lines += _usage(run, algo)
    config = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
    lines += ["## Config", "", "```yaml", config.rstrip(), "```", ""]
    return "\n".join(lines)


def _header(run: Any, cfg: Any, algo: str, target: Path, env_line: str) -> list[str]:
    """The Hub metadata, the title and what the model is."""
    from huggingface_hub import ModelCardData

    base = base_model(cfg)
    license_meta = license_of(base, cfg)
    dqn = algo == "dqn"
    adapter = (target / "adapter_config.json").is_file()
    source = str(OmegaConf.select(cfg, "model.name_or_path", default="") or "")
    source = base or BUILTIN_NAMES.get(source, source)
    # a DQN policy is trained from scratch on the env's numeric view: no base model, nor its license
    data = ModelCardData(
        base_model=None if dqn else base,
        library_name="stable-baselines3" if dqn else "peft" if adapter else "transformers",
        tags=["agentrl", "stable-baselines3" if dqn else "trl", "reinforcement-learning", algo]
        + [str(cfg.env.name), "text-game"],
        pipeline_tag=None if dqn else "text-generation",
        **({} if dqn else license_meta),
    )
    title = run.root.name + (f" ({target.name})" if target.name != "final" else "")
    method = ALGORITHMS.get(algo, algo)
    lines = ["---", data.to_yaml(), "---", "", f"# {title}", ""]
    lines += [f"{'A DQN policy' if dqn else source} trained with {method} by agentrl on {env_line}.", ""]
    lines += ["## Model", ""]
    if not dqn:
        lines.append(f"- base model: {source}" + (" (a LoRA adapter on it)" if adapter else ""))
        license_line = license_meta.get("license_name") or license_meta["license"]
        if license_meta["license"] == "unknown":
            license_line = "unknown here: read the base model's own card before sharing this model"
        lines.append(f"- base model license: {license_line} (this model is a derivative of it)")
    lines += [f"- algorithm: {method} (`algo={algo}`)", f"- environment: {env_line}"]
    if cfg.get("init_from"):
        lines.append(f"- started from the weights of the run {cfg.init_from}")
    return lines


def _evaluation(run: Any, cfg: Any, results: dict[str, Any], target: Path) -> list[str]:
    """Before and after training (a checkpoint: before, and its last periodic evaluation)."""
    lines = ["", "## Evaluation", ""]
    lines.append(
        f"Held-out episodes (seeds {cfg.eval.seed_offset} + 1000 x seed + k, seed={cfg.seed}); training "
        f"plays seeds below {cfg.eval.seed_offset}. An answer counts only in the asked format (strict "
        "parsing): invalid is the share of answers that named no valid action, untagged the share that "
        "named one outside the format."
    )
    lines.append("")
    rows: list[tuple[str, dict[str, Any]]] = []
    before = results.get("before") or _read_json(run.root / "eval_before.json")
    if before:
        rows.append(("before training", before))
    step = _checkpoint_step(target)
    if step is not None:
        periodic = periodic_eval(run.root, step)
        if periodic:
            rows.append((f"periodic eval at iteration {periodic.pop('iteration')}", periodic))
    elif results:
        rows.append(("after training", results))
    lines += eval_table(rows) if rows else ["No evaluation was written."]
    if step is not None:
        lines += ["", f"This is checkpoint {target.name} of the run; final/ holds the trained model."]
    return lines


def _training(run: Any, cfg: Any, results: dict[str, Any], target: Path, machine_line: str) -> list[str]:
    """How long, where and how the run trained."""
    from agentrl.report.learning import command

    lines = ["", "## Training", ""]
    step = _checkpoint_step(target)
    if run.algo == "dqn":
        steps = results.get("total_timesteps") or OmegaConf.select(cfg, "algo.total_timesteps", default=None)
        lines.append(f"- {steps} environment steps")
    else:
        iterations = results.get("iterations") or OmegaConf.select(cfg, "algo.iterations", default=None)
        lines.append(f"- {'' if step is None else f'iteration {step} of '}{iterations} iterations")
    if results.get("train_time_s") is not None:
        seconds = float(results["train_time_s"])
        took = f"{seconds / 60:.1f} minutes" if seconds >= 60 else f"{seconds:.0f} s"
        lines.append(f"- training time: {took}")
    lines += [f"- machine: {machine_line}", "- command:", "", "```bash", command(run.root), "```", ""]
    return lines


def _usage(run: Any, algo: str) -> list[str]:
    """The answer format the model was trained in, and how to evaluate or load it."""
    lines: list[str] = []
    prompt = first_prompt(run.root)
    if prompt is not None:
        lines += ["## Prompt format", "", "The first prompt of the evaluation, and the model's answer:", ""]
        lines += ["```text", prompt[0], "```", "", "```text", prompt[1], "```", ""]
    lines += ["## Use", "", "```bash", f"agentrl eval from_run={run.root}", "```", ""]
    if algo != "dqn":
        lines += [
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            'model = AutoModelForCausalLM.from_pretrained("<this repository>")',
            'tokenizer = AutoTokenizer.from_pretrained("<this repository>")',
            "```",
            "",
        ]
    return lines


def _checkpoint_step(path: Path) -> int | None:
    name = path.name
    return int(name.split("-", 1)[1]) if name.startswith("checkpoint-") and name[11:].isdigit() else None


def write_card(run_dir: Path, target: Path, machine_line: str | None = None) -> Path:
    """Write `target`/README.md (atomically) and return its path."""
    path = Path(target) / CARD
    with atomic_file(path) as tmp:
        tmp.write_text(card_text(Path(run_dir), Path(target), machine_line), encoding="utf-8")
    return path


def write_checkpoint_card(run_dir: Path, checkpoint: Path, machine_line: str | None = None) -> Path | None:
    """A checkpoint's card, in place of the one TRL writes into every checkpoint, and its manifest entry
    to match (the other entries stay as they were: the manifest still vouches only for what was checked
    when it was written). A checkpoint that fails its manifest check is left alone."""
    problem = checkpoint_problem(checkpoint)
    if problem is not None:
        log.warning("no model card for %s: %s", checkpoint.name, problem)
        return None
    path = write_card(run_dir, checkpoint, machine_line)
    manifest = manifest_path(checkpoint)
    if manifest.is_file():
        data = json.loads(manifest.read_text(encoding="utf-8"))
        data["files"][CARD] = {"size": path.stat().st_size, "fingerprint": file_fingerprint(path)}
        write_json(manifest, data)
    return path


def write_cards(run_dir: Path) -> list[Path]:
    """The cards of final/ and of every checkpoint-N/ directory holding weights, written by the run on
    the machine it trained on."""
    run_dir = Path(run_dir)
    here = machine()
    written = [
        write_checkpoint_card(run_dir, path, here)
        for _, path in list_checkpoints(run_dir)
        if path.is_dir() and holds_weights(path)
    ]
    if holds_weights(run_dir / "final"):
        written.append(write_card(run_dir, run_dir / "final", here))
    return [path for path in written if path is not None]


class PushError(AgentRLError):
    """An upload to the Hub failed (no token, no network, no permission)."""


def push(run_dir: Path, repo_id: str, private: bool = False, api: Any = None) -> str:
    """Upload a training run's final/ (weights, tokenizer, its model card) to the Hub repo `repo_id`,
    created if needed; returns the repository's URL. A final/ without a card (a run trained before
    cards, or one whose card was removed) gets one first."""
    run = load_train_run(Path(run_dir), "cannot push")
    final = run.root / "final"
    if not holds_weights(final):
        raise RunDirError(
            f"cannot push {run.root}: it has no final/ model (algo.save_final=false, or training did not end)"
        )
    if not (final / CARD).is_file():
        write_card(run.root, final)
    try:
        if api is None:
            from huggingface_hub import HfApi

            api = HfApi()
        url = api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(
            folder_path=str(final),
            repo_id=repo_id,
            repo_type="model",
            commit_message=f"agentrl: {run.root.name} ({run.algo} on {run.config.env.name})",
        )
    except Exception as exc:  # noqa: BLE001 - the hub's errors (token, network, permission) in one line
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise PushError(f"push to {repo_id} failed: {message}") from exc
    return str(url)
