"""The session store's bounds: count and bytes, least recently used first, and why a session is gone."""

from dataclasses import dataclass

import pytest
from agent_gravity.backends._sessions import REMEMBERED, KVSession, SessionStore

from agent_gravity import SessionNotFoundError


@dataclass
class _Cache:
    size: int

    def nbytes(self) -> int:
        return self.size


def _session(size: int = 10) -> KVSession:
    return KVSession(_Cache(size), [])  # type: ignore[arg-type]


def test_past_max_sessions_the_least_recently_used_goes():
    store = SessionStore(max_sessions=2, max_bytes=10**9)
    store["a"], store["b"] = _session(), _session()
    assert store.get("a") is not None  # a lookup is a use
    store["c"] = _session()
    assert list(store) == ["a", "c"] and "max_sessions=2" in store.evicted("b")


def test_past_max_bytes_the_least_recently_used_go_but_never_the_one_in_use():
    store = SessionStore(max_sessions=10, max_bytes=25)
    for name in "abc":
        store[name] = _session(10)
    assert list(store) == ["b", "c"] and "max_session_bytes=25" in store.evicted("a")
    store["c"].cache.size = 100  # the conversation in use grew past the bound on its own
    assert store.fit(keep="c") == ["b"] and list(store) == ["c"]


def test_a_missing_session_says_why_without_listing_the_others():
    store = SessionStore(max_sessions=1, max_bytes=10**9)
    store["secret-one"], store["two"] = _session(), _session()
    with pytest.raises(SessionNotFoundError, match="'secret-one': it was evicted") as evicted:
        store["secret-one"]
    with pytest.raises(SessionNotFoundError, match="sessions are made by calls") as never:
        del store["never"]
    assert "two" not in str(evicted.value) + str(never.value)


def test_evicted_ids_are_remembered_up_to_a_bound():
    store = SessionStore(max_sessions=1, max_bytes=10**9)
    for i in range(REMEMBERED + 5):
        store[str(i)] = _session()
    assert store.evicted("0") is None and store.evicted(str(REMEMBERED)) is not None


def test_bounds_must_be_positive():
    with pytest.raises(ValueError, match="max_sessions"):
        SessionStore(max_sessions=0, max_bytes=1)
