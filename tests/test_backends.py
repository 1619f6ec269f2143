"""Generation backends: HF log-probs against a fresh forward pass, stopping, seeding, and the OpenAI
backend against a real local HTTP server that serves chat completions with the tiny model."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from helpers import WeightCasts, autocast_like_accelerate

from agentrl.agents.backends import (
    HFBackend,
    OpenAIBackend,
    SamplingConfig,
    VLLMBackend,
    build_backend,
)
from agentrl.config import compose_config
from agentrl.errors import BackendError, ConfigError
from agentrl.kernels.kvcache import MIN_SHARED_PREFIX
from agentrl.models import load_model

torch.set_num_threads(1)
EOS_BIAS = 6.0  # at T=0.7 makes <|im_end|> likely (~10% a token) so both ways a completion ends are exercised


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model(
        {"name": "tiny-random", "name_or_path": "builtin:tiny-random"}, device="cpu"
    )
    return model, tokenizer


@pytest.fixture(scope="module")
def eos_model():
    """A tiny model with an output bias towards eos (a new, untied head with a bias)."""
    fresh, tokenizer = load_model({"name_or_path": "builtin:tiny-random"}, device="cpu")
    head = torch.nn.Linear(fresh.config.hidden_size, fresh.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.copy_(fresh.lm_head.weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = EOS_BIAS
    fresh.lm_head = head
    fresh.eval()
    return fresh, tokenizer


HEAD = "<|im_start|>system\nYou play a small game. Move towards the goal and avoid the holes.<|im_end|>\n"


def _prompts(tokenizer, n):
    """Prompts sharing a long head (exercises prefix caching) with own parts of different lengths."""
    texts = [HEAD + f"<|im_start|>user\nObservation {k}: " + "go " * (k % 4) + "now" for k in range(n)]
    return [tokenizer(t, add_special_tokens=False).input_ids for t in texts]


def _fresh_logprobs(model, prompt, completion, temperature):
    """log_softmax(logits / T) of each completion token from one unpadded forward pass."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


# ---- SamplingConfig --------------------------------------------------------------------------------
def test_sampling_config_from_cfg_and_validation():
    s = SamplingConfig.from_cfg({"temperature": 0.7, "top_k": 3, "stop": "</a>", "max_new_tokens": None})
    assert s.do_sample and s.top_k == 3 and s.stop == ("</a>",) and s.max_new_tokens == 32
    assert not SamplingConfig.from_cfg({"temperature": 0}).do_sample
    assert s.with_stop("</b>", "</a>").stop == ("</a>", "</b>")
    with pytest.raises(ConfigError):
        SamplingConfig.from_cfg({"top_p": 0})
    with pytest.raises(ConfigError):
        SamplingConfig.from_cfg({"max_new_tokens": 0})


# ---- HF backend ------------------------------------------------------------------------------------
def test_hf_sampled_logprobs_match_fresh_forward_pass(eos_model):
    model, tokenizer = eos_model
    backend = HFBackend(model, tokenizer)
    prompts = _prompts(tokenizer, 8)  # different lengths: exercises left padding
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=12)
    results = backend.generate(prompts, sampling, seed=3)
    assert len(results) == len(prompts)
    ended_by_eos = 0
    for prompt, (ids, logprobs) in zip(prompts, results, strict=True):
        assert 1 <= len(ids) <= sampling.max_new_tokens and len(logprobs) == len(ids)
        # ends at eos (kept) or at max_new_tokens; no eos/pad before the end
        assert ids[-1] == tokenizer.eos_token_id or len(ids) == sampling.max_new_tokens
        assert tokenizer.eos_token_id not in ids[:-1]
        ended_by_eos += ids[-1] == tokenizer.eos_token_id
        expected = _fresh_logprobs(model, prompt, ids, sampling.temperature)
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4), (logprobs, expected)
    assert 0 < ended_by_eos < len(prompts)  # both endings occurred


def test_hf_greedy_logprobs_and_batch_equals_single(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer)
    prompts = _prompts(tokenizer, 4)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=6)
    batched = backend.generate(prompts, sampling)
    for prompt, (ids, logprobs) in zip(prompts, batched, strict=True):
        single_ids, single_lps = backend.generate([prompt], sampling)[0]
        assert ids == single_ids  # left padding does not change what a row generates
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(single_lps), atol=1e-4)
        expected = _fresh_logprobs(model, prompt, ids, 1.0)  # greedy: untempered log-probs
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4)
        with torch.no_grad():  # greedy picks the argmax at every position
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        assert logits.argmax(-1).tolist() == ids


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_hf_prefix_cache_changes_nothing_but_speed(tiny, temperature):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 5)
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=6)
    cached, plain = HFBackend(model, tokenizer), HFBackend(model, tokenizer, prefix_cache=False)
    with_cache = cached.generate(prompts, sampling, seed=4)
    assert len(cached._prefix_ids) >= MIN_SHARED_PREFIX  # the shared head was cached
    without = plain.generate(prompts, sampling, seed=4)
    assert [r[0] for r in with_cache] == [r[0] for r in without]
    for (_, a), (_, b) in zip(with_cache, without, strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)
    # one prompt at a time reuses the kept head (sliced to the common part)
    for prompt in prompts[:2]:
        assert (
            cached.generate([prompt], sampling, seed=5)[0][0]
            == plain.generate([prompt], sampling, seed=5)[0][0]
        )


def test_hf_prefix_cache_dropped_when_weights_change(tiny):
    model, tokenizer = tiny
    prompts = _prompts(tokenizer, 3)
    sampling = SamplingConfig(max_new_tokens=4)
    backend = HFBackend(model, tokenizer)
    backend.generate(prompts, sampling)
    kept = backend._prefix_states[0][0].clone()
    layer = model.model.layers[0].self_attn.k_proj.weight
    original = layer.detach().clone()
    try:
        with torch.no_grad():
            layer.add_(0.5)  # an optimizer step updates parameters in place like this
        after = backend.generate(prompts, sampling)
        assert not torch.equal(backend._prefix_states[0][0], kept)  # recomputed with the new weights
        fresh = HFBackend(model, tokenizer, prefix_cache=False).generate(prompts, sampling)
        assert [r[0] for r in after] == [r[0] for r in fresh]
    finally:
        with torch.no_grad():
            layer.copy_(original)


def test_hf_seed_reproducible_and_restores_train_mode(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer)
    prompts = _prompts(tokenizer, 3)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=5)
    model.train()
    try:
        a = backend.generate(prompts, sampling, seed=11)
        assert model.training  # generation ran in eval mode and restored train mode
        state = torch.random.get_rng_state()
        b = backend.generate(prompts, sampling, seed=11)
        assert torch.equal(state, torch.random.get_rng_state())  # the global RNG stream is untouched
        c = backend.generate(prompts, sampling, seed=12)
    finally:
        model.eval()
    assert [x[0] for x in a] == [x[0] for x in b]
    assert [x[0] for x in a] != [x[0] for x in c]


def test_hf_stop_string_ends_completion(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer)
    prompt = _prompts(tokenizer, 1)
    free = backend.generate(prompt, SamplingConfig(max_new_tokens=6))[0][0]
    # stop at the text of the 2nd generated token: greedy then stops right after it
    stop_text = tokenizer.decode(free[1:2])
    first_text = tokenizer.decode(free[:1])
    expected_len = 1 if stop_text in first_text else 2
    ids, logprobs = backend.generate(prompt, SamplingConfig(max_new_tokens=6, stop=(stop_text,)))[0]
    assert ids == free[:expected_len] and len(logprobs) == expected_len


def test_hf_completion_length_rules(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer)
    eos = tokenizer.eos_token_id
    body = tokenizer("<action>right</action> more", add_special_tokens=False).input_ids
    # eos kept, trailing padding dropped
    assert backend._completion_length([5, 6, eos, eos, eos], ()) == 3
    assert backend._completion_length([5, 6, 7], ()) == 3
    # a stop string ends the completion at the token that completes it, before any eos
    cut = backend._completion_length(body + [eos, eos], ("</action>",))
    assert tokenizer.decode(body[:cut]).endswith("</action>")
    assert "</action>" not in tokenizer.decode(body[: cut - 1])


# ---- OpenAI-compatible HTTP ------------------------------------------------------------------------
class _ChatServer:
    """A real HTTP server (stdlib) serving /v1/chat/completions with the tiny model via HFBackend."""

    def __init__(self, model, tokenizer):
        self.backend = HFBackend(model, tokenizer)
        self.tokenizer = tokenizer
        # one generate at a time, as a real server's engine batches them: an HFBackend (its prefix
        # cache, the model's train/eval mode) is not meant to be shared by concurrent threads
        self.lock = threading.Lock()
        self.requests: list[tuple[dict, dict]] = []
        self.fail_with: int | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((dict(self.headers), body))
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": "not found"})
                if outer.fail_with:
                    return self._send(outer.fail_with, {"error": {"message": "boom"}})
                self._send(200, outer.complete(body))

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def complete(self, body):
        messages = body["messages"]
        prefill = ""
        if body.get("continue_final_message"):
            prefill = messages[-1]["content"]
            messages = messages[:-1]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer(text + prefill, add_special_tokens=False).input_ids
        sampling = SamplingConfig(
            temperature=body.get("temperature", 1.0),
            max_new_tokens=body["max_tokens"],
            stop=tuple(body.get("stop") or ()),
        )
        with self.lock:
            completion, logprobs = self.backend.generate([ids], sampling, seed=body.get("seed"))[0]
        if completion and completion[-1] == self.tokenizer.eos_token_id:  # servers do not return eos
            completion, logprobs = completion[:-1], logprobs[:-1]
        as_ids = body.get("return_tokens_as_token_ids")
        content = [
            {"token": f"token_id:{t}" if as_ids else self.tokenizer.decode([t]), "logprob": lp}
            for t, lp in zip(completion, logprobs, strict=True)
        ]
        message = {
            "role": "assistant",
            "content": self.tokenizer.decode(completion, skip_special_tokens=True),
        }
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": content}
        return {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [choice]}

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server(tiny):
    with _ChatServer(*tiny) as server:
        yield server


CONVERSATION = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Move?"}]


def test_openai_backend_against_local_server(chat_server, tiny, monkeypatch, caplog):
    model, tokenizer = tiny
    secret = "sk-test-secret-123"
    monkeypatch.setenv("AGENTRL_TEST_KEY", secret)
    backend = OpenAIBackend(
        chat_server.url, "tiny", api_key_env="AGENTRL_TEST_KEY", tokenizer=tokenizer, return_token_ids=True
    )
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=5)
    with caplog.at_level(logging.DEBUG):
        replies = backend.generate_chat([CONVERSATION, CONVERSATION[1:]], sampling, prefill="<action>")
    assert len(replies) == 2 and len(chat_server.requests) == 2
    headers, body = chat_server.requests[0]
    assert headers["Authorization"] == f"Bearer {secret}"
    assert (
        secret not in caplog.text and secret not in json.dumps(body) and secret not in repr(backend.__dict__)
    )
    assert body["model"] == "tiny" and body["max_tokens"] == 5 and body["continue_final_message"] is True
    # the reply equals generating locally with the same model and prompt
    prompt = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    local_ids, local_lps = HFBackend(model, tokenizer).generate(
        [tokenizer(prompt + "<action>", add_special_tokens=False).input_ids], sampling
    )[0]
    text, ids, logprobs = replies[0]
    n = len(ids)  # the server drops a final eos, as real servers do
    assert (
        n >= len(local_ids) - 1
        and ids == local_ids[:n]
        and text == tokenizer.decode(ids, skip_special_tokens=True)
    )
    assert logprobs is not None and torch.allclose(
        torch.tensor(logprobs), torch.tensor(local_lps[:n]), atol=1e-4
    )


def test_openai_backend_without_token_ids_keeps_invariant(chat_server, tiny):
    _, tokenizer = tiny
    backend = OpenAIBackend(chat_server.url, "tiny", api_key_env=None, tokenizer=tokenizer)
    text, ids, logprobs = backend.generate_chat([CONVERSATION], SamplingConfig(max_new_tokens=4))[0]
    assert "Authorization" not in chat_server.requests[0][0]
    assert ids == tokenizer(text, add_special_tokens=False).input_ids
    assert logprobs is None or len(logprobs) == len(ids)
    no_tok = OpenAIBackend(chat_server.url, "tiny", api_key_env=None)
    text2, ids2, logprobs2 = no_tok.generate_chat([CONVERSATION], SamplingConfig(max_new_tokens=4))[0]
    assert text2 == text and ids2 == [] and logprobs2 is None


def test_openai_backend_errors_are_backend_errors(chat_server):
    chat_server.fail_with = 400
    backend = OpenAIBackend(chat_server.url, "tiny", api_key_env=None, retries=0)
    with pytest.raises(BackendError, match="HTTP 400"):
        backend.generate_chat([CONVERSATION], SamplingConfig())
    unreachable = OpenAIBackend("http://127.0.0.1:9/v1", "tiny", api_key_env=None, retries=0, timeout=2)
    with pytest.raises(BackendError, match="failed"):
        unreachable.generate_chat([CONVERSATION], SamplingConfig())
    with pytest.raises(BackendError):
        backend.generate([[1, 2]], SamplingConfig())


@pytest.fixture
def silent_server():
    """The base URL of a TCP server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(32)
    yield f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    server.close()


def test_openai_timeouts_are_retried_logged_and_bounded(silent_server, caplog):
    overrides = [
        "model=openai",
        f"model.base_url={silent_server}",
        "model.timeout=0.5",
        "model.max_retries=1",
    ]
    backend = build_backend(compose_config(overrides).model)
    assert backend.timeout == 0.5 and backend.retries == 1
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="agentrl.agents.backends.openai"):
        with pytest.raises(BackendError) as raised:
            backend.generate_chat([CONVERSATION] * 3, SamplingConfig())
    elapsed = time.perf_counter() - start
    assert 1.0 <= elapsed < 3.0  # two 0.5 s attempts and one 0.5 s wait, the 3 requests side by side
    message = str(raised.value)
    url = f"{silent_server}/chat/completions"
    assert "\n" not in message
    assert f"request to {url} failed after 2 attempts: no answer within model.timeout=0.5 s" in message
    retries = [r.getMessage() for r in caplog.records if r.name == "agentrl.agents.backends.openai"]
    assert retries == [f"openai backend: {url}: no answer within model.timeout=0.5 s; retry 1 of 1 in 0.5 s"]


def test_openai_refused_connection_and_server_errors(chat_server, caplog):
    backend = OpenAIBackend("http://127.0.0.1:9/v1", "m", api_key_env=None, retries=2, timeout=2)
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="agentrl.agents.backends.openai"):
        with pytest.raises(BackendError, match=r"127\.0\.0\.1:9/v1/chat/completions failed after 3 attempts"):
            backend.generate_chat([CONVERSATION], SamplingConfig())
    assert time.perf_counter() - start < 3.0  # waits of 0.5 and 1 s, no wait after the last attempt
    assert [r.getMessage().rsplit("; ", 1)[1] for r in caplog.records] == [
        "retry 1 of 2 in 0.5 s",
        "retry 2 of 2 in 1.0 s",
    ]
    # HTTP 503 is retried, HTTP 400 is not
    chat_server.fail_with = 503
    with pytest.raises(BackendError, match="failed after 2 attempts: HTTP 503"):
        OpenAIBackend(chat_server.url, "tiny", api_key_env=None, retries=1).generate_chat(
            [CONVERSATION], SamplingConfig()
        )
    assert len(chat_server.requests) == 2
    chat_server.fail_with = 400
    with pytest.raises(BackendError, match="HTTP 400"):
        OpenAIBackend(chat_server.url, "tiny", api_key_env=None, retries=3).generate_chat(
            [CONVERSATION], SamplingConfig()
        )
    assert len(chat_server.requests) == 3


@pytest.mark.parametrize(
    "url", ["notaurl", "ftp://host/v1", "http:///v1", "http://host:port/v1", "localhost:8000"]
)
def test_openai_base_url_is_checked_when_composing(url):
    with pytest.raises(
        ConfigError, match=rf"^model\.base_url={re.escape(url)}: must be an http\(s\) URL with a host"
    ):
        compose_config(["model=openai", f"model.base_url={url}"])
    compose_config([f"model.base_url={url}"])  # unused by the hf backend: not checked
    assert (
        compose_config(["model=openai", "model.base_url=https://api.example.com/v1"]).model.max_retries == 2
    )


def test_bad_base_url_on_the_command_line_is_one_line_exit_2(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli import app

    result = CliRunner().invoke(app, ["eval", "model=openai", "model.base_url=notaurl"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0
    assert "model.base_url=notaurl: must be an http(s) URL" in result.output
    assert not (tmp_path / "outputs").exists()


# ---- construction ----------------------------------------------------------------------------------
def test_build_backend_choices(tiny):
    model, tokenizer = tiny
    hf = build_backend(
        {"backend": "hf", "name_or_path": "builtin:tiny-random"}, model=model, tokenizer=tokenizer
    )
    assert isinstance(hf, HFBackend) and hf.model is model
    oa = build_backend({"backend": "openai", "base_url": "http://x/v1", "name": "m", "api_key_env": "K"})
    assert isinstance(oa, OpenAIBackend) and oa.url == "http://x/v1/chat/completions" and oa.model == "m"
    with pytest.raises(ConfigError, match="model.backend=tgi: must be one of: hf, openai, vllm"):
        build_backend({"backend": "tgi"})


def test_vllm_missing_gives_install_hint():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed")
    except ImportError:
        pass
    with pytest.raises(BackendError, match="pip install vllm"):
        VLLMBackend("builtin:tiny-random")


# ---- prompt sharing (training rollouts) ---------------------------------------------------------------
def test_hf_shared_prompts_match_plain_generation():
    model, tokenizer = load_model(compose_config(["model=tiny-random"]).model)
    plain = HFBackend(model, tokenizer)
    shared = HFBackend(model, tokenizer, share_prompts=True)
    system = list(range(100, 120))
    prompts = [system + p for p in ([5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [5, 6, 7, 8], [11, 12, 13])]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=5)
    expected, got = plain.generate(prompts, greedy), shared.generate(prompts, greedy)
    for (ids_a, lp_a), (ids_b, lp_b) in zip(expected, got, strict=True):
        assert ids_a == ids_b
        assert lp_a == pytest.approx(lp_b, abs=1e-4)
    # sampling: each duplicate row samples on its own; log-probs are log_softmax(logits / T) of the token
    hot = SamplingConfig(temperature=1.5, max_new_tokens=3, top_k=50)
    rows = shared.generate(prompts * 4, hot, seed=1)
    assert len({tuple(ids) for ids, _ in rows[::5]}) > 1  # copies of prompt 0 differ
    ids, lps = rows[1]
    with torch.no_grad():
        row = prompts[1] + ids
        row = torch.tensor([row], device=model.device)
        logits = model(input_ids=row).logits[0, len(prompts[1]) - 1 : -1].float() / 1.5
    reference = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids, device=model.device)[:, None])
    reference = reference.squeeze(-1)
    assert lps == pytest.approx(reference.tolist(), abs=1e-4)
    assert shared.generate(prompts, hot, seed=3) == shared.generate(prompts, hot, seed=3)


@contextlib.contextmanager
def _decode_rows(model):
    """The batch size of every one-token (decode) forward of `model` while the block runs."""
    rows: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: (
            rows.append(kwargs["input_ids"].size(0)) if kwargs["input_ids"].size(1) == 1 else None
        ),
        with_kwargs=True,
    )
    try:
        yield rows
    finally:
        hook.remove()


def test_shared_decoding_runs_each_distinct_context_once():
    """Copies of a prompt that draw the same tokens share one KV-cache row while they agree."""
    model, tokenizer = load_model(compose_config(["model=tiny-random"]).model)
    plain = HFBackend(model, tokenizer)
    shared = HFBackend(model, tokenizer, share_prompts=True)
    system = list(range(100, 120))
    prompts = [system + p for p in ([5, 6, 7, 8], [9, 10], [11, 12, 13])] * 4
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=5)
    with _decode_rows(model) as decode_rows:
        got = shared.generate(prompts, greedy)
    assert decode_rows and max(decode_rows) <= 3, decode_rows  # 3 distinct prompts, greedy: 3 contexts
    for (ids_a, lp_a), (ids_b, lp_b) in zip(plain.generate(prompts, greedy), got, strict=True):
        assert ids_a == ids_b
        assert lp_a == pytest.approx(lp_b, abs=1e-4)


def test_shared_decoding_drops_finished_rows_and_keeps_exact_logprobs(eos_model):
    """Rows that ended leave the decode batch (its KV cache shrinks to the rows still writing), and every
    row's log-probs are still a fresh forward pass's, through the cache written in place."""
    model, tokenizer = eos_model
    shared = HFBackend(model, tokenizer, share_prompts=True)
    prompts = _prompts(tokenizer, 12)  # distinct prompts: one context per row
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=12)
    with _decode_rows(model) as decode_rows:
        results = shared.generate(prompts, sampling, seed=3)
    lengths = [len(ids) for ids, _ in results]
    assert min(lengths) < max(lengths)  # some rows ended early
    # the decode after token k runs the rows that have not ended by then
    assert decode_rows == [sum(n > k + 1 for n in lengths) for k in range(len(decode_rows))]
    assert decode_rows[-1] < len(prompts)
    for prompt, (ids, logprobs) in zip(prompts, results, strict=True):
        expected = _fresh_logprobs(model, prompt, ids, sampling.temperature)
        assert torch.allclose(torch.tensor(logprobs), expected, atol=1e-4), (logprobs, expected)


def test_a_preallocated_cache_holds_what_a_dynamic_one_does():
    """`preallocate` writes new positions in place; after appends, a batch selection and a crop, its
    layers hold exactly the states a DynamicCache's do."""
    from transformers import DynamicCache

    from agentrl.kernels.kvcache import preallocate

    def states(n):
        return [(torch.randn(3, 2, n, 4), torch.randn(3, 2, n, 4)) for _ in range(2)]

    first = states(5)
    plain, grown = DynamicCache(first), preallocate(DynamicCache(first), 2)
    for step in range(4):  # past the spare room: the buffer grows
        for layer, (k, v) in enumerate(states(1 + step % 2)):
            plain.update(k, v, layer)
            grown.update(k, v, layer)
    for cache in (plain, grown):
        cache.batch_select_indices(torch.tensor([2, 0, 0]))
        cache.crop(-2)
    assert grown.get_seq_length() == plain.get_seq_length() == 5 + 6 - 2
    for a, b in zip(plain.layers, grown.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_one_token_answers_reuse_logits_until_the_weights_change(monkeypatch):
    from agentrl.kernels import kvcache

    model, tokenizer = load_model(compose_config(["model=tiny-random"]).model)
    plain = HFBackend(model, tokenizer)
    shared = HFBackend(model, tokenizer, share_prompts=True)
    system = list(range(100, 120))
    prompts = [system + p for p in ([5, 6, 7, 8], [9, 10], [5, 6, 7, 8], [11, 12, 13])]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=1)
    for (ids_a, lp_a), (ids_b, lp_b) in zip(
        plain.generate(prompts, greedy), shared.generate(prompts, greedy), strict=True
    ):
        assert ids_a == ids_b and len(ids_b) == 1
        assert lp_a == pytest.approx(lp_b, abs=1e-4)

    runs = []
    real = kvcache.prefill_shared
    monkeypatch.setattr(
        kvcache,
        "prefill_shared",
        lambda m, p, pad, prefix=None: runs.append(len(p)) or real(m, p, pad, prefix),
    )
    hot = SamplingConfig(temperature=1.0, max_new_tokens=1, top_k=5)
    first = shared.generate(prompts * 8, hot, seed=2)
    assert runs == []  # every distinct prompt was already computed under these weights
    assert len({tuple(ids) for ids, _ in first[::4]}) > 1  # copies still sample on their own
    shared.generate([system + [14, 15]] + prompts, hot, seed=2)
    assert runs == [1]  # only the new prompt ran, on top of the kept KV states of the shared head
    [(ids_a, lp_a)] = plain.generate([system + [16, 17]], greedy)
    [(ids_b, lp_b)] = shared.generate([system + [16, 17]], greedy)
    assert ids_a == ids_b and lp_a == pytest.approx(lp_b, abs=1e-4)
    with torch.no_grad():
        next(model.parameters()).add_(0.5)  # an in-place change moves the version counters
    shared.generate(prompts, greedy)
    assert runs[-1] == 3  # all distinct prompts recomputed
    # torch's fused AdamW (the HF Trainer's CPU default) updates in place without moving version
    # counters: the trainer says so through weights_changed()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    model(input_ids=torch.tensor([prompts[0]])).logits.sum().backward()
    optimizer.step()
    runs.clear()
    shared.generate(prompts, greedy)
    assert runs == []  # not detectable from the parameters alone
    shared.weights_changed()
    after = shared.generate(prompts, greedy)
    assert runs == [3]
    fresh = HFBackend(model, tokenizer).generate(prompts, greedy)
    assert [lp[0] for _, lp in after] == pytest.approx([lp[0] for _, lp in fresh], abs=1e-4)
    assert [ids for ids, _ in after] == [ids for ids, _ in fresh]


@pytest.fixture
def unpacked(monkeypatch):
    """Generation without packed linear weights (kernels/packed.py): autocast's own weight casts, as where
    packing does not apply (not a CPU, a torch without oneDNN); tests/test_packed.py covers the packs."""
    from agentrl.kernels.packed import PackedLinears

    monkeypatch.setattr(PackedLinears, "build", classmethod(lambda cls, *a, **k: None))


@pytest.mark.usefixtures("unpacked")
def test_a_rollout_keeps_the_weight_casts_across_generation_calls():
    """Inside `weight_casts_kept` (the Collector's rollout) every generation call reuses the casts of the
    first: each trained weight is cast once for all the calls, with the same tokens. On leaving, the casts
    are dropped: the next training forward casts again and its backward reaches every weight."""
    # fp32 weights for autocast to cast (model.dtype=auto is bf16 on a GPU)
    model, tokenizer = load_model(compose_config(["model=tiny-random", "model.dtype=float32"]).model)
    model = autocast_like_accelerate(model)
    model.train()

    backend = HFBackend(model, tokenizer)
    prompts = [list(range(100, 120)) + p for p in ([5, 6, 7, 8], [9, 10])]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=4)
    with WeightCasts(model) as casts:
        apart = [backend.generate(prompts, greedy) for _ in range(3)]
    assert casts.most() == 3  # once per call
    with WeightCasts(model) as casts, backend.weight_casts_kept():
        kept = [backend.generate(prompts, greedy) for _ in range(3)]
    assert casts.most() == 1  # once for the three calls
    assert [[ids for ids, _ in c] for c in kept] == [[ids for ids, _ in c] for c in apart]
    model.zero_grad()
    model(torch.tensor([prompts[0]])).logits.float().square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.dim() == 2)


@pytest.mark.usefixtures("unpacked")
@pytest.mark.parametrize("share", [False, True])
def test_mixed_precision_generation_casts_each_weight_once_per_call(share):
    """Under a forward wrapped in autocast, a whole generation call casts each trained weight to bf16
    once, not once per decoded token, and generates what the wrapped forward alone generates."""
    # fp32 weights for autocast to cast (model.dtype=auto is bf16 on a GPU)
    model, tokenizer = load_model(compose_config(["model=tiny-random", "model.dtype=float32"]).model)
    model = autocast_like_accelerate(model)
    model.train()

    backend = HFBackend(model, tokenizer, share_prompts=share)
    prompts = [list(range(100, 120)) + p for p in ([5, 6, 7, 8], [9, 10])]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=6)
    with WeightCasts(model) as casts:
        got = backend.generate(prompts, greedy)
    assert casts.most() == 1
    assert model.training
    # the same tokens as with autocast per forward call (no outer context)
    backend._weight_casts = lambda: contextlib.nullcontext()
    with WeightCasts(model) as casts:
        expected = backend.generate(prompts, greedy)
    assert casts.most() > 1  # the per-token casts the test counts
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
