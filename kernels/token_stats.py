"""Per-row statistics of a next-token distribution, and the buffers kernels write them into."""

from __future__ import annotations

from dataclasses import dataclass

import torch

N_PARTIALS = 7  # max, sum e^y, sum e^y*y, sum e^y*y^2, top-1 logit, top-2 logit, top-1 index


@dataclass(frozen=True)
class TokenStats:
    """Statistics per row, fp32 (``top_id`` int64). Slicing views of preallocated buffers."""

    entropy: torch.Tensor
    """Entropy of the softmax distribution, in nats."""
    varentropy: torch.Tensor
    """Variance of the surprisal ``-log p`` under the distribution, in nats squared."""
    top_prob: torch.Tensor
    """Probability of the most likely token."""
    margin: torch.Tensor
    """Probability of the most likely token minus that of the second."""
    top_id: torch.Tensor
    """Index of the most likely token."""
    workspace: torch.Tensor | None = None
    """Scratch for the Triton kernel's per-slice partial results; shared by every slice of these buffers."""

    @classmethod
    def empty(cls, rows: int, device: torch.device | str = "cpu", max_splits: int = 64) -> TokenStats:
        """Allocate buffers for ``rows`` rows (and the kernel's scratch); kernels write into views of them."""
        f = lambda: torch.empty(rows, dtype=torch.float32, device=device)  # noqa: E731
        scratch = torch.empty(rows * max_splits * N_PARTIALS, dtype=torch.float32, device=device)
        return cls(f(), f(), f(), f(), torch.empty(rows, dtype=torch.int64, device=device), scratch)

    def __getitem__(self, rows: slice) -> TokenStats:
        return TokenStats(self.entropy[rows], self.varentropy[rows], self.top_prob[rows], self.margin[rows],
                          self.top_id[rows], self.workspace)

    def __len__(self) -> int:
        return self.entropy.shape[0]
