"""AstraFlow: decoupled reinforcement learning for LLM policies over a shared store."""

__version__ = "0.1.0"
