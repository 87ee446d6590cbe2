"""Hypothesis fuzzes the proxy's request model: every body is accepted or refused with a clear error, never a crash
or a hang; through the app, never a 500."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from starlette.testclient import TestClient

from agent_gravity import ChatGravity, GravityConfig
from agent_gravity.serve import create_app
from agent_gravity.serve._wire import (
    CLIENT_SETTINGS,
    ChatCompletionRequest,
    ErrorResponse,
    WireError,
    call_options,
    to_message,
)
from tests.serve._scripted_backend import ScriptedBackend

pytestmark = pytest.mark.timeout(120)  # a hang fails the test instead of the run

SERVER = GravityConfig()
EVERY_SETTING = frozenset(GravityConfig.model_fields)

leaves = (st.none() | st.booleans() | st.integers() | st.sampled_from([2**63, 10**400]) | st.floats()
          | st.text(max_size=12))
json_values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
"""Any JSON value, NaN, infinities and integers far past 64 bits included (Python's JSON reads them all)."""
texts = st.text(max_size=20) | st.lists(st.fixed_dictionaries(
    {"type": st.just("text"), "text": st.text(max_size=8)}), max_size=2)
calls = st.lists(st.fixed_dictionaries({"id": st.text(max_size=4), "type": st.just("function"), "function":
    st.fixed_dictionaries({"name": st.text(max_size=6), "arguments": st.just('{"a": 1}')})}), max_size=2)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user"]), "content": texts})
    | st.fixed_dictionaries({"role": st.just("assistant"), "content": texts | st.none()},
                            optional={"tool_calls": calls, "reasoning_content": st.text(max_size=8)})
    | st.fixed_dictionaries({"role": st.just("tool"), "content": texts, "tool_call_id": st.text(max_size=4)}),
    min_size=1, max_size=3)
"""Well-formed messages of each role."""
odd_messages = st.lists(messages | st.fixed_dictionaries(
    {"role": st.sampled_from(["function", "robot", "user", "assistant", "tool"]), "content": json_values},
    optional={"tool_calls": json_values, "tool_call_id": json_values, "name": json_values}) | st.just(
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}) | st.just(
    {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "[1]"}}]}), max_size=3)
"""Messages the proxy refuses among well-formed ones, and none at all."""
schemas = (st.just({"type": "object", "properties": {"n": {"type": "integer"}}})
           | st.just({"type": "string", "pattern": "(?=a)"}) | st.just({"type": "object"}) | json_values)
tools = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "get_weather", "bad name!"])}, optional={"parameters": schemas})}), max_size=2)
gravity = st.dictionaries(st.sampled_from(sorted(EVERY_SETTING)) | st.text(max_size=8),
                          st.integers(-2, 10**6) | st.booleans() | json_values, max_size=3)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from(["scripted", None]), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1),
    "seed": st.integers(-(2**63), 2**63 - 1), "max_tokens": st.integers(1, 10**20),
    "max_completion_tokens": st.integers(1, 10**20), "stop": st.text(max_size=4) | st.lists(st.text(max_size=4)),
    "n": st.sampled_from([1, None]), "stream": st.booleans(), "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans()}),
    "tools": tools, "tool_choice": st.sampled_from(["auto", "none", "required",
                                                    {"type": "function", "function": {"name": "f"}}]),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}])
    | st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
        {"name": st.text(max_size=4)}, optional={"schema": schemas})}),
    "logprobs": st.sampled_from([False, None]), "top_logprobs": st.none(),
    "frequency_penalty": st.sampled_from([0, 0.0]), "presence_penalty": st.sampled_from([0, None]),
    "user": st.text(max_size=4), "metadata": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
    "gravity": gravity, "task": st.text(max_size=8), "conversation_id": st.text(max_size=8),
}
"""Each request field with values of its type, mostly ones the proxy takes."""
ODD: dict[str, st.SearchStrategy[Any]] = {
    "model": st.just("gpt-4o"), "temperature": st.sampled_from([-1.0, 2.5, float("nan"), float("inf")]),
    "top_p": st.sampled_from([0, 1.5, float("nan")]), "seed": st.sampled_from([2**63, -(2**63) - 1]),
    "max_tokens": st.integers(-2, 0), "n": st.sampled_from([0, 2]), "tool_choice": st.sampled_from(["any", True]),
    "response_format": st.just({"type": "json_schema"}), "logprobs": st.just(True), "top_logprobs": st.just(2),
    "frequency_penalty": st.just(0.5), "presence_penalty": st.just(-1.5), "functions": st.just([]),
}
"""Values of the right type that the proxy refuses, and a field OpenAI had that it does not take."""
requests = st.fixed_dictionaries({"messages": messages}, optional=FIELDS)
"""Bodies shaped like chat completion requests, with typical values."""
mangled = st.fixed_dictionaries({"messages": odd_messages | json_values}, optional={
    k: st.one_of(*(s[k] for s in (FIELDS, ODD) if k in s), json_values) for k in FIELDS.keys() | ODD.keys()})
"""Requests whose fields may hold values the proxy refuses, or any JSON value."""
bodies = requests | mangled | json_values


def _outcome(body: Any, allowed: frozenset[str]) -> str:
    """What the proxy makes of ``body`` before the model call: accepted, or refused with a message."""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        assert exc.errors() and all(error["msg"] for error in exc.errors())
        return "refused by the model"
    try:
        call_options(request, SERVER, allowed)
    except WireError as exc:
        assert str(exc) and (exc.param or "").startswith("gravity")
        return "refused by gravity"
    assert all(to_message(m).type for m in request.messages)
    return "accepted"


def test_every_body_is_accepted_or_refused_with_a_message():
    outcomes: Counter[str] = Counter()

    @given(bodies, st.sampled_from([CLIENT_SETTINGS, EVERY_SETTING]))
    @settings(max_examples=2000, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(body: Any, allowed: frozenset[str]) -> None:
        outcomes[_outcome(body, allowed)] += 1

    check()
    print(f"request model: {sum(outcomes.values())} examples, {dict(outcomes)}")
    assert len(outcomes) == 3  # the strategies reach every outcome


def test_the_app_answers_every_body_with_a_documented_status_never_a_500():
    statuses: Counter[int] = Counter()
    app = create_app(ChatGravity(backend=ScriptedBackend()), client_settings=EVERY_SETTING)

    with TestClient(app) as http:  # it re-raises what no handler answered, so no 500 goes unnoticed
        @given(requests | mangled)
        @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def check(body: dict[str, Any]) -> None:
            response = http.post("/v1/chat/completions", content=json.dumps(body, allow_nan=True),
                                 headers={"content-type": "application/json"})
            statuses[response.status_code] += 1
            assert response.status_code in (200, 400, 404) and response.headers["x-request-id"]
            if response.status_code != 200:
                error = ErrorResponse.model_validate(response.json()).error
                assert error.message and error.request_id == response.headers["x-request-id"]
            elif body.get("stream") is True:
                assert response.text.endswith("data: [DONE]\n\n")  # no error event after the stream began

        check()
    print(f"app: {sum(statuses.values())} examples, statuses {dict(statuses)}")
    assert statuses[200] and statuses[400]
