"""Two OpenEnv environments written against openenv-core alone, for tests/test_openenv.py: count to a
target by adding 1 or 2 (integer action ids listed as `legal_actions`), and say a word back (free text,
no action list). `count_app` and `echo_app` are their servers (openenv's app factory)."""

from __future__ import annotations

from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app


class AddAction(Action):
    action_id: int


class CountObservation(Observation):
    total: int = 0
    target: int = 0
    legal_actions: list[int] = []


class CountGame(Environment[AddAction, CountObservation, State]):
    """Reach the target (3 + seed % 3) exactly: +1 then; past it -1."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.total, self.target = 0, 3 + (seed or 0) % 3
        return CountObservation(total=0, target=self.target, legal_actions=[1, 2])

    def step(self, action, timeout_s=None, **kwargs):
        self.total += action.action_id
        done = self.total >= self.target
        reward = (1.0 if self.total == self.target else -1.0) if done else 0.0
        return CountObservation(
            total=self.total, target=self.target, legal_actions=[1, 2], done=done, reward=reward
        )

    @property
    def state(self):
        return State(step_count=0)


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    prompt: str = ""


class EchoGame(Environment[EchoAction, EchoObservation, State]):
    """Say hello: reward 1, else 0; one step."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, **kwargs):
        return EchoObservation(prompt="Say: hello")

    def step(self, action, timeout_s=None, **kwargs):
        return EchoObservation(prompt="", done=True, reward=1.0 if action.message.strip() == "hello" else 0.0)

    @property
    def state(self):
        return State(step_count=0)


count_app = create_fastapi_app(CountGame, AddAction, CountObservation, max_concurrent_envs=8)
echo_app = create_fastapi_app(EchoGame, EchoAction, EchoObservation, max_concurrent_envs=8)
