"""Upper bounds on every size a request's settings can carry: what a real model needs, and no more.

A client sends gravity settings (a proxy body, ``vllm_xargs`` on a plugin server), and each size in them
allocates memory or work per token. Every numeric setting is checked against these bounds, so a request
asking for a billion-token loop period is refused with an error naming the field instead of taking the server.
"""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 131_072
"""Token counts and budgets: the longest context of the models served."""
MAX_WINDOW = 4_096
"""Tokens a policy keeps in memory and revisits on every step."""
MAX_PERIOD = 512
"""Loop periods: each generated token compares this many earlier ones."""
MAX_REPEATS = 16
MAX_PROBES = 64
"""Probes per call (each is a short request of its own)."""
MAX_PROBE_TOKENS = 256
MAX_DRAFT = 64
"""Tokens drafted at once (each is a position of the next forward pass)."""
MAX_LAYERS = 1_024
"""Decoder layers a skip list may name."""
MAX_POOL = 64
"""Pooling width over attention scores (KV trimming)."""
MAX_CHUNK = 8192
"""Tokens re-read per pass when a trim scores entries by context reconstruction."""
MAX_POLICIES = 16
"""Policies in one composed spec, nested ones included."""
MAX_NATS = 64.0
"""Entropy thresholds: no distribution over a real vocabulary comes near it (log 262144 is 12.5 nats)."""
MAX_IDS = 262_144
"""Token ids in one list (the largest vocabularies served)."""
MAX_MARKER_IDS = 64
"""Token ids in one marker (end of reasoning, answer prefix, end of sequence)."""
MAX_TEXT = 256
"""Characters of a reasoning marker or a task name."""


def bounded(name: str, value: Any, low: float, high: float, *, above: bool = False) -> None:
    """Raise ValueError unless ``low <= value <= high`` (``low < value`` when ``above``) for a number, not a bool;
    the message names the field and the range."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and (low < value if above else low <= value) and value <= high):
        span = f"above {low:g} and at most {high:g}" if above else f"from {low:g} to {high:g}"
        raise ValueError(f"{name} must be a number {span}, got {value!r}")


def limit_policies(spec: Any) -> None:
    """Raise ValueError when a (possibly composed) policy spec holds more than ``MAX_POLICIES`` policies."""
    seen, todo = 0, [spec]
    while todo:
        node = todo.pop()
        seen += 1
        if seen > MAX_POLICIES:
            raise ValueError(f"a policy spec may hold at most {MAX_POLICIES} policies, nested ones included")
        children = node.get("policies") if isinstance(node, dict) else None
        if isinstance(children, list):
            todo.extend(children[:MAX_POLICIES + 1])
