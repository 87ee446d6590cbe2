"""The proxy's HTTP layer on a scripted backend (no model): errors, limits, API key, streams, OpenAPI."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from agent_gravity.backends._openai_wire import sse_data

from agent_gravity import ChatGravity, EngineError, EngineTimeoutError, UpstreamRejectedError
from agent_gravity._cli import main
from agent_gravity.bench.serve import serving as live_server
from agent_gravity.serve import create_app, run_server
from tests.serve._scripted_backend import ScriptedBackend

HELLO = {"model": "scripted", "messages": [{"role": "user", "content": "Tom has 3 apples and buys 5. How many?"}]}


def client(backend: ScriptedBackend | None = None, **options) -> httpx.AsyncClient:
    app = create_app(ChatGravity(backend=backend or ScriptedBackend()), **options)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy")


def events(text: str) -> list[dict | str]:
    """The data of each server-sent event: parsed JSON, or the literal ``[DONE]``."""
    data = [sse_data(line) for line in text.split("\n\n") if line.startswith("data: ")]
    return ["[DONE]" if d is None else d for d in data]


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
    ({"gravity": {"max_answer_tokens": 0}}, "gravity.max_answer_tokens", "got 0"),
    ({"gravity": {"max_answer_tokens": 1000}}, "gravity.max_answer_tokens", "may not exceed this server's 256"),
    ({"gravity": {"polcy": {}}}, "gravity.polcy", "not a setting clients may change on this server"),
    ({"gravity": {"policy": None}}, "gravity.policy", "its operator can allow more"),
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
    (EngineError("http://10.0.0.7:8001/v1 refused: /models/secret-llama"), 502, "upstream_error"),
    (UpstreamRejectedError("http://10.0.0.7:8001/v1 refused the request (HTTP 400): {'body': 1}"), 502,
     "upstream_error"),
    (httpx.ConnectError("connection to http://10.0.0.7:8001/v1 refused"), 502, "upstream_error"),
    (EngineTimeoutError.after(1.0), 504, "timeout_error"),
    (TypeError("unsupported operand in /srv/agent_gravity/_chat_model.py"), 500, "server_error"),
    (ValueError("internal state 10.0.0.7"), 500, "server_error"),
])
async def test_backend_failures_get_a_fixed_message_and_a_request_id_the_log_has_the_detail_under(
        error, status, kind, caplog):
    async with client(ScriptedBackend(error=error)) as http:
        plain = await http.post("/v1/chat/completions", json=HELLO)
        streamed = await http.post("/v1/chat/completions", json={**HELLO, "stream": True})
    body = plain.json()["error"]
    assert plain.status_code == status and body["type"] == kind
    assert body["request_id"] == plain.headers["x-request-id"] and body["request_id"] in body["message"]
    last = events(streamed.text)[-1]
    assert streamed.status_code == 200 and last["error"]["type"] == kind  # no [DONE] after an error
    assert last["error"]["request_id"] == streamed.headers["x-request-id"] != body["request_id"]
    for response, error_body in ((plain, body), (streamed, last["error"])):
        assert "10.0.0.7" not in response.text and "/srv/" not in response.text and "secret" not in response.text
        logged = [r.getMessage() for r in caplog.records if error_body["request_id"] in r.getMessage()]
        assert len(logged) == 1 and str(error) in logged[0]


async def test_a_bug_past_the_model_call_is_a_500_with_a_request_id_and_no_detail(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("bug in /srv/agent_gravity/serve/_wire.py")

    monkeypatch.setattr("agent_gravity.serve._app.completion", broken)
    app = create_app(ChatGravity(backend=ScriptedBackend()))
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)  # Starlette re-raises a bug after the 500
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
        response = await http.post("/v1/chat/completions", json=HELLO)
    error = response.json()["error"]
    assert response.status_code == 500 and error["code"] == "internal_error" and "/srv/" not in response.text
    assert error["request_id"] == response.headers["x-request-id"]
    assert any(error["request_id"] in r.getMessage() and r.exc_info for r in caplog.records)


async def test_every_response_carries_its_own_request_id():
    async with client(api_key="k") as http:
        ok = await http.post("/v1/chat/completions", json=HELLO, headers={"Authorization": "Bearer k"})
        refused = await http.post("/v1/chat/completions", json=HELLO)
        missing = await http.get("/nowhere")
        health = await http.get("/health")
    ids = [r.headers["x-request-id"] for r in (ok, refused, missing, health)]
    assert len(set(ids)) == 4 and all(i.startswith("req_") for i in ids)
    assert refused.json()["error"]["request_id"] == ids[1] and missing.json()["error"]["request_id"] == ids[2]


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


def test_an_empty_api_key_is_refused_everywhere(monkeypatch, capsys):
    model = ChatGravity(backend=ScriptedBackend())
    for empty in ("", "   "):
        with pytest.raises(ValueError, match="the API key is empty"):
            create_app(model, api_key=empty)
        with pytest.raises(ValueError, match="the API key is empty"):
            run_server(model, api_key=empty)
    monkeypatch.setenv("BLANK_KEY", "  ")
    assert main(["serve", "--api-key-env", "BLANK_KEY"]) == 2
    assert "the API key is empty" in capsys.readouterr().err


async def test_a_bearer_header_without_a_token_is_refused():
    async with client(api_key="k") as http:
        for header in ("Bearer ", "Bearer", "bearer  ", "k"):
            assert (await http.get("/v1/models", headers={"Authorization": header})).status_code == 401


async def test_the_operator_chooses_which_gravity_settings_clients_may_send():
    policy = {"gravity": {"policy": {"name": "window_mean", "window": 4, "threshold": 1.0}}}
    async with client(client_settings={"policy"}) as http:
        allowed = await http.post("/v1/chat/completions", json={**HELLO, **policy})
        refused = await http.post("/v1/chat/completions", json={**HELLO, "gravity": {"enabled": False}})
    assert allowed.status_code == 200
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "gravity.enabled"
    assert "send only policy" in refused.json()["error"]["message"]
    with pytest.raises(ValueError, match=r"\['polcy'\] are not GravityConfig fields"):
        create_app(ChatGravity(backend=ScriptedBackend()), client_settings={"policy", "polcy"})


def test_the_serve_command_takes_the_client_settings_and_the_limits(capsys):
    assert main(["serve", "--client-settings", "enabled,polcy"]) == 2
    assert "['polcy'] are not GravityConfig fields" in capsys.readouterr().err
    assert main(["serve", "--max-concurrency", "0"]) == 2
    assert "max_concurrency must be at least 1" in capsys.readouterr().err


async def test_chat_completions_past_the_concurrency_cap_get_503_with_retry_after():
    async with client(ScriptedBackend(delay=0.02), max_concurrency=1) as http:
        first = asyncio.ensure_future(http.post("/v1/chat/completions", json=HELLO))
        await asyncio.sleep(0.1)
        busy = await http.post("/v1/chat/completions", json=HELLO)
        models = await http.get("/v1/models")  # only chat completions count
        assert (await first).status_code == 200
        after = await http.post("/v1/chat/completions", json={**HELLO, "max_completion_tokens": 2})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "server_busy" and "limit of 1 chat completion" in busy.text
    assert models.status_code == 200 and after.status_code == 200


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_past_the_request_timeout_gets_504_and_its_generation_is_aborted(stream):
    backend = ScriptedBackend(endless=True, delay=0.01)
    async with client(backend, request_timeout=0.3) as http:
        response = await http.post("/v1/chat/completions", json={**HELLO, "stream": stream})
        ended = time.monotonic()
    error = events(response.text)[-1]["error"] if stream else response.json()["error"]
    assert response.status_code == (200 if stream else 504)
    assert error["type"] == "timeout_error" and error["code"] == "timeout"
    assert backend.closed_early_at is not None and ended - backend.closed_early_at < 1.0
