"""`OpenAIBackend`: any OpenAI-compatible chat-completions endpoint over HTTP (see the package doc)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentrl.agents.backends.base import Backend, Completion, SamplingConfig
from agentrl.errors import BackendError, ConfigError

log = logging.getLogger(__name__)

RETRY_WAIT_S = 0.5
RETRY_WAIT_MAX_S = 8.0
#: seconds the check before a run waits for the endpoint's model list (at most model.timeout)
ENDPOINT_CHECK_TIMEOUT_S = 5.0
#: served model names an error line shows
NAMES_SHOWN = 8


def check_endpoint(
    base_url: str, model: str, *, api_key_env: str | None = "OPENAI_API_KEY", timeout: float = 120.0
) -> None:
    """The endpoint answers and serves `model`, checked before a run starts: one GET of the model list
    (`<base_url>/models`, which OpenAI, vLLM, TGI, llama.cpp and Ollama serve). An unreachable host, a
    refused connection, no answer in time or an HTTP error (401: the key) is one BackendError line, and
    so is a model list without `model`. A server without the list (HTTP 404) passes: it answered."""
    url = base_url.rstrip("/") + "/models"
    headers = {}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    wait = min(float(timeout), ENDPOINT_CHECK_TIMEOUT_S)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=wait) as response:
            listing = json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            log.debug("openai backend: %s answers 404; the served models are not checked", url)
            return
        hint = f" (is ${api_key_env} the endpoint's key?)" if exc.code in (401, 403) and api_key_env else ""
        raise BackendError(f"model.base_url={base_url}: GET {url} answered HTTP {exc.code}{hint}") from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
        reason = _connection_reason(exc, wait).replace("model.timeout=", "")
        raise BackendError(
            f"model.base_url={base_url}: the endpoint cannot be reached ({reason}); start the server or "
            "fix model.base_url"
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # it answered with something else than OpenAI's list: requests will tell
    served = (
        [str(m.get("id")) for m in listing.get("data", []) if isinstance(m, dict)]
        if isinstance(listing, dict)
        else []
    )
    if served and model not in served:
        shown = ", ".join(served[:NAMES_SHOWN]) + (
            f" ... ({len(served)} in all)" if len(served) > NAMES_SHOWN else ""
        )
        raise BackendError(f"model.name={model}: {base_url} does not serve it; it serves {shown}")


# ---- OpenAI-compatible HTTP ------------------------------------------------------------------------
class OpenAIBackend(Backend):
    """Chat completions from an OpenAI-compatible server (vLLM `serve`, a provider). Evaluation only.

    The API key is read from the environment variable `api_key_env` at request time and sent only in
    the Authorization header; it is never logged, stored on the object or written anywhere.
    """

    name = "openai"
    chat_input = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        tokenizer: Any = None,
        timeout: float = 120.0,
        max_concurrency: int = 16,
        logprobs: bool = True,
        return_token_ids: bool = False,
        retries: int = 2,
    ):
        if not base_url:
            raise ConfigError("model.base_url is required for the openai backend")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.tokenizer = tokenizer
        self.timeout = float(timeout)
        self.max_concurrency = max(1, int(max_concurrency))
        self.logprobs = bool(logprobs)
        self.return_token_ids = bool(return_token_ids)
        self.retries = max(0, int(retries))
        # Set once a request has given up on a connection-level error: the other requests of the batch
        # stop too instead of each waiting out its own retries against the same dead endpoint.
        self._down: BackendError | None = None
        self._lock = threading.Lock()
        self._logged: set[tuple[int, str]] = set()  # (retry, reason) already logged in this call

    def generate(
        self, prompts: list[list[int]], sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[Completion]:
        raise BackendError("the openai backend takes chat messages: use generate_chat (LLMAgent does)")

    def _request_body(
        self, messages: list[dict[str, str]], sampling: SamplingConfig, prefill: str, seed: int | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": float(sampling.temperature),
            "max_tokens": int(sampling.max_new_tokens),
            "n": 1,
        }
        if sampling.do_sample and sampling.top_p < 1:
            body["top_p"] = float(sampling.top_p)
        if sampling.do_sample and sampling.top_k > 0:
            body["top_k"] = int(sampling.top_k)  # not in OpenAI's API; vLLM and others accept it
        if sampling.stop:
            body["stop"] = list(sampling.stop)[:4]  # OpenAI allows at most 4
        if seed is not None:
            body["seed"] = int(seed)
        if self.logprobs or self.return_token_ids:
            body["logprobs"] = True
        if self.return_token_ids:
            body["return_tokens_as_token_ids"] = True  # vLLM: logprob tokens read "token_id:<id>"
        if prefill:
            # vLLM's extension: continue the assistant message instead of starting a new one.
            body["messages"].append({"role": "assistant", "content": prefill})
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        return body

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode()
        attempts = self.retries + 1
        for attempt in range(attempts):
            if self._down is not None:
                raise self._down
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            retryable = True
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read().decode())
            except urllib.error.HTTPError as exc:
                detail = " ".join(exc.read().decode(errors="replace").split())[:300]
                reason = f"HTTP {exc.code}: {detail}"
                retryable = exc.code >= 500 or exc.code == 429  # a client error stays an error
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as exc:
                reason = _connection_reason(exc, self.timeout)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                reason, retryable = f"invalid JSON in the response: {exc}", False
            if not retryable or attempt + 1 == attempts:
                break
            wait = min(RETRY_WAIT_S * 2.0**attempt, RETRY_WAIT_MAX_S)
            self._log_retry(attempt + 1, reason, wait)
            time.sleep(wait)
        tried = f" after {attempts} attempts" if retryable and attempts > 1 else ""
        error = BackendError(
            f"openai backend: request to {self.url} failed{tried}: {reason} "
            "(check model.base_url and that the server is up; model.timeout and model.max_retries "
            "set the patience)"
            if retryable
            else f"openai backend: request to {self.url} failed: {reason}"
        )
        if retryable and not reason.startswith("HTTP"):
            self._down = error
        raise error

    def _log_retry(self, retry: int, reason: str, wait: float) -> None:
        """One warning per (retry, reason) and batch: concurrent requests fail alike."""
        with self._lock:
            if (retry, reason) in self._logged:
                return
            self._logged.add((retry, reason))
        log.warning(
            "openai backend: %s: %s; retry %d of %d in %.1f s", self.url, reason, retry, self.retries, wait
        )

    def _one(
        self, messages: list[dict[str, str]], sampling: SamplingConfig, prefill: str, seed: int | None
    ) -> tuple[str, list[int], list[float] | None]:
        reply = self._post(self._request_body(messages, sampling, prefill, seed))
        try:
            choice = reply["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise BackendError(f"openai backend: unexpected response shape: {str(reply)[:300]}") from exc
        server_logprobs, server_ids = None, None
        content = ((choice.get("logprobs") or {}) if isinstance(choice, dict) else {}).get("content")
        if content:
            server_logprobs = [float(item.get("logprob", 0.0)) for item in content]
            if self.return_token_ids:
                server_ids = _token_ids(content)
        ids: list[int] = []
        if server_ids is not None:
            ids = server_ids  # exact ids of the served model: no re-tokenisation drift
        elif self.tokenizer is not None and text:
            ids = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        # Keep the invariant len(logprobs) == len(ids): server tokens may differ from our re-tokenisation.
        logprobs = (
            server_logprobs if server_logprobs is not None and len(server_logprobs) == len(ids) else None
        )
        return text, ids, logprobs

    def generate_chat(
        self,
        conversations: list[list[dict[str, str]]],
        sampling: SamplingConfig,
        *,
        prefill: str = "",
        seed: int | None = None,
    ) -> list[tuple[str, list[int], list[float] | None]]:
        if not conversations:
            return []
        self._down, self._logged = None, set()
        seeds = [None if seed is None else seed + k for k in range(len(conversations))]
        workers = min(self.max_concurrency, len(conversations))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(self._one, m, sampling, prefill, s)
                for m, s in zip(conversations, seeds, strict=True)
            ]
            return [f.result() for f in futures]


def _connection_reason(exc: BaseException, timeout: float) -> str:
    """One line for a connection-level failure (refused, DNS, timeout, dropped connection)."""
    inner = getattr(exc, "reason", None) or exc
    if isinstance(inner, TimeoutError) or "timed out" in str(inner):
        return f"no answer within model.timeout={timeout:g} s"
    text = " ".join(str(inner).split())
    return text or type(inner).__name__


def _token_ids(content: list[dict[str, Any]]) -> list[int] | None:
    """Ids from vLLM's `return_tokens_as_token_ids` logprob entries ("token_id:123"), else None."""
    ids = []
    for item in content:
        token = str(item.get("token", ""))
        if not token.startswith("token_id:") or not token[9:].isdigit():
            return None
        ids.append(int(token[9:]))
    return ids
