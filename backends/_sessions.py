"""Conversation KV caches kept by a backend: found by id, bounded in number and bytes, least recently used evicted.

A client picks its conversation ids, so without a bound every new id would hold a cache until the process
dies. The store keeps at most ``max_sessions`` caches holding at most ``max_bytes`` together; past either,
the least recently used go (their memory is freed), and a conversation that comes back is told why its
cache is gone instead of finding a stale one.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from agent_gravity.backends._ragged_cache import RaggedCache

from agent_gravity._errors import SessionNotFoundError

_log = logging.getLogger(__name__)
REMEMBERED = 1024
"""Evicted ids remembered (ids only) so that a returning conversation hears why its cache went."""


@dataclass
class KVSession:
    """One conversation's KV cache and the token ids it holds, in order."""

    cache: RaggedCache
    ids: list[int]
    intact_until: int | None = None
    """Entries from here on are not all there (a turn's reasoning was dropped): reuse stops here."""
    trimmed_until: int = 0
    """Entries before this position were trimmed once already and are never trimmed again; a history that
    changes before it cannot reuse the cache (what it needs may be gone)."""

    def nbytes(self) -> int:
        """Bytes the cache's tensors really hold."""
        return self.cache.nbytes()


class SessionStore:
    """Sessions by conversation id, in order of last use; every lookup counts as a use."""

    def __init__(self, max_sessions: int, max_bytes: int) -> None:
        if max_sessions < 1 or max_bytes < 1:
            raise ValueError(f"max_sessions ({max_sessions}) and max_session_bytes ({max_bytes}) must be at least 1")
        self.max_sessions, self.max_bytes = max_sessions, max_bytes
        self._live: OrderedDict[str, KVSession] = OrderedDict()
        self._gone: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._live

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._live))

    def get(self, session_id: str) -> KVSession | None:
        """The session, now the most recently used; None if there is none."""
        session = self._live.get(session_id)
        if session is not None:
            self._live.move_to_end(session_id)
        return session

    def __getitem__(self, session_id: str) -> KVSession:
        session = self.get(session_id)
        if session is None:
            why = self.evicted(session_id)
            raise SessionNotFoundError(
                f"no KV session {session_id!r}: " + (f"it was evicted ({why})" if why else
                                                     "sessions are made by calls with that conversation id")
                + f"; {len(self._live)} session(s) held now")
        return session

    def __setitem__(self, session_id: str, session: KVSession) -> None:
        self._live[session_id] = session
        self._live.move_to_end(session_id)
        self._gone.pop(session_id, None)
        self.fit(keep=session_id)

    def pop(self, session_id: str, default: KVSession | None = None) -> KVSession | None:
        """Forget a session (its memory is freed once nothing else holds it)."""
        return self._live.pop(session_id, default)

    def __delitem__(self, session_id: str) -> None:
        self[session_id]  # noqa: B018 - raises SessionNotFoundError saying why it is not there
        del self._live[session_id]

    def evicted(self, session_id: str) -> str | None:
        """Why a session was evicted, if it was (among the last ``REMEMBERED`` evictions)."""
        return self._gone.get(session_id)

    def nbytes(self) -> int:
        """Bytes every session's cache holds."""
        return sum(s.nbytes() for s in self._live.values())

    def fit(self, keep: str | None = None) -> list[str]:
        """Evict the least recently used sessions, never ``keep``, until both bounds hold; the evicted ids."""
        evicted: list[str] = []
        held = self.nbytes()
        for session_id in list(self._live):
            over_count = len(self._live) > self.max_sessions
            if not over_count and held <= self.max_bytes:
                break
            if session_id == keep:
                continue
            held -= self._live.pop(session_id).nbytes()
            why = (f"the least recently used of more than max_sessions={self.max_sessions}" if over_count else
                   f"the least recently used while sessions held more than max_session_bytes={self.max_bytes}")
            self._gone[session_id] = why
            evicted.append(session_id)
        while len(self._gone) > REMEMBERED:
            self._gone.popitem(last=False)
        if evicted:
            _log.info("evicted %d KV session(s) to stay within max_sessions=%d and max_session_bytes=%d",
                      len(evicted), self.max_sessions, self.max_bytes)
        return evicted
