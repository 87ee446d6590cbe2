"""The gravity logits processor for vLLM's V1 interface: entropy and exits inside the engine."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from agent_gravity._steering import EXTRA_ARGS_KEY, Steering, SteeringSpec
from agent_gravity.backends._logits import apply_action
from agent_gravity.kernels import token_entropy

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class SteeringRegistry:
    """Hands Steering objects made by an in-process caller to the processor, keyed by spec key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, Steering] = {}

    def put(self, steering: Steering) -> None:
        with self._lock:
            self._items[steering.spec.key] = steering

    def pop(self, key: str) -> Steering | None:
        with self._lock:
            return self._items.pop(key, None)

    def get(self, key: str) -> Steering | None:
        with self._lock:
            return self._items.get(key)


REGISTRY = SteeringRegistry()


@dataclass
class _Row:
    steering: Steering
    output_ids: list[int]  # the engine's live list of this request's generated ids


def _spec_of(params: SamplingParams) -> SteeringSpec | None:
    data = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
    return None if data is None else SteeringSpec.from_dict(data)


class GravityLogitsProcessor(LogitsProcessor):
    """Computes the exact entropy of every sampled distribution and applies gravity decisions."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self._rows: dict[int, _Row] = {}

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        _spec_of(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # it forces and bans tokens

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._rows.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            spec = _spec_of(params)
            if spec is None:
                self._rows.pop(index, None)
                continue
            steering = REGISTRY.get(spec.key) or Steering(spec)
            self._rows[index] = _Row(steering, output_ids)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self._rows.pop(a, None), self._rows.pop(b, None)
            if row_a is not None:
                self._rows[b] = row_a
            if direction == MoveDirectionality.SWAP and row_b is not None:
                self._rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows:
            return logits
        indices = sorted(i for i in self._rows if i < logits.shape[0])
        rows = logits[indices]
        entropies, top_ids = token_entropy(rows).tolist(), rows.argmax(dim=-1).tolist()
        for index, entropy, top_id in zip(indices, entropies, top_ids):
            row = self._rows[index]
            apply_action(logits[index], row.steering.step(entropy, row.output_ids, top_id))
        return logits
