"""The signal: statistics of token distributions, Triton kernels with a torch reference beside each."""

from agent_gravity.kernels.token_entropy import resolve_impl, token_entropy
from agent_gravity.kernels.token_entropy_ref import token_entropy_reference
from agent_gravity.kernels.token_stats import TokenStats

__all__ = ["TokenStats", "resolve_impl", "token_entropy", "token_entropy_reference"]
