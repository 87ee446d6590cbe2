"""The signal: entropy of token distributions, computed from full logits."""

from agent_gravity.kernels.token_entropy import token_entropy

__all__ = ["token_entropy"]
