"""The proxy on the embedded model and the real vLLM engine, through httpx and the official openai client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from agent_gravity.bench.serve import serving as live_server
from agent_gravity.serve import create_app
from tests.serve.test_app import events

pytestmark = pytest.mark.engine

MODEL = "SmolLM2-135M-Instruct"
QUESTION = {"model": MODEL, "max_completion_tokens": 48, "messages": [
    {"role": "user", "content": "Tom has 3 apples and buys 5 more. How many apples does he have?"}]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def app(chat):
    return create_app(chat, api_key="k")


@pytest.fixture
async def http(app):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://proxy",
                                 headers={"Authorization": "Bearer k"}, timeout=120) as client:
        yield client


async def test_a_stream_says_what_a_completion_says_with_the_same_gravity_report(http):
    plain = (await http.post("/v1/chat/completions", json=QUESTION)).json()
    streamed = events((await http.post("/v1/chat/completions", json={
        **QUESTION, "stream": True, "stream_options": {"include_usage": True}})).text)
    usage, gravity = plain["usage"], plain["gravity"]
    assert len(gravity["entropy"]) == usage["completion_tokens"] and gravity["reasoning_tokens"] > 0
    assert plain["choices"][0]["finish_reason"] == ("stop" if gravity["answer_complete"] else "length")
    *chunks, finishing, usage_chunk, done = streamed
    deltas = [c["choices"][0]["delta"] for c in [*chunks, finishing]]
    assert "".join(d["content"] or "" for d in deltas).strip() == plain["choices"][0]["message"]["content"]
    assert "".join(d["reasoning_content"] or "" for d in deltas).strip() == (
        plain["choices"][0]["message"]["reasoning_content"] or "")
    assert finishing["gravity"]["entropy"] == pytest.approx(gravity["entropy"], abs=1e-4)
    assert usage_chunk["usage"] == usage and done == "[DONE]"


async def test_a_forced_tool_call_comes_back_in_openai_format(http):
    body = (await http.post("/v1/chat/completions", json={
        **QUESTION, "messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})).json()
    choice = body["choices"][0]
    call = choice["message"]["tool_calls"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert call["type"] == "function" and call["function"]["name"] == "get_weather" and call["id"]
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str)


async def test_a_json_schema_response_format_yields_json_of_that_schema(http):
    schema = {"type": "object", "properties": {"apples": {"type": "integer"}}, "required": ["apples"],
              "additionalProperties": False}
    body = (await http.post("/v1/chat/completions", json={
        **QUESTION, "response_format": {"type": "json_schema", "json_schema": {"name": "count", "schema": schema}}}
    )).json()
    assert isinstance(json.loads(body["choices"][0]["message"]["content"])["apples"], int)


async def test_the_openai_client_creates_and_streams_completions(app):
    with live_server(app) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
        completion = await client.chat.completions.create(**QUESTION)
        stream = await client.chat.completions.create(**QUESTION, stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        await client.close()
    assert completion.model == MODEL and completion.usage.completion_tokens > 0
    assert completion.gravity["enabled"] is True  # the extension rides along as an extra field
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == completion.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens
