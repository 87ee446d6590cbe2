"""KV blocks read from vLLM's own engine: how many each request held, and how full the cache is.

vLLM frees a request's blocks inside the step that finishes it, before its output comes back, so
the count is taken as the scheduler's KV cache manager releases them (``free``, or
``pop_blocks_for_free`` when the release is deferred). Only an in-process engine can be read.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from agent_gravity.backends.base import KVBlockReport

_log = logging.getLogger(__name__)


@functools.cache
def _unreadable(what: str) -> None:
    _log.warning("KV block reports are off: this vLLM's engine no longer has what they read (%s), so "
                 "response_metadata['gravity']['kv_blocks'] stays None; the rest of gravity is unaffected", what)


class BlockLedger:
    """Counts the blocks each request of one in-process vLLM engine held when it released them."""

    def __init__(self, engine: Any) -> None:
        self._scheduler = engine.engine_core.engine_core.scheduler  # in-process only (multiprocessing off)
        self._manager = self._scheduler.kv_cache_manager
        self._held: dict[str, int] = {}
        self._watched: set[str] = set()
        for name in ("free", "pop_blocks_for_free"):
            setattr(self._manager, name, self._recording(getattr(self._manager, name)))

    def _recording(self, release: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def counted(request: Any) -> Any:
            ours = request.request_id.rsplit("-", 1)[0]  # vLLM appends 8 random characters to each request id
            if ours in self._watched:
                self._held[ours] = sum(map(len, self._manager.get_block_ids(request.request_id)))
            return release(request)
        return counted

    def watch(self, request_id: str) -> None:
        """Count this request's blocks when it releases them (probes and other side requests are not counted)."""
        self._watched.add(request_id)

    def report(self, request_id: str, cached_tokens: int | None) -> KVBlockReport | None:
        """What a finished request held, and the engine's cache as it stands now; None (said once in the log)
        when the engine's internals no longer have them."""
        try:
            pool = self._manager.block_pool
            total = pool.num_gpu_blocks - 1  # one null block is always taken
            return KVBlockReport(self._held.pop(request_id, 0), self._scheduler.block_size, cached_tokens or 0,
                                 total - pool.get_num_free_blocks(), total)
        except AttributeError as exc:
            _unreadable(str(exc))
            return None

    def forget(self, request_id: str) -> None:
        """Stop counting a request (it has been reported, or nobody will ask)."""
        self._watched.discard(request_id)
        self._held.pop(request_id, None)


def ledger_for(engine: Any) -> BlockLedger | None:
    """A ledger for an in-process engine; None (said once in the log) where its internals are not as expected."""
    try:
        return BlockLedger(engine)
    except AttributeError as exc:
        _unreadable(str(exc))
        return None
