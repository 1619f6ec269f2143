"""agentrl: reinforcement-learning post-training of language-model agents on text games.

Importing the package registers the gymnasium ids (`gymnasium.make("agentrl/FrozenLake-v0")`, ...), as
`import ale_py` does for Atari. The envs package imports only gymnasium and numpy, so this stays light:
torch and transformers load only when a trainer, a model or an LLM agent needs them.
"""

import agentrl.envs  # noqa: F401  (registers the gymnasium ids)

__version__ = "0.1.0"
