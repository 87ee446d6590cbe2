"""The signal: statistics of token distributions and of attention rows.

Triton kernels with a torch reference beside each; ``impl="auto"`` runs Triton on CUDA and the
reference elsewhere, ``impl="triton"``/``"torch"`` (or ``$AGENT_GRAVITY_KERNELS``) forces one.
"""

from agent_gravity.kernels.attention_entropy import attention_entropy
from agent_gravity.kernels.attention_entropy_ref import attention_entropy_reference
from agent_gravity.kernels.block_sparse_attention import block_sparse_attention
from agent_gravity.kernels.block_sparse_attention_ref import block_sparse_attention_reference
from agent_gravity.kernels.token_entropy import resolve_impl, token_entropy
from agent_gravity.kernels.token_entropy_ref import token_entropy_reference
from agent_gravity.kernels.token_stats import TokenStats

__all__ = [
    "TokenStats",
    "attention_entropy",
    "attention_entropy_reference",
    "block_sparse_attention",
    "block_sparse_attention_reference",
    "resolve_impl",
    "token_entropy",
    "token_entropy_reference",
]
