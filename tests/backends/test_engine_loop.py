"""The local backend's engine thread, driven by a stand-in engine: routing, leaving early, closing."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="the vLLM extra is not installed")

from agent_gravity import EngineError  # noqa: E402
from agent_gravity.backends import GenerationRequest, GenerationResult, SamplingSettings  # noqa: E402
from agent_gravity.backends.base import drain  # noqa: E402
from agent_gravity.backends.local_vllm import LocalVLLMBackend, _EngineLoop  # noqa: E402


class StandInEngine:
    """Generates ``max_tokens`` tokens per request, one per step, like LLMEngine's step()."""

    def __init__(self, fail_on: str = "") -> None:
        self.live: dict[str, list[int]] = {}
        self.aborted: list[str] = []
        self.fail_on = fail_on
        self.go = threading.Event()
        self.go.set()
        self.added = threading.Event()

    def add_request(self, request_id, prompt, params):
        if prompt["prompt_token_ids"] == [666]:
            raise ValueError("bad prompt")
        self.live[request_id] = [params.max_tokens, 0]
        self.added.set()

    def has_unfinished_requests(self):
        return bool(self.live)

    def abort_request(self, ids):
        for i in ids:
            if self.live.pop(i, None) is not None:
                self.aborted.append(i)

    def step(self):
        self.go.wait()
        outputs = []
        for request_id, state in list(self.live.items()):
            state[1] += 1
            finished = state[1] >= state[0]
            completion = SimpleNamespace(token_ids=[state[1]], text=f"t{state[1]} ", logprobs=None,
                                         finish_reason="length" if finished else None)
            outputs.append(SimpleNamespace(request_id=request_id, finished=finished, outputs=[completion],
                                           num_cached_tokens=0))
            if finished:
                del self.live[request_id]
        return outputs


def backend_on(engine: StandInEngine) -> LocalVLLMBackend:
    backend = LocalVLLMBackend.__new__(LocalVLLMBackend)
    backend._loop = _EngineLoop(engine)
    backend._blocks = None  # a stand-in has no paged KV cache to read
    return backend


def request(n: int, prompt=(1, 2)) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingSettings(max_tokens=n))


def test_concurrent_streams_each_get_their_own_tokens():
    backend = backend_on(StandInEngine())
    results: dict[int, GenerationResult] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, drain(backend.stream(request(n)))))
               for n in (2, 5, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert {n: r.token_ids for n, r in results.items()} == {2: [1, 2], 5: [1, 2, 3, 4, 5], 3: [1, 2, 3]}
    assert results[5].text == "t1 t2 t3 t4 t5 " and results[5].finish_reason == "length"


def test_an_async_caller_that_leaves_early_does_not_harm_the_engine():
    engine = StandInEngine()
    backend = backend_on(engine)

    async def leave_after_one():
        # Long enough that it cannot finish on its own before the abort arrives, however busy the machine.
        async for _ in backend.astream(request(10**9)):
            break

    asyncio.run(leave_after_one())  # its event loop is closed now
    assert drain(backend.stream(request(3))).token_ids == [1, 2, 3]
    assert len(engine.aborted) == 1


def test_a_request_the_engine_refuses_fails_alone():
    backend = backend_on(StandInEngine())
    with pytest.raises(EngineError, match="bad prompt"):
        drain(backend.stream(request(3, prompt=[666])))
    assert drain(backend.stream(request(2))).token_ids == [1, 2]


def test_closing_answers_waiting_callers_and_refuses_new_ones():
    engine = StandInEngine()
    backend = backend_on(engine)
    engine.go.clear()  # hold the engine mid-request
    errors: list[Exception] = []

    def wait_for_result():
        try:
            drain(backend.stream(request(10)))
        except EngineError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait_for_result)
    waiter.start()
    assert engine.added.wait(timeout=10)
    backend._loop._inbox.put(("close", None))
    engine.go.set()
    waiter.join(timeout=10)
    backend._loop._thread.join(timeout=10)
    assert errors and "closed" in str(errors[0])
    with pytest.raises(EngineError, match="closed"):
        drain(backend.stream(request(2)))


def test_a_call_past_its_timeout_is_aborted_and_the_engine_goes_on():
    from agent_gravity import EngineTimeoutError

    engine = StandInEngine()
    backend = backend_on(engine)
    slow = GenerationRequest([1, 2], SamplingSettings(max_tokens=10**9), timeout=0.2)
    with pytest.raises(EngineTimeoutError, match="longer than its timeout of 0.2 s"):
        drain(backend.stream(slow))

    async def slow_async():
        return [item async for item in backend.astream(slow)]

    with pytest.raises(EngineTimeoutError):
        asyncio.run(slow_async())
    assert drain(backend.stream(request(3))).token_ids == [1, 2, 3]
    assert len(engine.aborted) == 2, "both timed-out requests were aborted, not left running"
