"""History compaction for backends without session caches (vLLM): smaller prompts, prefix cache intact.

Converged reasoning is already never sent back (``reasoning_content`` stays out of later turns). Stale
tool outputs, all but the most recent ``keep_recent``, are collapsed to their facts: log lines whose
template (digits replaced) repeats are dropped and counted, rare lines stay word for word, so exact
values survive. The collapse is a pure function of the text, so a collapsed output reads the same in
every later turn and the engine's prefix cache keeps matching it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

_DIGITS = re.compile(r"\d+")


def collapse_tool_output(text: str, repeats: int = 3) -> str:
    """The output's rare lines, in order, with the repeated-template lines replaced by one count."""
    lines = text.split("\n")
    templates = Counter(_DIGITS.sub("#", line) for line in lines)
    kept = [line for line in lines if templates[_DIGITS.sub("#", line)] < repeats]
    dropped = len(lines) - len(kept)
    return "\n".join(kept) + (f"\n[{dropped} repeated log lines omitted]" if dropped else "")


def compact_history(chat: list[dict[str, Any]], keep_recent: int = 1, repeats: int = 3) -> list[dict[str, Any]]:
    """Chat dicts with every tool output but the last ``keep_recent`` collapsed to its facts."""
    tools = [i for i, m in enumerate(chat) if m["role"] == "tool"]
    stale = set(tools[:max(0, len(tools) - keep_recent)])
    return [{**m, "content": collapse_tool_output(m["content"], repeats)} if i in stale else m
            for i, m in enumerate(chat)]
