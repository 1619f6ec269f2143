"""What `agentrl train|eval --dry-run` prints: the checked config's summary (env, agent, model, algo,
scale, eval, sources, run directory), built from `launch.dry_run`'s Plan without loading a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from agentrl.algos import LLM_ALGORITHMS
from agentrl.config.presets import flatten
from agentrl.runs import checks, launch
from agentrl.runs.launch import LLM_ALGOS, Plan
from agentrl.runs.trained import init_plan_line, plays_trained_model, trained_model


def plan_lines(plan: Plan) -> list[str]:
    """The dry run's summary: env, agent, model, algo and eval with their key numbers, and the run
    directory."""
    from agentrl.evaluation import eval_seeds

    cfg = plan.cfg
    lines = [f"dry run: agentrl {plan.task} (config checked; no model loaded, no run directory created)"]

    def settings(node: Any, skip: tuple[str, ...] = ("name",)) -> str:
        values = flatten(OmegaConf.to_container(node, resolve=True))
        return ", ".join(f"{k}={_shown(v)}" for k, v in values.items() if k not in skip)

    lines.append(f"  env    {cfg.env.name}: {settings(cfg.env)}")
    from agentrl.envs import env_factory

    task = env_factory(cfg.env)().describe()  # what the settings make: the real map and move cap
    if task:
        lines.append(f"  task   {task}")
    uses_llm = (
        cfg.algo.name in LLM_ALGOS
        if plan.task == "train" and cfg.get("algo") is not None
        else cfg.agent.name == "llm"
    )
    if plan.task == "eval" or uses_llm:
        lines.append(f"  agent  {cfg.agent.name}: {settings(cfg.agent)}")
    if uses_llm:
        m = cfg.model
        where = f"{m.base_url} (served name {m.name})" if m.backend == "openai" else m.name_or_path
        lora = f", LoRA r={m.lora.r}" if int(m.lora.r) > 0 else ""
        lines.append(f"  model  {m.name}: {where} (backend {m.backend}, dtype {m.dtype}{lora})")
    if plan.task == "train" and cfg.get("algo") is not None:
        a = cfg.algo
        if a.name in LLM_ALGORITHMS:
            per_iter = int(a.groups_per_iteration) * int(a.group_size)
            aaw = a.get("aaw")
            sampling = (
                "AAW on"
                + (f" (fraction {a.aaw.fraction})" if aaw.get("count") is None else f" ({aaw.count})")
                if aaw is not None and aaw.enabled
                else "uniform sampling (AAW off)"
                if aaw is not None
                else "every episode kept"  # algorithms without episode sampling (POAD, RLFT)
            )
            lines.append(
                f"  algo   {a.name}: {a.iterations} iterations x {a.groups_per_iteration} groups x "
                f"{a.group_size} episodes = {per_iter} episodes per iteration; lr {a.learning_rate}, "
                f"beta {a.beta}, clip {a.epsilon}, temperature {a.temperature}, top_k {a.top_k}, "
                f"eval temperature {a.eval_temperature}, {sampling}"
                + (f"; time limit {a.time_limit_minutes} min" if a.get("time_limit_minutes") else "")
            )
        else:
            lines.append(f"  algo   {a.name}: {settings(a)}")
    if uses_llm:
        lines.append(f"  scale  {_scale(plan)}")
    seeds = eval_seeds(cfg)
    lines.append(
        f"  eval   {cfg.eval.episodes} episodes on held-out seeds {seeds[0]}..{seeds[-1]}; seed {cfg.seed}"
    )
    lines += init_plan_line(cfg)
    if cfg.get("from_run") is not None:
        trained = trained_model(cfg.from_run)
        on = OmegaConf.select(trained.run.config, "env.name")
        played = "" if plays_trained_model(cfg, trained) else " (settings only: another model plays)"
        lines.append(
            f"  from_run  {trained.run.root} ({trained.checkpoint}; trained {trained.run.algo} on {on}): "
            f"{trained.path}{played}"
        )
    if plan.resume:
        state = "complete: nothing to do" if plan.nothing_to_do else "would continue in place"
        lines.append(f"  run dir  {plan.run_dir} ({state})")
    else:
        where = plan.run_dir if plan.run_dir is not None else "chosen by Hydra at launch"
        lines.append(f"  run dir  {where} (a new directory; its random id is drawn again at launch)")
    return lines


def _scale(plan: Plan) -> str:
    """The dry run's scale line: engine, processes, precision and a rough memory figure per process."""
    cfg = plan.cfg
    if str(cfg.model.get("backend")) == "openai":
        return f"the model runs behind {cfg.model.base_url}: no weights load on this machine"
    cuda = checks.cuda_available()  # through the module: tests stand in for CUDA there
    device = "cuda" if cuda else "cpu"
    params = model_parameters(cfg.model)
    dtype = str(cfg.model.dtype)
    weight_bytes = 2 if (dtype == "auto" and cuda) or dtype in ("bfloat16", "bf16", "float16", "fp16") else 4
    if plan.task != "train":
        what, per_param, processes, engine = "weights", weight_bytes, 1, "1 process"
    else:
        name = str(OmegaConf.select(cfg, "distributed.name", default="none"))
        processes = launch._processes(cfg)
        precision = str(cfg.algo.get("precision", "auto"))
        shown = _shown_precision(precision, cuda, processes, cfg.model)
        engine = f"distributed={name}, {processes} process{'es' if processes > 1 else ''}, precision {shown}"
        if int(cfg.model.lora.r) > 0:  # frozen base weights; adapters and their optimizer are small
            what, per_param = "frozen weights (LoRA)", weight_bytes
        else:  # fp32 master weights, gradients and Adam's two moments
            what, per_param = "weights, gradients, Adam state", 16 if precision != "bf16-pure" else 8
        if name not in ("zero3", "fsdp2"):
            processes = 1  # every process holds it all (zero2 shards only part of it)
    if params is None:
        memory = "memory: unknown (the model's config.json is not on this machine)"
    else:
        gib = params * per_param / processes / 2**30
        size = f"{params / 1e9:.3g}B" if params >= 1e9 else f"{params / 1e6:.3g}M"
        memory = f"~{size} parameters: ~{gib:.3g} GiB per process for {what} (activations extra)"
    return f"{engine} on {device}; {memory}"


def _shown_precision(precision: str, cuda: bool, processes: int, model_cfg: Any) -> str:
    """What `algo.precision` will be, as far as a dry run can tell without timing anything: on a CPU, `auto`
    is decided at launch by timing bf16 against fp32 (agentrl/kernels/precision.py), so the line says
    what that choice depends on."""
    if precision != "auto":
        return precision
    if cuda:
        return "auto = bf16-mixed"
    from agentrl.kernels.precision import (
        MIN_SPEEDUP,
        cpu_flags,
        fp32_without_timing,
        usable_bf16_instructions,
    )
    from agentrl.models import model_shapes

    flags = cpu_flags()
    untimed = fp32_without_timing(flags, model_shapes(model_cfg))
    if untimed is None and processes > 1:
        untimed = "several processes"
    if untimed:
        return f"auto = fp32 ({untimed})"
    found = [f for f in usable_bf16_instructions(flags) if f != "amx_tile"]
    return (
        f"auto: bf16-mixed if bf16 autocast times >= {MIN_SPEEDUP}x fp32 at launch "
        f"({', '.join(found)}), else fp32"
    )


#: parameters of the models agentrl builds itself (tests/test_models.py checks them against the models)
BUILTIN_PARAMETERS = {"smollm2-135m": 134_515_008, "tiny-random": 3_219_776}


def model_parameters(model_cfg: Any) -> int | None:
    """A rough parameter count of a decoder-only model: the models agentrl builds from their known counts,
    others from their config.json (local directory, cached hub snapshot); None when no config.json is at
    hand (nothing is downloaded)."""
    import json

    from agentrl.models import BUILTIN_PREFIX, _cached_snapshot, looks_local

    name = str(model_cfg.get("name_or_path") or "")
    if name.startswith(BUILTIN_PREFIX):  # built here from a fixed shape: known before it is built
        return BUILTIN_PARAMETERS.get(name.removeprefix(BUILTIN_PREFIX))
    if str(model_cfg.get("backend")) == "openai":
        return None
    path = Path(name).expanduser()
    folder = str(path) if path.is_dir() else None if looks_local(name) else _cached_snapshot(name)
    try:
        c = json.loads((Path(folder) / "config.json").read_text()) if folder else None
    except (OSError, ValueError):
        return None
    c = c.get("text_config", c) if isinstance(c, dict) else None
    try:
        h, layers, inner, vocab = (
            int(c[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
        )
        heads = int(c["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    head_dim = int(c.get("head_dim") or h // heads)
    kv = int(c.get("num_key_value_heads") or heads)
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim  # q, o; k, v
    embeddings = vocab * h * (1 if c.get("tie_word_embeddings", True) else 2)
    return layers * (attention + 3 * h * inner) + embeddings  # a gated MLP: gate, up, down


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value) if value == "" or " " in value else value
    return str(value)
