"""A Backend with no model: it writes a fixed reply one byte-token at a time, for tests of the HTTP layer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence

from agent_gravity.backends.base import GenerationDelta, GenerationRequest, GenerationResult, StreamItem


class ScriptedBackend:
    """Replies ``reply`` (cut at ``max_tokens``), or ``endless`` text; records whether a stream was closed
    before it finished. ``error`` is raised after the first token."""

    provider = "scripted"
    model_name = "scripted"
    max_context = 4096
    eos_ids = (0,)
    token_texts = [bytes([i]).decode("latin-1") for i in range(256)]

    def __init__(self, reply: str = "Adding.</think>\nAnswer: 8", *, endless: bool = False, delay: float = 0.0,
                 error: Exception | None = None) -> None:
        self.reply, self.endless, self.delay, self.error = reply, endless, delay, error
        self.closed_early_at: float | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(token_ids).decode(errors="replace")

    def render(self, messages: Sequence[dict[str, str]], prefill: str = "") -> list[int]:
        return self.encode(json.dumps(list(messages)) + prefill)

    def _tokens(self, request: GenerationRequest) -> Iterator[int]:
        if self.endless:
            while True:
                yield from self.encode("and more ")
        yield from self.encode(self.reply)[:request.sampling.max_tokens]

    def _result(self, request: GenerationRequest, ids: list[int]) -> GenerationResult:
        reason = "length" if len(ids) >= request.sampling.max_tokens else "stop"
        return GenerationResult("scripted-1", ids, self.decode(ids), reason, len(request.prompt_ids),
                                [0.5] * len(ids))

    def stream(self, request: GenerationRequest) -> Iterator[StreamItem]:
        ids = list(self._tokens(request))
        yield GenerationDelta(ids, self.decode(ids), [0.5] * len(ids))
        yield self._result(request, ids)

    async def astream(self, request: GenerationRequest) -> AsyncIterator[StreamItem]:
        ids: list[int] = []
        finished = False
        try:
            for token in self._tokens(request):
                await asyncio.sleep(self.delay)
                if self.error is not None and ids:
                    raise self.error
                ids.append(token)
                yield GenerationDelta([token], self.decode([token]), [0.5])
            finished = True
            yield self._result(request, ids)
        finally:
            if not finished:  # closed or cancelled mid-generation: a real backend aborts its request here
                self.closed_early_at = time.monotonic()
