"""algo=sft (TRL's SFTTrainer on demonstrations written through the LLM agent's interface) and init_from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agentrl.agents.llm import TextInterface, demonstration_answer
from agentrl.cli import app
from agentrl.config import compose_config
from agentrl.envs import env_factory
from agentrl.errors import ConfigError
from agentrl.evaluation import eval_seeds
from agentrl.trainers.sft import demonstration_seeds, demonstrations

torch.set_num_threads(1)

MOVES = ["left", "down", "right", "up"]
TINY_SFT = [
    "algo=sft",
    "model=tiny-random",
    "agent.prefill=''",
    "agent.sampling.max_new_tokens=6",
    "algo.episodes=1",  # the planner's 6 moves on a random 4x4 map
    "algo.batch_size=3",
    "algo.epochs=1",  # 2 updates
    "algo.learning_rate=1e-3",
    "eval.episodes=1",
]


@pytest.mark.parametrize(
    ("interface", "completion"),
    [
        (TextInterface(), "<action>right</action>"),
        (TextInterface(prefill="<action>"), "right</action>"),
        (TextInterface(prefill="Move:"), " right"),  # the one-token answer after the prefill
        (TextInterface(prefill="I move "), "right"),
        (TextInterface(answer_tag="answer"), "<answer>right</answer>"),
        (
            TextInterface(cot=True),
            "<think>The valid actions are left, down, right, up. I choose right.</think>\n<action>right</action>",
        ),
    ],
)
def test_demonstration_text_parses_strictly_to_the_demonstrated_action(interface, completion):
    answer = demonstration_answer(interface, "right", MOVES)
    assert answer == completion
    # the agent parses prefill + completion (LLMAgent.act), strictly and as the asked format
    assert not interface.lenient
    assert interface.parse_answer(interface.prefill + answer, MOVES) == ("right", False)


def test_demonstrations_use_training_seeds_only():
    cfg = compose_config(["task=train", "algo=sft", "eval.episodes=200", "seed=3"])
    seeds = demonstration_seeds(cfg, 500)
    assert len(set(seeds)) == 500
    assert max(seeds) < cfg.eval.seed_offset
    assert not set(seeds) & set(eval_seeds(cfg))


@pytest.mark.parametrize("teacher", ["planner", "random", "scored"])
def test_demonstrations_play_the_env_through_the_agents_prompt_and_parser(tiny, teacher):
    from agentrl.agents.llm import build_llm_agent

    model, tokenizer = tiny
    cfg = compose_config(
        ["task=train", "model=tiny-random", *TINY_SFT, f"algo.demonstrations={teacher}", "algo.episodes=3"]
    )
    agent = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    episodes = demonstrations(cfg, env_factory, agent.interface, tokenizer, agent)
    assert [e.seed for e in episodes] == demonstration_seeds(cfg, 3)
    for episode in episodes:
        for step in episode.steps:
            generation = step.generation
            # the prompt is the one the LLM agent renders; the answer parses to the executed action
            assert generation.prompt_ids == agent.prompt_ids([generation.prompt_text])[0]
            assert agent.interface.parse_answer(generation.completion_text, MOVES) == (
                step.action_name,
                False,
            )
            assert generation.completion_ids[-1] == tokenizer.eos_token_id  # the closed answer ends the turn
    if teacher == "planner":
        assert all(e.success for e in episodes)


def test_scored_demonstrations_are_the_models_own_scored_choices(tiny):
    """algo.demonstrations=scored: the actions are those the model's TWOSOME policy samples on the same
    seeds (its scores, temperature 1), and each is written as the generated answer the parser reads."""
    from agentrl.agents.llm import build_llm_agent
    from agentrl.envs import env_factory
    from agentrl.rollout import rollout
    from agentrl.trainers.sft import teacher

    model, tokenizer = tiny
    cfg = compose_config(["task=train", *TINY_SFT, "algo.demonstrations=scored", "algo.episodes=3"])
    agent = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    episodes = demonstrations(cfg, env_factory, agent.interface, tokenizer, agent)
    scorer = teacher(cfg, agent)
    assert scorer.decision == "score" and scorer.sampling.temperature == 1.0
    seeds = demonstration_seeds(cfg, 3)
    own = rollout(env_factory(cfg.env), scorer, seeds, list(range(3)), agent_seed=int(cfg.seed))
    assert [[s.action_name for s in e.steps] for e in episodes] == [
        [s.action_name for s in e.steps] for e in own
    ]
    assert len({s.action_name for e in episodes for s in e.steps}) > 1  # sampled, not one fixed answer
    with pytest.raises(ConfigError, match="needs the model being trained"):
        demonstrations(cfg, env_factory, agent.interface, tokenizer)


def test_state_facts_put_the_untried_buttons_in_the_rationale_before_the_choice(tiny):
    """algo.state_facts: each bandit demonstration's rationale names the buttons not pressed yet (and the
    best average once one was pressed), then the choice; the answer still parses to the pressed button."""
    from agentrl.agents.llm import build_llm_agent

    model, tokenizer = tiny
    overrides = ["task=train", "model=tiny-random", "algo=sft", "env=bandit", "env.arms=3", "env.horizon=4"]
    overrides += ["agent.cot=true", "agent.prefill=''", "algo.demonstrations=planner", "algo.episodes=1"]
    cfg = compose_config([*overrides, "algo.state_facts=true"])
    agent = build_llm_agent(cfg, model=model, tokenizer=tokenizer)
    (episode,) = demonstrations(cfg, env_factory, agent.interface, tokenizer)
    texts = [s.generation.completion_text for s in episode.steps]
    names = [s.action_name for s in episode.steps]
    # UCB1 presses each of the 3 buttons once first: the untried list shrinks as it goes
    assert len(set(names[:3])) == 3
    untried = texts[0].split("Not pressed yet: ")[1].split(".")[0]
    assert sorted(untried.split(", ")) == sorted(names[:3]) and "Best average" not in texts[0]
    assert f"Not pressed yet: {names[2]}. Best average so far:" in texts[2]
    assert "Every button has been pressed. Best average so far:" in texts[3]
    for text, name in zip(texts, names, strict=True):
        assert text.index("Not pressed" if "Not" in text else "Every") < text.index(f"I choose {name}.")
        assert agent.interface.parse_answer(text, sorted(set(names))) == (name, False)
    plain = demonstrations(compose_config(overrides), env_factory, agent.interface, tokenizer)[0]
    assert all("pressed" not in s.generation.completion_text for s in plain.steps)  # the default template


def test_bandit_facts_name_the_untried_buttons_and_the_best_average():
    from agentrl.envs.bandit import BanditEnv

    env = BanditEnv(arms=3, horizon=5)
    env.reset(seed=0)
    a, b, c = env.action_names
    assert env.facts() == f"Not pressed yet: {a}, {b}, {c}."
    env.counts, env.sums = [2, 0, 1], [0.0, 0.0, 1.0]
    assert env.facts() == f"Not pressed yet: {b}. Best average so far: {c}."
    env.counts, env.sums = [2, 1, 1], [2.0, 0.0, 1.0]
    assert env.facts() == f"Every button has been pressed. Best average so far: {a}."


@pytest.fixture(scope="module")
def tiny():
    from agentrl.models import load_model

    return load_model({"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu")


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    """One tiny SFT run through the CLI (shared by the tests below: it takes a while on a busy CPU)."""
    run = tmp_path_factory.mktemp("sft") / "run"
    result = CliRunner().invoke(app, ["train", *TINY_SFT, f"hydra.run.dir={run}"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return run


def test_sft_writes_a_training_run_moves_the_weights_and_lowers_the_answer_loss(sft_run, tiny):
    base, _ = tiny
    saved = json.loads((sft_run / "eval.json").read_text())
    assert saved["algo"] == "sft" and saved["model"] == "tiny-random"
    assert {"success_rate", "invalid_rate", "untagged_rate", "before", "train_time_s"} <= set(saved)
    # the start and the trained model on the same held-out seeds, episode by episode (report's paired gain)
    assert saved["start"] == {"label": "base model"}
    for evaluated in (saved, saved["before"]):
        per = evaluated["per_episode"]
        assert per["seed"] == [1000000] and per["success"] == [int(evaluated["success_rate"])]
        assert per["return"] == [evaluated["mean_return"]]
    demo = saved["demonstrations"]
    assert demo["demonstrations"] == "planner" and demo["steps"] == 6 and demo["success_rate"] == 1.0
    assert demo["answer_nll_after"] < demo["answer_nll_before"]
    rows = [json.loads(line) for line in (sft_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2] and all("loss" in r for r in rows)
    trained = _weights(sft_run / "final")
    initial = {k: v for k, v in base.state_dict().items()}
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(trained[name], initial[name])


def test_init_from_loads_the_runs_weights_and_is_shown_by_dry_run(sft_run):
    from agentrl.models import load_model
    from agentrl.runs.trained import with_init_weights

    overrides = ["task=train", "algo=msgrpo", "model=tiny-random", f"init_from={sft_run}"]
    cfg = compose_config(overrides)
    assert cfg.init_from == str(sft_run)
    # the weights as saved: fp32 on the CPU (model.dtype=auto rounds them to bf16 on a GPU)
    model, _ = load_model(with_init_weights(cfg).model, device="cpu")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.state_dict()[name], _weights(sft_run / "final")[name])
    result = CliRunner().invoke(app, ["train", *overrides[1:], "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"init_from {sft_run} (final; trained sft)" in " ".join(result.output.split())


def test_a_run_names_what_it_starts_from(sft_run):
    from agentrl.runs.trained import start_description

    cfg = compose_config(["task=train", "algo=msgrpo", "model=tiny-random", f"init_from={sft_run}"])
    assert start_description(cfg) == {
        "label": "planner BC",
        "run": str(sft_run.resolve()),
        "checkpoint": "final",
        "algo": "sft",
    }
    assert start_description(compose_config(["task=train", "algo=msgrpo"])) == {"label": "base model"}
    assert start_description(compose_config(["task=train", "algo=dqn"])) == {"label": "untrained network"}


def test_init_from_another_model_is_refused_in_one_line(sft_run, tmp_path):
    run = tmp_path / "refused"
    args = ["train", "algo=msgrpo", "model=smollm2-135m", f"init_from={sft_run}", f"hydra.run.dir={run}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "cannot init_from" in result.output and "tiny-random" in result.output
    assert len([line for line in result.output.strip().splitlines() if "init_from" in line]) == 1
    assert not run.exists()


def test_split_rows_lays_out_left_padded_prompts_and_right_padded_answers():
    from agentrl.trainers.sft import split_rows

    ids = torch.tensor([[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    labels = torch.tensor([[-100, -100, -100, 8, 9], [-100, 2, 3, -100, -100]])
    batch, answers = split_rows(ids, mask, labels)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9], [0, 0, 1, 2, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert answers.tolist() == [[1, 1], [1, 1]]
    # a row whose answer is not at its end cannot be laid out so
    with pytest.raises(ValueError, match="end the row"):
        split_rows(ids[:1], mask[:1], torch.tensor([[-100, 6, -100, -100, -100]]))


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_shared_prefix_sft_loss_and_gradients_equal_trls(tmp_path, monkeypatch, autocast):
    """The CPU path (the batch's common prompt prefix once, the LM head on the answers only) gives TRL's
    SFT loss and the same gradients on a batch of rows of different lengths sharing their instructions;
    under bf16 autocast (algo.precision=bf16-mixed) to bf16's precision."""
    import contextlib
    from types import SimpleNamespace

    from datasets import Dataset
    from trl import SFTTrainer

    from agentrl.models import load_model
    from agentrl.trainers import logps
    from agentrl.trainers.sft import sft_config, shared_prefix_sft_trainer

    calls = []
    kernel = logps.shared_prefix_logps
    monkeypatch.setattr(logps, "shared_prefix_logps", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    model, tokenizer = load_model(
        {"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu"
    )
    torch.manual_seed(0)
    instructions = torch.randint(3, 200, (24,)).tolist()  # >= MIN_SHARED_PREFIX: runs once
    rows = []
    for k in range(4):
        prompt = instructions + torch.randint(3, 200, (3 + 2 * k,)).tolist()
        answer = torch.randint(3, 200, (1 + k,)).tolist()
        rows.append({"input_ids": prompt + answer, "completion_mask": [0] * len(prompt) + [1] * len(answer)})
    rows.append(dict(rows[1]))  # a duplicate row counts twice
    algo = SimpleNamespace(
        lr_scheduler="constant",
        warmup_steps=0,
        epochs=1.0,
        max_updates=None,
        batch_size=len(rows),
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        weight_decay=0.0,
        max_grad_norm=1.0,
    )
    trainer = shared_prefix_sft_trainer()(
        model=model,
        args=sft_config(algo, tmp_path, "cpu", 0, "fp32"),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    batch = trainer._prepare_inputs(trainer.data_collator(list(trainer.train_dataset)))
    answer_tokens = sum(sum(r["completion_mask"]) for r in rows)
    assert int((batch["labels"] != -100).sum()) == answer_tokens  # TRL's collator kept our answer mask
    model.train()

    def loss_and_grads(compute) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad()
        context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with context:
            loss = compute(model, dict(batch), num_items_in_batch=torch.tensor(answer_tokens))
        loss.backward()
        return float(loss.detach()), {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }

    ours, our_grads = loss_and_grads(trainer.compute_loss)
    assert calls == [1]  # the loss went through the kernel
    trls, trl_grads = loss_and_grads(lambda *a, **k: SFTTrainer.compute_loss(trainer, *a, **k))
    assert ours > 0
    assert our_grads.keys() == trl_grads.keys()
    if not autocast:
        assert ours == pytest.approx(trls, rel=1e-5)
        for name, grad in trl_grads.items():
            torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        return
    assert ours == pytest.approx(trls, rel=2e-2)
    flat = [torch.cat([g[n].flatten() for n in sorted(g)]) for g in (our_grads, trl_grads)]
    assert torch.nn.functional.cosine_similarity(*flat, dim=0) > 0.99
