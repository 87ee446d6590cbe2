"""The OpenAI completions wire format as the OpenAI-compatible backend speaks it: pure functions, no I/O."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_gravity._errors import EngineError
from agent_gravity._probe import line_confidence
from agent_gravity._steering import EXTRA_ARGS_KEY, SteeringSpec
from agent_gravity.backends.base import SamplingSettings

_TOKEN_ID = "token_id:"


@dataclass(frozen=True)
class TokenStep:
    """One generated token, with the server's top log-probabilities of the distribution it came from."""

    token_id: int
    top: dict[int, float]


@dataclass(frozen=True)
class Chunk:
    """One streamed completion event."""

    response_id: str
    steps: list[TokenStep]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None


def completion_body(model: str, prompt_ids: Sequence[int], sampling: SamplingSettings, max_tokens: int,
                    top_logprobs: int, spec: SteeringSpec | None) -> dict[str, Any]:
    """A streaming ``/v1/completions`` request for a prompt given as token ids.

    ``spec`` goes to the engine as ``vllm_xargs`` (a JSON string: xargs values are flat); None sends no
    gravity settings, and the server steers nothing.
    """
    body: dict[str, Any] = {
        "model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens, "stream": True,
        "temperature": sampling.temperature, "top_p": sampling.top_p,
        "logprobs": top_logprobs, "return_tokens_as_token_ids": True, "return_token_ids": True,
        "skip_special_tokens": True,
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.structural_tag is not None:
        body["structured_outputs"] = {"structural_tag": sampling.structural_tag}
    elif sampling.json_schema is not None:
        body["structured_outputs"] = {"json": sampling.json_schema}
    if spec is not None:
        body["vllm_xargs"] = {EXTRA_ARGS_KEY: json.dumps(spec.to_dict())}
    return body


def probe_confidence(choice: dict[str, Any]) -> float | None:
    """The lowest probability among a probe completion's first-line tokens (``logprobs`` asked for); None
    when the server sent none."""
    logprobs = choice.get("logprobs") or {}
    tokens, values = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or []
    if not tokens or len(tokens) != len(values) or any(v is None for v in values):
        return None
    return line_confidence(tokens, [math.exp(v) for v in values])


def parse_chunk(event: dict[str, Any]) -> Chunk:
    """Read one ``text_completion`` stream event; EngineError when it lacks the token ids gravity needs."""
    if "error" in event:
        raise EngineError(f"the server failed mid-stream: {error_message(event)}")
    try:
        choice = event["choices"][0] if event.get("choices") else {}
        ids = choice.get("token_ids") or []
        tops = (choice.get("logprobs") or {}).get("top_logprobs") or []
        if ids and len(tops) != len(ids):
            raise EngineError("the server returned token ids without a top log-probability for each; it must "
                              "honour `logprobs` on /v1/completions (vLLM does)")
        steps = [TokenStep(int(i), _top(top)) for i, top in zip(ids, tops)]
        return Chunk(str(event.get("id", "")), steps, str(choice.get("text", "")), choice.get("finish_reason"),
                     choice.get("stop_reason"))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise EngineError(f"the server sent a completion event this backend cannot read ({exc!r}): "
                          f"{json.dumps(event)[:300]}") from exc


def _top(top: dict[str, float] | None) -> dict[int, float]:
    if not top:
        raise EngineError("the server returned a token without its top log-probabilities")
    out = {}
    for key, logprob in top.items():
        if not key.startswith(_TOKEN_ID):
            raise EngineError(f"the server named a token {key!r} by its text, not its id; it must honour "
                              "`return_tokens_as_token_ids` (vLLM does)")
        out[int(key[len(_TOKEN_ID):])] = float(logprob)
    return out


def sse_data(line: str) -> dict[str, Any] | None:
    """The JSON payload of one server-sent-events line; None for blank lines, comments and ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]" or not data:
        return None
    return json.loads(data)


def error_message(body: Any) -> str:
    """The human message of an OpenAI-style error body (or the body itself)."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in body:
            return str(body["message"])
    return str(body)[:500]
