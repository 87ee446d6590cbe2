"""Reasoning mode: scaffold a format the model follows, and split its output back apart."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agent_gravity._config import ReasoningFormat

_EXAMPLE_QUESTION = "Lisa has 4 pens and gets 3 more. How many pens does she have?"
_EXAMPLE_REASONING = "Lisa starts with 4 pens.\nShe gets 3 more, so 4 + 3 = 7.\n"
_EXAMPLE_ANSWER = " 7"


def scaffold(messages: Sequence[dict[str, str]], fmt: ReasoningFormat) -> tuple[list[dict[str, str]], str]:
    """Return the messages to render and the text to prefill for ``fmt``.

    A scaffolded format adds an instruction to the system message and one worked example
    before the conversation, because a small model follows a shown format far better
    than a described one.
    """
    out = [dict(m) for m in messages]
    if fmt.scaffold:
        instruction = (
            f"Think step by step between {fmt.start.strip()} and {fmt.end.strip()}, "
            f"then write the final answer after '{fmt.answer_prefix.strip()}'."
        )
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{instruction}"
        else:
            out.insert(0, {"role": "system", "content": instruction})
        example = fmt.start + _EXAMPLE_REASONING + fmt.end + fmt.answer_prefix + _EXAMPLE_ANSWER
        out[1:1] = [{"role": "user", "content": _EXAMPLE_QUESTION}, {"role": "assistant", "content": example}]
    return out, fmt.start if fmt.prefill_start else ""


def marker_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that could begin ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ReasoningSplitter:
    """Split streamed output text into reasoning and answer, holding back partial markers."""

    fmt: ReasoningFormat
    started_in_reasoning: bool = True
    _buffer: str = ""
    _state: str = field(init=False)

    def __post_init__(self) -> None:
        self._state = "reasoning" if self.started_in_reasoning else "answer"

    def feed(self, text: str) -> tuple[str, str]:
        """Take the next piece of output; return the (reasoning, answer) text it releases."""
        self._buffer += text
        reasoning, answer = "", ""
        if self._state == "reasoning":
            at = self._buffer.find(self.fmt.end)
            if at < 0:
                keep = marker_suffix(self._buffer, self.fmt.end)
                reasoning, self._buffer = self._buffer[: len(self._buffer) - keep], self._buffer[len(self._buffer) - keep:]
                return reasoning, ""
            reasoning, self._buffer = self._buffer[:at], self._buffer[at + len(self.fmt.end):]
            self._state = "prefix"
        if self._state == "prefix":
            prefix = self.fmt.answer_prefix
            if self._buffer.startswith(prefix):
                self._buffer = self._buffer[len(prefix):]
            elif prefix.startswith(self._buffer):
                return reasoning, ""
            self._state = "leading"
        if self._state == "leading":
            self._buffer = self._buffer.lstrip()
            if not self._buffer:
                return reasoning, ""
            self._state = "answer"
        answer, self._buffer = self._buffer, ""
        return reasoning, answer

    def close(self) -> tuple[str, str]:
        """Release what is still held back at the end of the output."""
        rest, self._buffer = self._buffer, ""
        if self._state == "reasoning":
            return rest, ""
        return "", rest.strip() if self._state != "answer" else rest


def split_reasoning(text: str, fmt: ReasoningFormat) -> tuple[str, str]:
    """Split a whole output into (reasoning, answer), stripped."""
    splitter = ReasoningSplitter(fmt)
    r1, a1 = splitter.feed(text)
    r2, a2 = splitter.close()
    return (r1 + r2).strip(), (a1 + a2).strip()
