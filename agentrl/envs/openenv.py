"""`env=openenv`: any OpenEnv environment server as a text env, and a served env as a TRL environment.

OpenEnv (openenv-core, `pip install agentrl[openenv]`) serves an environment over a WebSocket session
per client: `reset(seed=...)` and `step(action)` answer with an observation (a JSON object), a reward
and `done`. `OpenEnvEnv` plays such a server through openenv's own client, one session per env object,
and maps what it sends to the `TextEnv` contract. `env.url` names the server; `env.app`
(module:attribute) names an installed OpenEnv package's server app, or its Environment class, which
this process then serves itself on a loopback port (`app_url`). The mapping:

- the observation's text: `env.text_key`, else its `text` or `prompt` field, else every field as a
  `key: value` line (the action list left out);
- the valid actions: `env.actions_key`, else the first list field named `valid_actions`,
  `legal_actions`, `legal_moves`, `available_actions` or `actions`, else the enum of the action's field
  in the server's action schema. Their values (names or integers) are what `step` sends back, in the
  action's field (`env.action_key`, else `action` or the schema's one required field);
- no action list anywhere: the env takes free text (`free_text_action`), sent as the action's field;
- success: the observation's `env.success_key` (`success`) when it has one, else a positive last reward;
- `max_steps`: the server's own cap (an agentrl server says it) or `env.max_steps`, whichever is smaller.

An agentrl server (`agentrl serve`, agentrl/runs/serve.py) sends all of this in named fields (the text,
instructions, every action name in index order, the valid actions, terminated and truncated apart, the
env's own reward, its info), so the client env behaves as the env in-process does: the same
observations, valid actions, rewards and ends for the same seeds and actions.

`ToolEnv` is the other direction for TRL: a served env as an object for `GRPOTrainer(environment_factory=
...)`, whose `act` method is the model's tool and `get_reward` the episode's return.
"""

from __future__ import annotations

import importlib
import json
import logging
import random
import socket
import threading
import time
import typing
from typing import Any, ClassVar

import gymnasium as gym

from agentrl.envs.base import TextEnv
from agentrl.errors import ConfigError

log = logging.getLogger(__name__)

#: observation fields that hold the valid actions, in the order they are looked for
ACTION_LIST_KEYS = ("valid_actions", "legal_actions", "legal_moves", "available_actions", "actions")
#: observation fields that hold the text, in the order they are looked for
TEXT_KEYS = ("text", "prompt")
#: the fields an agentrl server's observations carry beside the text (runs/serve.py AgentRLObservation)
AGENTRL_KEYS = frozenset({"text", "instructions", "action_names", "valid_actions", "terminated", "truncated"})
#: the largest seed a client draws itself (agentrl's held-out eval seeds start at eval.seed_offset = 10**6)
TRAIN_SEED_LIMIT = 1_000_000


# ---- an OpenEnv server app on a thread of this process --------------------------------------------------
def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening socket (port 0: a free port the OS picks); a port in use is a one-line error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(128)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_server(app: Any) -> Any:
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))


class AppThread:
    """An ASGI app (an OpenEnv server) served by uvicorn on a daemon thread of this process."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 30.0):
        self.sock = listening_socket(host, port)
        self.url = url_of(self.sock)
        self.server = uvicorn_server(app)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"the OpenEnv server app did not start on {self.url}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


#: `env.app` -> its server, started on first use and kept for the process's life
_APPS: dict[str, AppThread] = {}
#: sessions an app built from an Environment class serves at once, when the class allows several
APP_SESSIONS = 256


def app_url(spec: str) -> str:
    """The loopback URL of the OpenEnv environment `module:attribute` names (`env.app`): an ASGI app (an
    OpenEnv package's `server.app:app`), or an openenv `Environment` subclass typed with its action and
    observation classes (`Environment[MyAction, MyObservation, MyState]`), served by openenv's own app."""
    if spec in _APPS:
        return _APPS[spec].url
    module, _, attribute = spec.partition(":")
    if not module or not attribute:
        raise ConfigError(f"env.app={spec}: give module:attribute, e.g. echo_env.server.app:app")
    try:
        target = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"env.app={spec}: {exc}") from exc
    app = target
    if isinstance(target, type):
        app = environment_app(spec, target)
    elif not callable(target):
        raise ConfigError(f"env.app={spec}: not an ASGI app or an OpenEnv Environment class")
    _APPS[spec] = AppThread(app)
    return _APPS[spec].url


def environment_app(spec: str, cls: type) -> Any:
    """openenv's server app for an `Environment` subclass, its action and observation classes read from
    its base `Environment[Action, Observation, State]`."""
    server = importlib.import_module("openenv.core.env_server")
    if not issubclass(cls, server.Environment):
        raise ConfigError(f"env.app={spec}: {cls.__name__} is not an openenv Environment")
    for base in getattr(cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if len(args) >= 2 and all(isinstance(a, type) for a in args[:2]):
            action, observation = args[:2]
            if issubclass(action, server.Action) and issubclass(observation, server.Observation):
                sessions = APP_SESSIONS if getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", False) else 1
                return server.create_fastapi_app(cls, action, observation, max_concurrent_envs=sessions)
    raise ConfigError(
        f"env.app={spec}: {cls.__name__} does not name its action and observation classes "
        "(Environment[MyAction, MyObservation, MyState]); give its server app instead (module:app)"
    )


def openenv_client(url: str, connect_timeout_s: float = 10.0, message_timeout_s: float = 60.0) -> Any:
    """openenv's synchronous WebSocket client of the server at `url` (one session), connected."""
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as exc:
        raise ConfigError(
            f"env=openenv needs openenv-core ({exc.name} is missing): pip install 'agentrl[openenv]'"
        ) from exc
    client = GenericEnvClient(
        base_url=url, connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s
    ).sync()
    try:
        client.connect()
    except ConnectionError as exc:
        client.close()
        raise ConfigError(f"cannot reach the OpenEnv server at {url}: {exc}") from exc
    return client


def action_schema(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The JSON schema of the server's actions (GET /schema), or {} when it has none to give."""
    import requests

    try:
        response = requests.get(url.rstrip("/") + "/schema", timeout=timeout_s)
        response.raise_for_status()
        return dict(response.json().get("action") or {})
    except (requests.RequestException, ValueError) as exc:
        log.debug("no action schema from %s: %s", url, exc)
        return {}


def _field_schema(schema: dict[str, Any], key: str) -> dict[str, Any]:
    """The schema of one action field, a `$ref` into `$defs` resolved (an enum of names lives there)."""
    prop = dict((schema.get("properties") or {}).get(key) or {})
    ref = prop.get("$ref") or next((s.get("$ref") for s in prop.get("allOf", []) if "$ref" in s), None)
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        prop = {**(schema.get("$defs") or {}).get(ref.rsplit("/", 1)[1], {}), **prop}
    return prop


def _action_field(schema: dict[str, Any], given: str | None) -> str:
    """The action's field the answer goes in: the one named, else `action`, else the schema's only
    required field (or its first field)."""
    if given:
        return given
    fields = [k for k in (schema.get("properties") or {}) if k != "metadata"]
    if "action" in fields or not fields:
        return "action"
    required = [k for k in schema.get("required", []) if k in fields]
    return required[0] if len(required) == 1 else fields[0]


class OpenEnvEnv(TextEnv):
    """A remote OpenEnv environment (module docstring). Each env object holds one WebSocket session,
    opened when it is built (a first reset there tells what the server sends) and closed by `close`."""

    name: ClassVar[str] = "openenv"

    def __init__(
        self,
        url: str | None = None,
        app: str | None = None,
        max_steps: int = 100,
        text_key: str | None = None,
        actions_key: str | None = None,
        action_key: str | None = None,
        instructions: str | None = None,
        success_key: str = "success",
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        render_mode: str | None = None,
    ):
        if bool(url) == bool(app):
            raise ConfigError(
                "env=openenv needs env.url=http://host:port, the address of an OpenEnv server (e.g. one "
                "started with: agentrl serve env=frozenlake --port 8000), or env.app=module:attribute, an "
                "OpenEnv server app or Environment class to run in this process; one of the two"
            )
        self.url = str(url) if url else app_url(str(app))
        self._text_key, self._actions_key, self._success_key = text_key, actions_key, success_key
        self._timeouts = (float(connect_timeout_s), float(message_timeout_s))
        self._client: Any = None
        self._done = True
        self._last: dict[str, Any] = {}
        self._valid: list[str] | None = None  # None: the server lists none (every action is valid)
        self._values: dict[str, Any] = {}  # action name -> the value the server takes for it
        schema = action_schema(self.url, self._timeouts[0])
        self._action_key = _action_field(schema, action_key)
        field = _field_schema(schema, self._action_key)
        self._int_actions = field.get("type") == "integer"
        self._schema_names = [str(v) for v in field.get("enum", [])]
        try:
            observation = self._layout(field)
        except Exception:
            self.close()
            raise
        self._instructions = instructions if instructions is not None else observation.get("instructions")
        if self._instructions is None:
            self._instructions = self._metadata_description()
        served_cap = observation.get("max_steps") if self._agentrl else None
        self.max_steps = min(int(max_steps), int(served_cap)) if served_cap else int(max_steps)
        self.reset_option_names = tuple(observation.get("reset_options", ()))
        super().__init__(render_mode=render_mode)

    def _layout(self, field: dict[str, Any]) -> dict[str, Any]:
        """One reset tells what the server sends: the action names, free text or not (and an agentrl
        server's instructions and cap); returns its observation."""
        try:
            first = self._open().reset(seed=0)
        except RuntimeError as exc:  # the server's own error reply
            raise ConfigError(f"env=openenv: the server at {self.url} failed a reset: {exc}") from exc
        observation = dict(first.observation or {})
        self._agentrl = AGENTRL_KEYS <= set(observation)
        self.action_names = [str(n) for n in observation.get("action_names", [])] if self._agentrl else []
        self._learn_actions(observation)
        if not self.action_names:
            self.action_names = list(self._schema_names)
        self.free_text_action = bool(observation.get("free_text")) if self._agentrl else not self.action_names
        if self.free_text_action and not self.action_names:
            self.action_names = ["answer"]  # classic agents' index 0: the empty answer (TextEnv contract)
        if not self._int_actions and not self._string_field(field):
            raise ConfigError(
                f"env=openenv: the action field {self._action_key!r} of {self.url} takes "
                f"{field.get('type', 'an object')}, not an action name; name another with env.action_key"
            )
        return observation

    @staticmethod
    def _string_field(field: dict[str, Any]) -> bool:
        kinds = {field.get("type")} | {s.get("type") for s in field.get("anyOf", [])}
        return "string" in kinds or "enum" in field or not field

    def _open(self) -> Any:
        if self._client is None:
            self._client = openenv_client(self.url, *self._timeouts)
        return self._client

    def _metadata_description(self) -> str:
        import requests

        try:
            response = requests.get(self.url.rstrip("/") + "/metadata", timeout=self._timeouts[0])
            response.raise_for_status()
            return str(response.json().get("description") or "")
        except (requests.RequestException, ValueError):
            return ""

    # ---- what the server sends, as the TextEnv contract ---------------------------------------------
    def _learn_actions(self, observation: dict[str, Any]) -> None:
        """The valid actions now (names, and the values to send for them); new names join action_names
        at the end, so an action's index never changes within the env's life."""
        key = self._actions_key or next(
            (k for k in ACTION_LIST_KEYS if isinstance(observation.get(k), list)), None
        )
        values = observation.get(key) if key else None
        if not isinstance(values, list):
            self._valid = list(self._schema_names) or None
            self._values.update({n: n for n in self._schema_names})
            return
        self._valid = [str(v) for v in values]
        for value in values:
            name = str(value)
            self._values[name] = int(value) if self._int_actions else value
            if name not in self.action_names:
                self.action_names.append(name)

    def _text(self, observation: dict[str, Any]) -> str:
        key = self._text_key or next((k for k in TEXT_KEYS if isinstance(observation.get(k), str)), None)
        if key is not None:
            return str(observation.get(key, ""))
        skip = {self._actions_key, *ACTION_LIST_KEYS}
        lines = [
            f"{k}: {v if isinstance(v, str) else json.dumps(v)}"
            for k, v in observation.items()
            if k not in skip
        ]
        return "\n".join(lines)

    def _info(self, success: bool) -> dict[str, Any]:
        info = {k: v for k, v in (self._last.get("info") or {}).items()} if self._agentrl else {}
        info.update({"valid_actions": self.valid_actions(), "state": self.state(), "success": bool(success)})
        return info

    @property
    def instructions(self) -> str:
        return str(self._instructions or "")

    def render_text(self) -> str:
        return self._text(self._last)

    def state(self) -> dict[str, Any]:
        if self._agentrl:
            return dict((self._last.get("info") or {}).get("state") or {})
        return dict(self._last)

    def valid_actions(self) -> list[str]:
        return list(self._valid) if self._valid is not None else list(self.action_names)

    def numeric_space(self) -> Any:
        raise ConfigError("env=openenv has no numeric view of its observations (algo=dqn needs one)")

    def numeric_observation(self) -> Any:
        return self.numeric_space()

    # ---- gymnasium API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        gym.Env.reset(self, seed=seed)
        kwargs: dict[str, Any] = {} if seed is None else {"seed": int(seed)}
        if options:
            kwargs["options"] = dict(options)
        result = self._open().reset(**kwargs)
        self._last = dict(result.observation or {})
        self._learn_actions(self._last)
        self.steps_taken, self._done = 0, bool(result.done)
        return self.render_text(), self._info(success=False)

    def step(self, action: int | str):
        if self._client is None or self._done:
            raise RuntimeError("env=openenv: step before reset, or after the episode ended")
        if isinstance(action, str) and self.free_text_action:
            value: Any = action
        else:
            name = self.action_names[self.action_index(action)]
            value = self._values.get(name, name) if not self.free_text_action else ""
        result = self._client.step({self._action_key: value})
        self._last = dict(result.observation or {})
        self._learn_actions(self._last)
        self.steps_taken += 1
        if self._agentrl:
            reward = float(self._last.get("env_reward", result.reward) or 0.0)
            terminated, truncated = bool(self._last["terminated"]), bool(self._last["truncated"])
        else:
            reward = float(result.reward or 0.0)
            terminated, truncated = bool(result.done), False
        truncated = truncated or (not terminated and self.steps_taken >= self.max_steps)
        self._done = terminated or truncated
        success = bool(self._last.get(self._success_key, False))
        if self._done and self._success_key not in self._last and not self._agentrl:
            success = reward > 0
        return self.render_text(), reward, terminated, truncated, self._info(success=success)

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.close()
            except Exception as exc:  # noqa: BLE001 - a server already gone: nothing left to close
                log.debug("closing the OpenEnv session of %s: %s", self.url, exc)
        self._done = True


class ToolEnv:
    """A served env (`agentrl serve`) as an environment of TRL's `GRPOTrainer(environment_factory=...)`:
    `reset` starts an episode and returns its first observation (instructions, observation and valid
    actions), the model plays it by calling the `act` tool, and `get_reward` is the episode's return.

        GRPOTrainer(..., environment_factory=functools.partial(ToolEnv, "http://127.0.0.1:8000"))

    Seeds: a `seed` column of the training dataset reaches `reset`; without one each episode draws a
    seed below TRAIN_SEED_LIMIT, so no training episode plays one of agentrl's held-out eval seeds. TRL
    keeps its environments (one session each) for the trainer's life; elsewhere `with ToolEnv(url) as
    env:` closes the session."""

    def __init__(self, url: str, connect_timeout_s: float = 10.0, message_timeout_s: float = 60.0):
        self.url = url
        self._client = openenv_client(url, connect_timeout_s, message_timeout_s)
        self._return, self._done = 0.0, True

    def reset(self, seed: int | None = None, **kwargs: Any) -> str:
        seed = int(seed) if seed is not None else random.randrange(TRAIN_SEED_LIMIT)
        result = self._client.reset(seed=seed)
        self._return, self._done = 0.0, bool(result.done)
        observation = dict(result.observation or {})
        return "\n\n".join(
            part for part in (observation.get("instructions", ""), self._describe(observation)) if part
        )

    def act(self, action: str) -> str:
        """Play one action in the environment.

        Args:
            action: The name of the action to play: one of the valid actions listed in the last observation.

        Returns:
            The action's reward, then the next observation and its valid actions, or how the episode ended.
        """
        if self._done:
            raise ValueError("The episode is over: no more actions can be played.")
        result = self._client.step({"action": str(action)})
        observation = dict(result.observation or {})
        reward = float(result.reward or 0.0)
        self._return += reward
        self._done = bool(result.done)
        head = f"Reward: {reward:g}."
        if not observation.get("valid", True):
            head += f" That was not a valid action: {observation.get('played')} was played instead."
        if self._done:
            outcome = "success" if observation.get("success") else "no success"
            return f"{head}\nThe episode is over ({outcome}), return {self._return:g}."
        return f"{head}\n\n{self._describe(observation)}"

    def get_reward(self) -> float:
        return self._return

    @staticmethod
    def _describe(observation: dict[str, Any]) -> str:
        actions = ", ".join(observation.get("valid_actions") or [])
        text = str(observation.get("text", "")).rstrip()
        return f"Observation:\n{text}\n\nValid actions: {actions}" if actions else f"Observation:\n{text}"

    # TRL makes every public method but reset and get_reward a tool: closing is the context manager's
    def __enter__(self) -> ToolEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()
