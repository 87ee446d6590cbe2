"""The gravity step both vLLM logits-processor interfaces share: one kernel call, one action per row."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import torch

from agent_gravity._steering import EXTRA_ARGS_KEY, Steering, SteeringSpec
from agent_gravity.backends._logits import apply_action
from agent_gravity.kernels import TokenStats, token_entropy


class SteeringRegistry:
    """Hands Steering objects made by an in-process caller to the engine, keyed by spec key."""

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


def spec_of(params) -> SteeringSpec | None:
    """The request's gravity settings from ``SamplingParams.extra_args``; ValueError when malformed.

    In-process callers pass a dict; over HTTP ``vllm_xargs`` values are flat, so the settings come as a JSON string.
    """
    data = (params.extra_args or {}).get(EXTRA_ARGS_KEY)
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid {EXTRA_ARGS_KEY} settings: not JSON ({exc})") from exc
    if data is not None and not isinstance(data, dict):
        raise ValueError(f"invalid {EXTRA_ARGS_KEY} settings: expected a JSON object, got {type(data).__name__}")
    return None if data is None else SteeringSpec.from_dict(data)


def steering_for(params) -> Steering | None:
    """The caller's own Steering for this request (in-process), or a fresh one; None without settings."""
    spec = spec_of(params)
    if spec is None:
        return None
    return REGISTRY.get(spec.key) or Steering(spec)


@dataclass
class Track:
    """A steered request: its state machine and its generated ids so far."""

    steering: Steering
    output_ids: list[int] = field(default_factory=list)


class SteeredRows:
    """Computes the stats of the steered rows in one kernel call and applies each row's action."""

    def __init__(self, max_rows: int, device: torch.device) -> None:
        self._device = device
        self._stats = TokenStats.empty(max_rows, device)

    def apply(self, logits: torch.Tensor, rows: list[int], tracks: list[Track]) -> None:
        if not rows:
            return
        if len(rows) > len(self._stats):
            self._stats = TokenStats.empty(2 * len(rows), self._device)
        index = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)
        stats = token_entropy(logits, rows=index, out=self._stats[: len(rows)])
        for row, track, entropy, varentropy, top_id in zip(rows, tracks, stats.entropy.tolist(),
                                                           stats.varentropy.tolist(), stats.top_id.tolist()):
            apply_action(logits[row], track.steering.step(entropy, track.output_ids, top_id, varentropy))


def refuse_speculative_decoding(vllm_config) -> None:
    """Gravity steers one sampled row per request; drafts would break that."""
    if vllm_config is not None and getattr(vllm_config, "speculative_config", None) is not None:
        raise ValueError("the agent-gravity logits processor does not support speculative decoding yet; "
                         "start the engine without a speculative config")
