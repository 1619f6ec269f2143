"""`agentrl serve`: an agentrl environment as an OpenEnv environment server (openenv-core).

Every client gets a WebSocket session (`/ws`) with an env of its own, built from the served config
(`env=<name>` and its `env.*` overrides); sessions never share state, and one that disconnects, even
mid-episode, is closed and its env with it. openenv-core's server speaks the protocol (reset, step,
state, its HTTP routes and schemas); this module is the environment behind it:

- reset(seed, episode_id, options): the env's reset with that seed (and reset options);
- step(AgentRLAction): `action` is one of the env's actions (a name or an index), which the env executes
  as it would in-process, also one that is not legal now (tic-tac-toe: an occupied cell loses); or the
  agent's whole answer in the answer format the served `agent.*` options set (`<action>NAME</action>` by
  default), read by agentrl's strict parser over the legal actions; for a free-text env (datascicoding)
  the text the env executes (the answer's tagged or fenced part when it has one). An answer that names
  no legal action is the agent interface's invalid action (`agent.invalid_rule`: by default the env's
  default action with `agent.invalid_penalty` added to the reward), never a server error;
- the observation: the text, the instructions, the valid actions and every action name, `done` (with
  terminated and truncated apart), `reward` (the env's reward plus an invalid answer's penalty) and
  `env_reward` (the env's own), success, the env's info, and `prompt`: the chat messages agentrl's LLM
  agent would be shown for the next step;
- state: the env's structured state with the episode's seed, steps and return.

The reward, the end and the state of an episode are the env's own, step for step: a client that sends
the in-process agent's actions sees the in-process episode (tests/test_openenv.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from agentrl.envs.openenv import AppThread, listening_socket, url_of, uvicorn_server
from agentrl.errors import AgentRLError, ConfigError
from agentrl.types import Decision, Step, StepContext

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
#: sessions served at once: a lockstep rollout opens one per episode it plays
DEFAULT_MAX_SESSIONS = 256
#: a session idle this long is closed (a client that vanished without closing its socket)
DEFAULT_IDLE_TIMEOUT_S = 600.0


def _openenv() -> Any:
    try:
        import openenv.core.env_server as server
    except ImportError as exc:
        raise ConfigError(
            f"agentrl serve needs openenv-core ({exc.name} is missing): pip install 'agentrl[openenv]'"
        ) from exc
    return server


@functools.cache
def wire_types() -> tuple[type, type, type]:
    """The served action, observation and state types (pydantic models on openenv's base types)."""
    from pydantic import Field

    server = _openenv()

    class AgentRLAction(server.Action):
        """One move: an action name, the agent's answer in the served answer format, or a free-text
        env's text."""

        action: str | int = Field(
            ...,
            description="one of the env's actions by name (left) or index, the agent's answer "
            "(<action>left</action>), or, for a free-text env, the text it executes",
        )

    class AgentRLObservation(server.Observation):
        """What the env shows after a reset or a step (`reward` and `done` are openenv's own fields)."""

        text: str = Field("", description="the observation text")
        instructions: str = Field("", description="the env's task text: rules, rewards, the actions")
        valid_actions: list[str] = Field(default_factory=list, description="the actions legal now")
        action_names: list[str] = Field(default_factory=list, description="every action, in index order")
        free_text: bool = Field(False, description="the env takes free text (code) as its action")
        prompt: list[dict[str, str]] = Field(
            default_factory=list, description="agentrl's chat messages for the next step (system, user)"
        )
        env_reward: float = Field(0.0, description="the env's own reward (reward adds an invalid penalty)")
        valid: bool = Field(True, description="whether the action given was legal now")
        played: str | None = Field(None, description="the action the env executed")
        terminated: bool = Field(False, description="the episode ended in the env (goal, loss, ...)")
        truncated: bool = Field(False, description="the episode was cut (max_steps, penalty_end)")
        success: bool = Field(False, description="the env's success flag (meaningful at the end)")
        max_steps: int | None = Field(None, description="the env's move cap")
        reset_options: list[str] = Field(default_factory=list, description="keys reset(options=...) takes")
        info: dict[str, Any] = Field(default_factory=dict, description="the env's info: state, success, ...")

    class AgentRLState(server.State):
        """The env's structured state and the episode's bookkeeping."""

        env: str = ""
        config: dict[str, Any] = Field(default_factory=dict)
        seed: int | None = None
        state: dict[str, Any] = Field(default_factory=dict)
        episode_return: float = 0.0
        done: bool = True

    return AgentRLAction, AgentRLObservation, AgentRLState


class EpisodeOver(AgentRLError):
    """A step without an episode in progress (before the first reset, or after the end)."""


@dataclass
class Served:
    """What every session of a server is built from: the env's constructor and config, and the agent
    interface that reads answers and writes prompts."""

    make_env: Callable[[], Any]
    env_name: str
    env_config: dict[str, Any]
    interface: Any  # agentrl.agents.interface.TextInterface
    description: str


def served_environment_class() -> type:
    """openenv's Environment for an agentrl env (built on first use: openenv is an optional extra)."""
    server = _openenv()
    Action, Observation, State = wire_types()

    class AgentRLEnvironment(server.Environment):
        """One session's env (module docstring)."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self, served: Served):
            super().__init__()
            self.served = served
            self.env = served.make_env()
            self._episode_id: str | None = None
            self._seed: int | None = None
            self._info: dict[str, Any] = {}
            self._observation = ""
            self._history: list[Step] = []
            self._return = 0.0
            self._done = True
            self._started = False  # a first reset happened: the env has a state to show
            self._rng = np.random.default_rng()

        def reset(
            self,
            seed: int | None = None,
            episode_id: str | None = None,
            options: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> Any:
            self._seed = None if seed is None else int(seed)
            self._episode_id = episode_id
            self._observation, self._info = self.env.reset(seed=self._seed, options=options or None)
            self._history, self._return, self._done, self._started = [], 0.0, False, True
            self._rng = np.random.default_rng(self._seed)
            return self._observe(reward=None, env_reward=0.0, decision=None, played=None)

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            if self._done:
                raise EpisodeOver("no episode in progress: reset first (the last one ended, or none began)")
            ctx = self._context()
            decision = self._decide(ctx, action.action)
            text = decision.text if self.env.free_text_action else None
            obs, env_reward, terminated, truncated, info = self.env.step(
                decision.action if text is None else text
            )
            played = (
                self.env.action_names[decision.action] if text is None else self.env.text_action_name(text)
            )
            reward = float(env_reward) + float(decision.penalty)
            self._history.append(
                Step(self._observation, decision.action, played, decision.valid, reward, float(env_reward))
            )
            self._return += reward
            truncated = bool(truncated) or (decision.end_episode and not terminated)
            self._observation, self._info = obs, info
            self._done = bool(terminated) or truncated
            return self._observe(reward, float(env_reward), decision, played, bool(terminated), truncated)

        def _context(self) -> StepContext:
            return StepContext(self.env, self._observation, self._info, self._history, self._rng, 0)

        def _decide(self, ctx: StepContext, answer: str | int) -> Decision:
            """What the env executes: one of its actions as sent (by name or index; the env handles one
            that is not legal now as it does in-process), else the action the agent's answer names (the
            interface's strict parser over the legal actions, and its invalid-action rule)."""
            interface, env = self.served.interface, self.env
            valid = list(
                self._info["valid_actions"] if "valid_actions" in self._info else env.valid_actions()
            )
            known = [name.lower() for name in env.action_names]
            if isinstance(answer, int) or (not env.free_text_action and answer.strip().lower() in known):
                index = answer if isinstance(answer, int) else known.index(answer.strip().lower())
                if not 0 <= index < len(known):
                    return (
                        interface.decide_text(ctx, None)
                        if env.free_text_action
                        else interface.decide(ctx, None)
                    )
                return Decision(action=index, valid=env.action_names[index] in valid or env.free_text_action)
            if env.free_text_action:
                extracted = interface.extract_text(answer)
                return Decision(action=env.default_action(), valid=True, text=extracted or answer)
            return interface.decide(ctx, interface.parse_answer(answer, valid)[0])

        def _observe(
            self,
            reward: float | None,
            env_reward: float,
            decision: Decision | None,
            played: str | None,
            terminated: bool = False,
            truncated: bool = False,
        ) -> Any:
            env, info = self.env, self._info
            success = bool(info.get("success", False))
            prompt = [] if self._done else self.served.interface.messages(self._context())
            return Observation(
                done=self._done,
                reward=reward,
                text=self._observation,
                instructions=env.instructions,
                valid_actions=list(info["valid_actions"] if "valid_actions" in info else env.valid_actions()),
                action_names=list(env.action_names),
                free_text=bool(env.free_text_action),
                prompt=prompt,
                env_reward=env_reward,
                valid=True if decision is None else bool(decision.valid),
                played=played,
                terminated=terminated,
                truncated=truncated,
                success=success,
                max_steps=getattr(env, "max_steps", None),
                reset_options=list(env.reset_option_names),
                info={k: v for k, v in info.items() if k != "valid_actions"},
            )

        @property
        def state(self) -> Any:
            state = self.env.state() if self._started else {}
            return State(
                episode_id=self._episode_id,
                step_count=len(self._history),
                env=self.served.env_name,
                config=self.served.env_config,
                seed=self._seed,
                state=state,
                episode_return=self._return,
                done=self._done,
            )

        def get_metadata(self) -> Any:
            from agentrl import __version__

            return server.EnvironmentMetadata(
                name=f"agentrl/{self.served.env_name}",
                description=self.served.description,
                version=__version__,
            )

        def close(self) -> None:
            self.env.close()

    return AgentRLEnvironment


def served_config(overrides: list[str]) -> tuple[DictConfig, Served]:
    """The served env and answer format from command-line overrides (`env=<name>`, `env.*`, `agent.*`),
    checked as a run's are, before anything listens."""
    from agentrl.agents.interface import TextInterface
    from agentrl.config import compose_config
    from agentrl.envs import ENV_SPECS, env_factory

    cfg = compose_config(["task=eval", *overrides])
    if cfg.env.name == "openenv":
        raise ConfigError(
            "agentrl serve serves agentrl's own envs; env=openenv is a client of another server"
        )
    if cfg.agent.name != "llm":
        raise ConfigError(
            f"agent={cfg.agent.name}: agentrl serve reads answers in the LLM agent's format (agent.* options "
            "of agent=llm); the client is the agent"
        )
    make_env = env_factory(cfg.env)  # a bad env option fails here, in one line
    env_config = OmegaConf.to_container(cfg.env, resolve=True)
    assert isinstance(env_config, dict)
    served = Served(
        make_env=make_env,
        env_name=str(cfg.env.name),
        env_config={str(k): v for k, v in env_config.items()},
        interface=TextInterface.from_cfg(cfg.agent),
        description=ENV_SPECS[str(cfg.env.name)].description,
    )
    return cfg, served


def build_app(
    served: Served,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
) -> tuple[Any, Any]:
    """(the FastAPI app, openenv's HTTPEnvServer behind it) for the served env."""
    from fastapi import FastAPI

    server = _openenv()
    Action, Observation, _ = wire_types()
    concurrency = server.ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=idle_timeout_s)
    http = server.HTTPEnvServer(
        functools.partial(served_environment_class(), served),
        Action,
        Observation,
        concurrency_config=concurrency,
    )
    app = FastAPI(title=f"agentrl {served.env_name} (OpenEnv)", description=served.description)
    http.register_routes(app)
    return QuietDisconnects(app), http


class QuietDisconnects:
    """The app, less the traceback a client that vanishes mid-session leaves: openenv closes that
    session (and its env) first, then its reply to the gone socket raises WebSocketDisconnect, which
    uvicorn would log as a server error."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            if scope.get("type") != "websocket":
                raise
            log.info("a client went away without closing its session; its env is closed")


def serve(
    overrides: list[str],
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
    ready: Callable[[str, str], None] | None = None,
) -> None:
    """Serve the env the overrides name until interrupted; `ready(url, env name)` is told where it
    listens."""
    if max_sessions < 1:
        raise ConfigError(f"--max-sessions {max_sessions}: must be >= 1")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: must be in [0, 65535] (0: a free port)")
    if idle_timeout_s is not None and idle_timeout_s <= 0:
        raise ConfigError(f"--idle-timeout {idle_timeout_s}: must be > 0 seconds (or 0: never)")
    _, served = served_config(overrides)
    app, _ = build_app(served, max_sessions, idle_timeout_s)
    sock = listening_socket(host, port)
    if ready is not None:
        ready(url_of(sock), served.env_name)
    try:
        uvicorn_server(app).run(sockets=[sock])
    finally:
        sock.close()


@contextlib.contextmanager
def serving(
    overrides: list[str],
    host: str = DEFAULT_HOST,
    port: int = 0,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
) -> Iterator[tuple[str, Any]]:
    """The server of `serve` on a thread of this process, for a notebook or a test: yields (its URL,
    openenv's HTTPEnvServer, e.g. for `active_sessions`); stops it on exit."""
    _, served = served_config(overrides)
    app, http = build_app(served, max_sessions, idle_timeout_s)
    running = AppThread(app, host, port)
    try:
        yield running.url, http
    finally:
        running.stop()
