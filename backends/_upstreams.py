"""Several servers behind one backend: each request goes to the one with the fewest requests in flight."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from agent_gravity._errors import EngineError


@dataclass
class Upstream:
    """One server and what this process knows of it."""

    url: str
    in_flight: int = 0
    sent: int = 0
    """Requests sent to it, retries and continuations included."""
    down_until: float = 0.0


class UpstreamPool:
    """Spreads requests over servers; one that failed sits out ``cooldown`` seconds unless all have failed."""

    def __init__(self, urls: list[str], cooldown: float = 5.0) -> None:
        self.upstreams = [Upstream(url) for url in urls]
        self._cooldown = cooldown
        self._lock = threading.Lock()
        self._turn = itertools.count()

    def acquire(self) -> Upstream:
        """The least busy server that is not sitting out (round robin among equals); it counts one more."""
        with self._lock:
            now = time.monotonic()
            up = [u for u in self.upstreams if u.down_until <= now] or self.upstreams
            start = next(self._turn) % len(up)
            chosen = min(up[start:] + up[:start], key=lambda u: u.in_flight)
            chosen.in_flight += 1
            chosen.sent += 1
            return chosen

    def release(self, upstream: Upstream, failed: bool = False) -> None:
        with self._lock:
            upstream.in_flight -= 1
            if failed:
                upstream.down_until = time.monotonic() + self._cooldown


def joined(url: str, path: str) -> str:
    """``url`` (a base URL, with or without ``/v1``) joined to an API path such as ``/v1/completions``."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return base + path


def check_url(url: str) -> str:
    """Refuse a base URL that is not http(s)://host[:port][/path]."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise EngineError(f"base_url {url!r} is not a URL ({exc}); give e.g. http://127.0.0.1:8000/v1") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise EngineError(f"base_url {url!r} needs an http:// or https:// scheme and a host, "
                          "e.g. http://127.0.0.1:8000/v1")
    return url
