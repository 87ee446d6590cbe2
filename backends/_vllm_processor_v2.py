"""The gravity logits processor for vLLM's Model Runner V2 (its default on GPUs).

Rows are reordered every step and map to recycled request slots; the adapter keeps each slot's
generated ids itself, from the position and the last token the runner fed the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor

from agent_gravity.backends import _steered_rows as steered

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState


class GravityLogitsProcessorV2(LogitsProcessor):
    """Exact per-token entropy and in-engine gravity exits; rows map to slots through ``ctx``."""

    def __init__(self, vllm_config: VllmConfig | None, req_states: LogitsProcRequestState) -> None:
        steered.refuse_speculative_decoding(vllm_config)
        self._prompt_len = req_states.prompt_len
        self._token_ids = req_states.all_token_ids
        self._tracks: dict[int, steered.Track] = {}
        self._rows = steered.SteeredRows(req_states.max_num_reqs, req_states.device)

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        steered.spec_of(sampling_params)

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        steering = steered.steering_for(sampling_params)
        if steering is None:
            self._tracks.pop(req_idx, None)  # a recycled slot must not keep its old occupant
            return False
        self._tracks[req_idx] = steered.Track(steering)
        return True

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        if not self._tracks:
            return logits
        slots, positions, fed = (ctx.expanded_idx_mapping.tolist(), ctx.pos.tolist(), ctx.input_ids.tolist())
        rows, tracks = [], []
        for row, slot in enumerate(slots):
            track = self._tracks.get(slot)
            if track is None:
                continue
            prompt = int(self._prompt_len.np[slot])
            generated = positions[row] + 1 - prompt
            if generated == len(track.output_ids) + 1:  # the token sampled last step, now fed back
                track.output_ids.append(fed[row])
            elif generated > len(track.output_ids):  # resumed after preemption: read back what we missed
                missed = self._token_ids.gpu[slot, prompt + len(track.output_ids): prompt + generated]
                track.output_ids.extend(missed.tolist())
            rows.append(row)
            tracks.append(track)
        self._rows.apply(logits, rows, tracks)
        return logits
