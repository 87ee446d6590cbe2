"""The gravity logits processor for vLLM's V1 interface (the CPU runner, and where V1 is forced)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from agent_gravity.backends import _steered_rows as steered

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class GravityLogitsProcessor(LogitsProcessor):
    """Exact per-token entropy and in-engine gravity exits; rows are persistent-batch indices."""

    def __init__(self, vllm_config: VllmConfig | None, device: torch.device, is_pin_memory: bool) -> None:
        steered.refuse_speculative_decoding(vllm_config)
        max_rows = vllm_config.scheduler_config.max_num_seqs if vllm_config is not None else 256
        self._tracks: dict[int, steered.Track] = {}
        self._rows = steered.SteeredRows(max_rows, device)

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        steered.spec_of(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False  # it forces and bans tokens

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._tracks.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            steering = steered.steering_for(params)
            if steering is None:
                self._tracks.pop(index, None)
            else:  # output_ids is the engine's live list of this request's generated ids
                self._tracks[index] = steered.Track(steering, output_ids)
        for a, b, direction in batch_update.moved:
            track_a, track_b = self._tracks.pop(a, None), self._tracks.pop(b, None)
            if track_a is not None:
                self._tracks[b] = track_a
            if direction == MoveDirectionality.SWAP and track_b is not None:
                self._tracks[a] = track_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self._tracks:
            rows = sorted(i for i in self._tracks if i < logits.shape[0])
            self._rows.apply(logits, rows, [self._tracks[i] for i in rows])
        return logits
