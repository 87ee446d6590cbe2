"""The OpenAI-compatible backend and the vLLM plugin, against real vLLM servers on loopback (``engine``), and the
backend's HTTP behaviour against small servers without a model."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http.server
import json
import socket
import statistics
import threading
import time
import weakref
from collections.abc import Iterator

import httpx
import pytest

from agent_gravity import ChatGravity, EngineError, GravityConfig, ProbeConfig, UpstreamAuthError
from agent_gravity._steering import SteeringSpec
from agent_gravity.backends.base import GenerationRequest, SamplingSettings, adrain, drain
from agent_gravity.backends.openai_compatible import OpenAICompatibleBackend
from agent_gravity.bench.serve import serving
from agent_gravity.bench.vllm_servers import free_port, metric
from agent_gravity.serve import create_app
from tests.conftest import metric_points
from tests.serve._scripted_backend import ScriptedBackend

engine = pytest.mark.engine

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


@engine
def test_the_backend_finds_the_plugin_only_where_it_is_installed(plugin, plain):
    assert plugin.in_engine and not plain.in_engine
    assert plugin.model_name == "SmolLM2-135M-Instruct" and plugin.provider == "vllm"
    assert plugin.max_context == 4096


@engine
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


@engine
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


@engine
def test_requests_without_gravity_settings_get_the_same_tokens_as_without_the_plugin(vllm_servers):
    for prompt in ["The capital of France is", "def fibonacci(n):", "Once upon a time"]:
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "return_token_ids": True}
        with_plugin = _completion(vllm_servers["plugin"], body).json()["choices"][0]["token_ids"]
        without = _completion(vllm_servers["plain"], body).json()["choices"][0]["token_ids"]
        assert with_plugin == without and len(with_plugin) > 10


@engine
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


@engine
def test_without_the_plugin_the_client_ends_the_stream_when_gravity_fires_and_keeps_the_answer(plain):
    model = ChatGravity(backend=plain, gravity=EAGER)
    sent = plain.upstreams[0].sent
    chunks = list(model.stream(QUESTION))
    gravity = chunks[-1].response_metadata["gravity"]
    assert gravity["reason"] == "gravity" and gravity["terminated_early"]
    assert gravity["answer_complete"] and "".join(c.content for c in chunks).strip()
    assert plain.upstreams[0].sent == sent + 2  # the reasoning's stream, left; the answer's, asked anew
    assert len(gravity["entropy"]) == chunks[-1].usage_metadata["output_tokens"]


@engine
async def test_async_streams_agree_with_sync_ones(plugin):
    model = ChatGravity(backend=plugin)
    request = _request(model)
    assert (await adrain(plugin.astream(request))).token_ids == drain(plugin.stream(request)).token_ids


@engine
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


@engine
def test_a_server_down_among_several_sits_out_and_the_others_serve(vllm_servers):
    backend = OpenAICompatibleBackend([f"http://127.0.0.1:{free_port()}/v1", vllm_servers["plugin"]])
    result = drain(backend.stream(_request(ChatGravity(backend=backend))))
    assert result.finish_reason == "stop" and backend.upstreams[0].sent == 0
    backend.close()


@engine
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


@engine
def test_a_timeout_aborts_the_request_with_a_clear_error(plugin):
    from agent_gravity import EngineTimeoutError

    config = GravityConfig(enabled=False, max_reasoning_tokens=400, max_answer_tokens=400)
    with pytest.raises(EngineTimeoutError, match="longer than its timeout of 0.5 s"):
        ChatGravity(backend=plugin, gravity=config, timeout=0.5).invoke("Write a long story about a dragon.")


class _FakeServer(http.server.ThreadingHTTPServer):
    """An OpenAI-compatible server without a model, over HTTP/1.1 kept alive: a completion streams up to ``tokens``
    distinct, confident tokens, one event every ``delay`` seconds; answer probes get ``probe_status``."""

    daemon_threads = True

    def __init__(self, tokens: int = 8, delay: float = 0.0, probe_status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), _FakeHandler)
        self.tokens, self.delay, self.probe_status = tokens, delay, probe_status
        self.streamed_from: list[int] = []
        """The client port of each streamed completion: one port is one connection."""
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"


class _FakeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _FakeServer

    def do_GET(self) -> None:
        from agent_gravity import _model_store

        self._json(200, {"data": [{"id": "SmolLM2-135M-Instruct", "root": str(_model_store.pull()),
                                   "max_model_len": 4096}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "vllm_xargs" in body:  # the plugin check: a server without the plugin ignores the settings
            return self._json(200, {"choices": [{"text": "", "token_ids": [2]}]})
        if not body.get("stream"):  # an answer probe
            status = self.server.probe_status
            return self._json(status, {"choices": [{"text": "8", "token_ids": [29]}]} if status == 200 else
                              {"error": {"message": f"HTTP {status} from the fake"}})
        self.server.streamed_from.append(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        count = min(body["max_tokens"], self.server.tokens)
        with contextlib.suppress(OSError):  # a client that leaves mid-stream
            for i in range(count):
                token = 1000 + len(body["prompt"]) + i  # never the same token twice: no loop to stop
                end = None if i < count - 1 else "length" if count == body["max_tokens"] else "stop"
                choice = {"text": "x", "token_ids": [token], "finish_reason": end,
                          "logprobs": {"top_logprobs": [{f"token_id:{token}": -0.01}]}}
                self._chunk(f"data: {json.dumps({'id': 'cmpl-fake', 'choices': [choice]})}\n\n".encode())
                time.sleep(self.server.delay)
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


class _DyingServer(_FakeHandler):
    """A server that streams two tokens of every completion, then drops the connection."""

    protocol_version = "HTTP/1.0"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not body.get("stream"):
            return self._json(200, {"choices": [{"text": "", "token_ids": [2]}]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for token in (504, 3575):
            event = {"id": "cmpl-dying", "choices": [{"text": "x", "token_ids": [token],
                                                      "logprobs": {"top_logprobs": [{f"token_id:{token}": -0.1}]}}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def dying():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DyingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def _sync(backend: OpenAICompatibleBackend, request: GenerationRequest) -> list:
    return list(backend.stream(request))


def _async(backend: OpenAICompatibleBackend, request: GenerationRequest) -> list:
    async def items() -> list:
        return [item async for item in backend.astream(request)]

    return asyncio.run(items())


@pytest.mark.parametrize("run", [_sync, _async])
def test_a_server_that_dies_mid_stream_is_retried_then_reported_clearly(dying, run):
    backend = OpenAICompatibleBackend(dying, max_retries=1)
    request = GenerationRequest(backend.encode("Hello"), SamplingSettings(max_tokens=16))
    with pytest.raises(EngineError, match="failed 2 times, last at .*closed the stream before the completion"):
        run(backend, request)
    assert backend.upstreams[0].sent == 2 and backend.upstreams[0].down_until > time.monotonic()
    backend.close()


@engine
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


@contextlib.contextmanager
def _fake(**options) -> Iterator[tuple[_FakeServer, OpenAICompatibleBackend]]:
    server = _FakeServer(**options)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    backend = OpenAICompatibleBackend(server.url)
    try:
        yield server, backend
    finally:
        backend.close()
        server.shutdown()


def test_an_empty_api_key_is_refused_before_any_request():
    for empty in ("", "  "):
        with pytest.raises(ValueError, match="api_key is empty"):
            OpenAICompatibleBackend(f"http://127.0.0.1:{free_port()}/v1", api_key=empty)


async def test_async_streams_on_one_event_loop_share_one_connection():
    with _fake() as (server, backend):
        request = GenerationRequest(backend.encode("Hello"), SamplingSettings(max_tokens=4))
        for _ in range(3):
            assert [item async for item in backend.astream(request)][-1].finish_reason == "length"
    assert len(server.streamed_from) == 3 and len(set(server.streamed_from)) == 1


def test_async_streams_work_from_one_event_loop_after_another_and_free_the_loops_that_ended():
    loops = []

    async def stream(backend: OpenAICompatibleBackend, request: GenerationRequest) -> list[int]:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return [item async for item in backend.astream(request)][-1].token_ids

    with _fake() as (server, backend):
        request = GenerationRequest(backend.encode("Hello"), SamplingSettings(max_tokens=4))
        assert asyncio.run(stream(backend, request)) == asyncio.run(stream(backend, request))
        gc.collect()
        assert loops[0]() is None


def test_a_caller_that_leaves_does_not_set_the_server_aside():
    with _fake(tokens=64, delay=0.01) as (server, backend):
        stream = backend.stream(GenerationRequest(backend.encode("Hello"), SamplingSettings(max_tokens=64)))
        next(stream)
        stream.close()
        assert backend.upstreams[0].in_flight == 0 and backend.upstreams[0].down_until < time.monotonic()


def test_failed_probes_are_logged_once_and_counted_in_the_metadata_and_the_metric(caplog):
    probing = GravityConfig(loop=None, min_tokens=4, max_reasoning_tokens=32, max_answer_tokens=8,
                            probe=ProbeConfig(gap=4, interval=4, min_confidence=None, lenient_after=None))
    before = sum(metric_points("agent_gravity.probe_failures").values())
    with _fake(tokens=48, delay=0.01, probe_status=401) as (server, backend):
        model = ChatGravity(backend=backend, gravity=probing)
        gravity = [model.invoke(QUESTION).response_metadata["gravity"] for _ in range(2)]
    failed = [g["probe_failures"] for g in gravity]
    assert all(f >= 2 for f in failed) and all(g["reason"] == "reasoning_budget" for g in gravity)
    warned = [r for r in caplog.records if "answer probe failed" in r.getMessage()]
    assert len(warned) == 1 and "auth" in warned[0].getMessage() and warned[0].levelname == "WARNING"
    assert sum(metric_points("agent_gravity.probe_failures").values()) - before == sum(failed)
