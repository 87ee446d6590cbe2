"""``token_entropy``: statistics of each next-token distribution, Triton on CUDA, torch elsewhere."""

from __future__ import annotations

import os
from typing import Literal

import torch

from agent_gravity.kernels.token_entropy_ref import token_entropy_reference
from agent_gravity.kernels.token_stats import TokenStats

Impl = Literal["auto", "triton", "torch"]
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def resolve_impl(impl: Impl, device: torch.device) -> Literal["triton", "torch"]:
    """Pick the implementation: ``auto`` (or ``$AGENT_GRAVITY_KERNELS``) means Triton on CUDA."""
    if impl == "auto":
        impl = os.environ.get("AGENT_GRAVITY_KERNELS", "auto")  # type: ignore[assignment]
    if impl == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if impl == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the Triton kernels run on CUDA tensors, or on the CPU with TRITON_INTERPRET=1 set "
                           "before triton is imported; use impl='torch' here")
    if impl not in ("triton", "torch"):
        raise ValueError(f"unknown kernel implementation {impl!r}; use 'auto', 'triton' or 'torch'")
    return impl


def token_entropy(logits: torch.Tensor, rows: torch.Tensor | None = None, out: TokenStats | None = None,
                  impl: Impl = "auto") -> TokenStats:
    """Entropy (nats), varentropy, top-1 probability, top-1 minus top-2 margin and top-1 id per row.

    ``logits`` is ``[rows, vocab]`` in fp32, fp16 or bf16; ``-inf`` entries are masked out and each
    row needs at least one finite entry. ``rows`` picks which rows to read (no copy is made);
    ``out`` receives the results, so a caller that keeps one allocates nothing per call.
    """
    if logits.dim() != 2:
        raise ValueError(f"token_entropy expects [rows, vocab] logits, got shape {tuple(logits.shape)}")
    if logits.dtype not in _DTYPES:
        raise ValueError(f"token_entropy takes fp32, fp16 or bf16 logits, got {logits.dtype}")
    if resolve_impl(impl, logits.device) == "torch":
        return token_entropy_reference(logits, rows, out)
    from agent_gravity.kernels.token_entropy_triton import token_entropy_triton

    return token_entropy_triton(logits, rows, out)
