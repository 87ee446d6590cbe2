"""Apply a steering Action to a row of logits, in place."""

from __future__ import annotations

import torch

from agent_gravity._steering import Action


def apply_action(row: torch.Tensor, action: Action) -> None:
    """Force, ban or merge token ids in one ``[vocab]`` logits row."""
    if action.force is not None:
        row.fill_(float("-inf"))
        row[action.force] = 0.0
        return
    if not action.ban:
        return
    banned = torch.tensor(action.ban, device=row.device)
    if action.merge_into is not None:
        ids = torch.cat([banned, torch.tensor([action.merge_into], device=row.device)])
        row[action.merge_into] = torch.logsumexp(row[ids], dim=0)
    row[banned] = float("-inf")
