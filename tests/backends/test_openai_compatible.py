"""The OpenAI-compatible backend and the vLLM plugin, against real vLLM servers on loopback."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import statistics
import threading
import time

import httpx
import pytest

from agent_gravity import ChatGravity, EngineError, GravityConfig, UpstreamAuthError
from agent_gravity._steering import SteeringSpec
from agent_gravity.backends.base import GenerationRequest, SamplingSettings, adrain, drain
from agent_gravity.backends.openai_compatible import OpenAICompatibleBackend
from agent_gravity.bench.serve import serving
from agent_gravity.bench.vllm_servers import free_port, metric
from agent_gravity.serve import create_app
from tests.serve._scripted_backend import ScriptedBackend

pytestmark = pytest.mark.engine

# Fires at the first line break after 8 tokens whose entropy stays under 3 nats: an exit on nearly every answer.
EAGER = GravityConfig(policy={"name": "window_mean", "window": 4, "threshold": 3.0, "patience": 1}, probe=None,
                      min_tokens=8, max_reasoning_tokens=96, max_answer_tokens=48)
QUESTION = "A train travels 60 km in 1.5 hours. What is its average speed in km/h?"


@pytest.fixture(scope="module")
def plugin(vllm_servers):
    backend = OpenAICompatibleBackend(vllm_servers["plugin"])
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def plain(vllm_servers):
    backend = OpenAICompatibleBackend(vllm_servers["plain"])
    yield backend
    backend.close()


def _request(model: ChatGravity, question: str = QUESTION, config: GravityConfig = EAGER) -> GenerationRequest:
    from langchain_core.messages import HumanMessage

    return model._prepare([HumanMessage(question)], None, {"gravity": config}).request


def _completion(url: str, body: dict) -> httpx.Response:
    return httpx.post(url + "/completions", json={"model": "SmolLM2-135M-Instruct", **body}, timeout=120)


def test_the_backend_finds_the_plugin_only_where_it_is_installed(plugin, plain):
    assert plugin.in_engine and not plain.in_engine
    assert plugin.model_name == "SmolLM2-135M-Instruct" and plugin.provider == "vllm"
    assert plugin.max_context == 4096


def test_gravity_exits_in_engine_on_a_plugin_server_exactly_as_on_the_local_engine(plugin, chat):
    remote = ChatGravity(backend=plugin)
    sent = plugin.upstreams[0].sent
    result = drain(plugin.stream(_request(remote)))
    local = drain(chat.get_backend().stream(_request(chat)))
    assert plugin.upstreams[0].sent == sent + 1  # one request: the engine closed the reasoning, not this side
    assert result.token_ids == local.token_ids
    assert result.steering.exit == local.steering.exit and local.steering.exit.value == "gravity"
    assert result.steering.reasoning_tokens == local.steering.reasoning_tokens
    assert result.steering.lock is not None and result.steering.lock.step == local.steering.lock.step


@pytest.mark.parametrize("bad, says", [
    ("not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"key": "k"}', "eos_ids"),
    ('{"key": "k", "eos_ids": [2], "policy": {"name": "no_such_policy"}}', "no_such_policy"),
    ('{"key": "k", "eos_ids": ["two"]}', "two"),
])
def test_bad_gravity_settings_get_a_400_that_says_what_is_wrong(vllm_servers, bad, says):
    response = _completion(vllm_servers["plugin"], {"prompt": "Hi", "max_tokens": 2,
                                                    "vllm_xargs": {"agent_gravity": bad}})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "agent_gravity" in message and says in message
    healthy = _completion(vllm_servers["plugin"], {"prompt": "Hi", "max_tokens": 2})
    assert healthy.status_code == 200


def test_requests_without_gravity_settings_get_the_same_tokens_as_without_the_plugin(vllm_servers):
    for prompt in ["The capital of France is", "def fibonacci(n):", "Once upon a time"]:
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "return_token_ids": True}
        with_plugin = _completion(vllm_servers["plugin"], body).json()["choices"][0]["token_ids"]
        without = _completion(vllm_servers["plain"], body).json()["choices"][0]["token_ids"]
        assert with_plugin == without and len(with_plugin) > 10


def test_estimated_entropy_agrees_with_the_exact_trace_within_the_stated_bound(plain, chat):
    local = chat.get_backend()
    prompt = local.render([{"role": "user", "content": "Explain why the sky is blue."}])
    request = GenerationRequest(prompt, SamplingSettings(max_tokens=64),
                                SteeringSpec(key="trace", eos_ids=local.eos_ids))
    exact = drain(local.stream(request))
    estimated = drain(plain.stream(request))
    assert estimated.token_ids == exact.token_ids
    assert exact.entropy_bound is None and len(estimated.entropy_bound) == len(exact.entropy)
    for step, (e, x, bound) in enumerate(zip(estimated.entropy, exact.entropy, estimated.entropy_bound)):
        assert abs(e - x) <= bound + 1e-3, f"token {step}: estimate {e} vs exact {x}, bound {bound}"
    print(f"bound mean {statistics.fmean(estimated.entropy_bound):.4f} max {max(estimated.entropy_bound):.4f}; "
          f"error mean {statistics.fmean(abs(e - x) for e, x in zip(estimated.entropy, exact.entropy)):.4f}")
    assert statistics.fmean(estimated.entropy_bound) < 0.3  # a bound this tight is a claim, not a tautology


def test_without_the_plugin_the_client_ends_the_stream_when_gravity_fires_and_keeps_the_answer(plain):
    model = ChatGravity(backend=plain, gravity=EAGER)
    sent = plain.upstreams[0].sent
    chunks = list(model.stream(QUESTION))
    gravity = chunks[-1].response_metadata["gravity"]
    assert gravity["reason"] == "gravity" and gravity["terminated_early"]
    assert gravity["answer_complete"] and "".join(c.content for c in chunks).strip()
    assert plain.upstreams[0].sent == sent + 2  # the reasoning's stream, left; the answer's, asked anew
    assert len(gravity["entropy"]) == chunks[-1].usage_metadata["output_tokens"]


async def test_async_streams_agree_with_sync_ones(plugin):
    model = ChatGravity(backend=plugin)
    request = _request(model)
    assert (await adrain(plugin.astream(request))).token_ids == drain(plugin.stream(request)).token_ids


async def test_several_servers_share_the_requests_and_gravity_behaves_the_same_on_each(vllm_servers, plugin):
    both = OpenAICompatibleBackend([vllm_servers["plugin"], vllm_servers["plugin_b"]])
    model = ChatGravity(backend=both)
    questions = [f"What is {a} times {a + 3}?" for a in range(2, 10)]
    spread = await asyncio.gather(*(adrain(both.astream(_request(model, q))) for q in questions))
    alone = [drain(plugin.stream(_request(ChatGravity(backend=plugin), q))) for q in questions]
    assert all(u.sent >= 2 for u in both.upstreams)
    for a, b in zip(spread, alone):
        assert a.token_ids == b.token_ids and a.steering.exit == b.steering.exit
    both.close()


def test_a_server_down_at_start_gets_a_clear_error_fast():
    with pytest.raises(EngineError, match=r"no server answered: http://127.0.0.1:\d+/v1 \(ConnectError"):
        OpenAICompatibleBackend(f"http://127.0.0.1:{free_port()}/v1", connect_timeout=2)


def test_a_server_down_among_several_sits_out_and_the_others_serve(vllm_servers):
    backend = OpenAICompatibleBackend([f"http://127.0.0.1:{free_port()}/v1", vllm_servers["plugin"]])
    result = drain(backend.stream(_request(ChatGravity(backend=backend))))
    assert result.finish_reason == "stop" and backend.upstreams[0].sent == 0
    backend.close()


def test_a_caller_that_leaves_mid_stream_aborts_the_server_request(plugin, vllm_servers):
    url = vllm_servers["plugin"]
    counting = plugin.encode("1, 2, 3, 4, 5, 6, 7, 8, 9, 10,")  # goes on for far longer than the test waits
    before = metric(url, "vllm:generation_tokens_total")
    stream = plugin.stream(GenerationRequest(counting, SamplingSettings(max_tokens=2000)))
    for _, _ in zip(range(3), stream):
        pass
    stream.close()
    time.sleep(1.0)  # the server notices the closed connection on its next write
    generated = metric(url, "vllm:generation_tokens_total")
    time.sleep(1.5)
    assert metric(url, "vllm:generation_tokens_total") == generated < before + 2000
    assert metric(url, "vllm:num_requests_running") == 0


def test_a_timeout_aborts_the_request_with_a_clear_error(plugin):
    from agent_gravity import EngineTimeoutError

    config = GravityConfig(enabled=False, max_reasoning_tokens=400, max_answer_tokens=400)
    with pytest.raises(EngineTimeoutError, match="longer than its timeout of 0.5 s"):
        ChatGravity(backend=plugin, gravity=config, timeout=0.5).invoke("Write a long story about a dragon.")


class _DyingServer(http.server.BaseHTTPRequestHandler):
    """A server that streams two tokens of every completion, then drops the connection."""

    def do_GET(self) -> None:
        from agent_gravity import _model_store

        self._json({"data": [{"id": "SmolLM2-135M-Instruct", "root": str(_model_store.pull()),
                              "max_model_len": 4096}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not body.get("stream"):
            return self._json({"choices": [{"text": "", "token_ids": [2]}]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for token in (504, 3575):
            event = {"id": "cmpl-dying", "choices": [{"text": "x", "token_ids": [token],
                                                      "logprobs": {"top_logprobs": [{f"token_id:{token}": -0.1}]}}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)

    def _json(self, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def dying():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DyingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_a_server_that_dies_mid_stream_is_retried_then_reported_clearly(dying):
    backend = OpenAICompatibleBackend(dying, max_retries=1)
    request = GenerationRequest(backend.encode("Hello"), SamplingSettings(max_tokens=16))
    with pytest.raises(EngineError, match="failed 2 times, last at .*closed the stream before the completion"):
        drain(backend.stream(request))
    backend.close()


def test_a_stream_cut_short_goes_on_at_another_server_from_the_tokens_received(dying, vllm_servers):
    backend = OpenAICompatibleBackend([dying, vllm_servers["plain"]], max_retries=4)
    results = [drain(backend.stream(GenerationRequest(backend.encode("Hello"), SamplingSettings(max_tokens=16))))
               for _ in range(2)]
    assert backend.upstreams[0].sent >= 1
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert any(r.token_ids[:2] == [504, 3575] for r in results)  # kept what the dying server had sent
    backend.close()


def test_a_server_that_refuses_the_api_key_says_so():
    # The gravity proxy checks keys like any OpenAI-compatible server: a 401 before anything else.
    with serving(create_app(ChatGravity(backend=ScriptedBackend()), api_key="right")) as url:
        with pytest.raises(UpstreamAuthError, match=r"refused the API key \(HTTP 401.*pass the server's key"):
            OpenAICompatibleBackend(url + "/v1", api_key="wrong")
