"""The proxy's HTTP layer on a scripted backend (no model): errors, limits, API key, streams, OpenAPI."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from agent_gravity import ChatGravity, EngineError, EngineTimeoutError
from agent_gravity.bench.serve import serving as live_server
from agent_gravity.serve import create_app, run_server
from tests.serve._scripted_backend import ScriptedBackend

HELLO = {"model": "scripted", "messages": [{"role": "user", "content": "Tom has 3 apples and buys 5. How many?"}]}


def client(backend: ScriptedBackend | None = None, **options) -> httpx.AsyncClient:
    app = create_app(ChatGravity(backend=backend or ScriptedBackend()), **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy")


def events(text: str) -> list[dict | str]:
    """The data of each server-sent event: parsed JSON, or the literal ``[DONE]``."""
    data = [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


async def test_a_completion_has_the_answer_its_reasoning_usage_and_the_gravity_report():
    async with client() as http:
        body = (await http.post("/v1/chat/completions", json=HELLO)).json()
    assert body["object"] == "chat.completion" and body["model"] == "scripted"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "8", "reasoning_content": "Adding.",
                                 "tool_calls": None, "refusal": None}
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 25
    assert body["gravity"]["entropy"] == [0.5] * 25 and body["gravity"]["answer_complete"] is True


async def test_a_stream_opens_with_the_role_and_ends_with_gravity_usage_and_done(caplog):
    async with client() as http:
        response = await http.post("/v1/chat/completions",
                                   json={**HELLO, "stream": True, "stream_options": {"include_usage": True}})
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = events(response.text)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and chunks[-1] == "[DONE]"
    finishing, usage = chunks[-3], chunks[-2]
    assert finishing["choices"][0]["finish_reason"] == "stop" and finishing["gravity"]["entropy_mean"] == 0.5
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] > usage["usage"]["completion_tokens"] == 25
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks[:-2])
    reasoning = "".join(c["choices"][0]["delta"]["reasoning_content"] or "" for c in chunks[:-2])
    assert text.strip() == "8" and reasoning.strip() == "Adding."
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # the span's context closed in its own task


async def test_a_budget_cut_finishes_with_length():
    async with client() as http:
        body = (await http.post("/v1/chat/completions", json={**HELLO, "max_completion_tokens": 3})).json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(("change", "param", "says"), [
    ({"n": 2}, "n", "n=2 is not supported"),
    ({"logprobs": True}, "logprobs", "returns no log-probabilities"),
    ({"gravity": {"max_answer_tokens": 0}}, "gravity.max_answer_tokens", "positive number of tokens"),
    ({"gravity": {"polcy": {}}}, "gravity.polcy", "Extra inputs"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0", "robot"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.user.content", "'image_url' are not supported"),
    ({"functions": []}, "functions", "unsupported field 'functions'"),
    ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ({"tool_choice": "required"}, None, "tool_choice was passed without tools"),
    ({"messages": []}, "messages", "at least 1 item"),
])
async def test_requests_the_proxy_cannot_serve_get_400_naming_the_field(change, param, says):
    async with client() as http:
        response = await http.post("/v1/chat/completions", json={**HELLO, **change})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert says in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"


async def test_a_body_that_is_not_json_and_a_model_not_served_are_refused():
    async with client() as http:
        broken = await http.post("/v1/chat/completions", content=b"{", headers={"content-type": "application/json"})
        other = await http.post("/v1/chat/completions", json={**HELLO, "model": "gpt-4o"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert "serves 'scripted'" in other.json()["error"]["message"]


async def test_the_api_key_guards_v1_but_not_health():
    async with client(api_key="s3cret") as http:
        missing = await http.post("/v1/chat/completions", json=HELLO)
        wrong = await http.get("/v1/models", headers={"Authorization": "Bearer nope"})
        right = await http.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
        health = await http.get("/health")
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key" and missing.headers["www-authenticate"] == "Bearer"
    assert right.status_code == 200 and right.json()["data"][0]["id"] == "scripted"
    assert health.json() == {"status": "ok"}


async def test_bodies_over_the_limit_get_413_by_content_length_and_when_chunked():
    async def chunked():
        for _ in range(100):
            yield b" " * 100

    async with client(max_body_bytes=1000) as http:
        declared = await http.post("/v1/chat/completions", content=b" " * 1001,
                                   headers={"content-type": "application/json"})
        streamed = await http.post("/v1/chat/completions", content=chunked(),
                                   headers={"content-type": "application/json"})
        fits = await http.post("/v1/chat/completions", json=HELLO)
    assert "content-length" not in streamed.request.headers
    for response in (declared, streamed):
        assert response.status_code == 413 and "limit of 1000 bytes" in response.json()["error"]["message"]
    assert fits.status_code == 200


@pytest.mark.parametrize(("error", "status", "kind"), [
    (EngineError("the engine died"), 502, "upstream_error"),
    (httpx.ConnectError("connection refused"), 502, "upstream_error"),
    (EngineTimeoutError.after(1.0), 504, "timeout_error"),
])
async def test_backend_failures_are_502_or_504_and_end_a_stream_with_an_error_event(error, status, kind):
    async with client(ScriptedBackend(error=error)) as http:
        plain = await http.post("/v1/chat/completions", json=HELLO)
        streamed = await http.post("/v1/chat/completions", json={**HELLO, "stream": True})
    assert plain.status_code == status and plain.json()["error"]["type"] == kind
    assert str(error) in plain.json()["error"]["message"]
    last = events(streamed.text)[-1]
    assert streamed.status_code == 200 and last["error"]["type"] == kind  # no [DONE] after an error


async def _assert_closed_within_a_second(backend: ScriptedBackend, left: float) -> None:
    """The backend's generation was closed within a second of the client leaving at ``left``."""
    for _ in range(100):
        if backend.closed_early_at is not None:
            break
        await asyncio.sleep(0.02)
    assert backend.closed_early_at is not None and backend.closed_early_at - left < 1.0


async def test_a_client_that_leaves_mid_stream_closes_the_backend_stream_at_once():
    backend = ScriptedBackend(endless=True, delay=0.01)
    with live_server(create_app(ChatGravity(backend=backend))) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            async with http.stream("POST", "/v1/chat/completions", json={**HELLO, "stream": True}) as response:
                async for _ in response.aiter_lines():
                    break
            left = time.monotonic()
        await _assert_closed_within_a_second(backend, left)


async def test_a_client_that_gives_up_on_a_completion_cancels_its_generation():
    backend = ScriptedBackend(endless=True, delay=0.01)
    with live_server(create_app(ChatGravity(backend=backend))) as url:
        async with httpx.AsyncClient(base_url=url, timeout=0.3) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/chat/completions", json=HELLO)
            left = time.monotonic()
        await _assert_closed_within_a_second(backend, left)


async def test_the_openapi_description_documents_the_extensions_and_the_key():
    async with client(api_key="k") as http:
        doc = (await http.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    request = schemas["ChatCompletionRequest"]["properties"]
    assert request["gravity"]["anyOf"][0] == {"$ref": "#/components/schemas/GravityConfig"}
    assert {"task", "conversation_id"} <= set(request)
    assert "gravity" in schemas["ChatCompletion"]["properties"] and "entropy" in schemas["GravityReport"]["properties"]
    operation = doc["paths"]["/v1/chat/completions"]["post"]
    assert {"400", "401", "413", "502", "504"} <= set(operation["responses"]) and "422" not in operation["responses"]
    assert operation["security"] == [{"bearer": []}] and "security" not in doc["paths"]["/health"]["get"]


def test_a_public_host_needs_an_api_key_or_an_explicit_yes():
    with pytest.raises(ValueError, match="without an API key"):
        run_server(ChatGravity(backend=ScriptedBackend()), host="0.0.0.0")
