"""The rollout's token sampler (`agents/backends/sampling.py::sample_tokens`) draws from exactly the distribution
transformers' warpers define: temperature, then top-k (ties with the k-th score kept), then top-p."""

import pytest
import torch
from transformers import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

from agentrl.agents.backends.base import SamplingConfig
from agentrl.agents.backends.hf import HFBackend
from agentrl.agents.backends.sampling import CDF_BLOCK, inverse_cdf, inverse_cdf_blocks, sample_tokens

DRAWS = 40_000


def _scores(ties: int = 0) -> torch.Tensor:
    """One row of 300 logits: a spread of values, with `ties` tokens sharing the 4th-best score."""
    generator = torch.Generator().manual_seed(0)
    row = torch.randn(300, generator=generator).clamp(-2.5, 2.5)
    row[:8] = torch.tensor([4.0, 3.5, 3.2, 3.0, 2.9, 2.8, 2.7, 2.6])
    if ties:
        row[100 : 100 + ties] = 3.0  # tied with token 3
    return row


def _expected(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    warpers = LogitsProcessorList()
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return torch.softmax(warpers(None, row[None].clone()), -1)[0]


@pytest.mark.parametrize(
    ("top_k", "top_p", "ties"),
    [
        (5, 1.0, 0),
        (0, 1.0, 0),
        (0, 0.8, 0),
        (5, 0.7, 0),
        (4, 1.0, 3),  # tokens tied with the 4th score are all kept, as TopKLogitsWarper keeps them
        (4, 1.0, 40),  # more ties than the top-k margin looks at
    ],
)
def test_samples_follow_the_warpers_distribution(top_k, top_p, ties):
    row = _scores(ties)
    expected = _expected(row, top_k, top_p)
    chosen = sample_tokens(row.expand(DRAWS, -1), top_k, top_p, torch.Generator().manual_seed(1))
    frequency = torch.bincount(chosen, minlength=row.numel()).double() / DRAWS
    assert torch.all(frequency[expected == 0] == 0)  # nothing outside the kept tokens, ever
    bound = 5 * (expected * (1 - expected) / DRAWS).sqrt() + 1e-3
    assert torch.all((frequency - expected).abs() <= bound), (frequency - expected).abs().max()
    if ties:
        assert bool(frequency[100 : 100 + ties].gt(0).all())


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (0, 1.0), (0, 0.8)])
def test_rows_that_share_a_context_draw_from_its_distribution_on_their_own(top_k, top_p):
    """A lockstep step scores each distinct context once; every row drawn from it follows its distribution,
    independently of the rows beside it."""
    first, second = _scores(), _scores(ties=3).flip(0)
    rows = torch.arange(2 * DRAWS) % 2  # interleaved: 0, 1, 0, 1, ...
    chosen = sample_tokens(torch.stack([first, second]), top_k, top_p, torch.Generator().manual_seed(2), rows)
    for k, row in enumerate((first, second)):
        expected = _expected(row, top_k, top_p)
        frequency = torch.bincount(chosen[rows == k], minlength=row.numel()).double() / DRAWS
        assert torch.all(frequency[expected == 0] == 0)
        bound = 5 * (expected * (1 - expected) / DRAWS).sqrt() + 1e-3
        assert torch.all((frequency - expected).abs() <= bound), (frequency - expected).abs().max()


def _wide_scores() -> torch.Tensor:
    """One row as wide as a vocabulary (past `4 * CDF_BLOCK`, not a multiple of it), its mass on a few
    tokens spread over several blocks."""
    generator = torch.Generator().manual_seed(5)
    row = torch.randn(4 * CDF_BLOCK + 321, generator=generator).clamp(-2.5, 2.5) - 4.0
    row[[3, 700, CDF_BLOCK, 2 * CDF_BLOCK + 5, 4 * CDF_BLOCK + 300]] = torch.tensor([3.0, 2.5, 2.8, 2.0, 2.6])
    return row


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_a_whole_vocabulary_is_sampled_block_by_block_from_the_same_distribution(top_p):
    row = _wide_scores()
    expected = _expected(row, 0, top_p)
    # DRAWS rows of one context (`rows`): the distribution is worked out once, as in a lockstep step
    rows = torch.zeros(DRAWS, dtype=torch.long)
    chosen = sample_tokens(row[None], 0, top_p, torch.Generator().manual_seed(1), rows)
    frequency = torch.bincount(chosen, minlength=row.numel()).double() / DRAWS
    assert torch.all(frequency[expected == 0] == 0)
    bound = 5 * (expected * (1 - expected) / DRAWS).sqrt() + 1e-3
    assert torch.all((frequency - expected).abs() <= bound), (frequency - expected).abs().max()


def test_block_by_block_picks_the_tokens_one_cumulative_sum_picks():
    """The same uniform numbers give the same tokens both ways, never a token without mass: also at the
    ends of the unit interval and when whole blocks, the padded tail among them, hold nothing."""
    generator = torch.Generator().manual_seed(0)
    width = 5 * CDF_BLOCK - 100
    probs = torch.rand(3, width, generator=generator) ** 8
    probs[1, 2 * CDF_BLOCK :] = 0  # top-p left nothing in the last blocks
    probs[2, : 3 * CDF_BLOCK] = 0  # nothing in the first blocks
    probs[2, 3 * CDF_BLOCK + 7] = 50.0
    probs = probs / probs.sum(-1, keepdim=True)
    rows = torch.arange(3).repeat_interleave(2000)
    uniform = torch.rand(len(rows), generator=generator, dtype=torch.float64)
    for start in (0, 2000, 4000):  # each row: both ends of [0, 1)
        uniform[start : start + 2] = torch.tensor([0.0, 1.0 - 2**-53], dtype=torch.float64)
    one, two = inverse_cdf(probs, rows, uniform), inverse_cdf_blocks(probs, rows, uniform)
    assert bool((probs[rows, two] > 0).all())
    assert (one != two).sum() <= 2, (one != two).nonzero()
    # a draw that the product with a row's total rounds up to that total still lands on a token with mass
    at_total = inverse_cdf_blocks(probs, torch.arange(3), torch.ones(3, dtype=torch.float64))
    assert bool((probs[torch.arange(3), at_total] > 0).all())


def test_the_same_seed_draws_the_same_tokens():
    rows = torch.randn(64, 1000)
    draw = lambda seed: sample_tokens(rows, 0, 1.0, torch.Generator().manual_seed(seed))  # noqa: E731
    assert torch.equal(draw(3), draw(3))
    assert not torch.equal(draw(3), draw(4))


def test_a_sampled_tokens_log_prob_is_before_top_k_at_the_temperature():
    scores = torch.randn(6, 500)
    sampling = SamplingConfig(temperature=0.7, top_k=5, max_new_tokens=1)
    chosen, logp = HFBackend._sample(scores, sampling, torch.Generator().manual_seed(0))
    expected = torch.log_softmax(scores / 0.7, -1).gather(1, chosen[:, None]).squeeze(1)
    assert torch.allclose(logp, expected, atol=1e-5)
    assert bool((scores.topk(5).indices == chosen[:, None]).any(-1).all())
    greedy, greedy_logp = HFBackend._sample(scores, SamplingConfig(temperature=0.0), None)
    assert torch.equal(greedy, scores.argmax(-1))
    assert torch.allclose(greedy_logp, torch.log_softmax(scores, -1).max(-1).values, atol=1e-5)


def test_the_sampling_benchmark_times_both_samplers(tmp_path, monkeypatch):
    import json
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "sampling_speed.py"
    argv = ["sampling_speed.py", "--rows", "4", "--top-k", "5", "0", "--vocab", "300", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--threads", "1", "--out", str(tmp_path)])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)  # the script sets its own
    results = json.loads((tmp_path / "sampling_speed.json").read_text())["results"]
    assert [(r["rows"], r["top_k"]) for r in results] == [(4, 5), (4, 0)]
    assert all(r["multinomial_ms"] > 0 and r["cumulative_ms"] > 0 for r in results)
    assert "| 4 | 5 |" in (tmp_path / "sampling_speed.md").read_text()
