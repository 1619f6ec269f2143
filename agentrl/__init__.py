"""agentrl: reinforcement-learning post-training of language-model agents on text games."""

__version__ = "0.1.0"
