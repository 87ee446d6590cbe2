"""Steering over HTTP with no server: the run is driven with scripted stream events, as a server sends them."""

import math

import pytest

from agent_gravity import EngineError
from agent_gravity._steering import Exit, Steering
from agent_gravity.backends._openai_wire import Chunk, TokenStep, completion_body, parse_chunk
from agent_gravity.backends._remote_run import RemoteRun, Vocabulary, credit_engine_exits
from agent_gravity.backends.base import GenerationDelta, GenerationRequest, GenerationResult, SamplingSettings
from tests.test_steering import END0, END1, EOS, NL, PREFIX, make_spec

EAGER = {"name": "window_mean", "window": 2, "threshold": 0.5}
CONFIDENT = -0.01  # a top log-probability that leaves almost nothing unseen: the entropy estimate is ~0
VOCAB = Vocabulary("m", 200, lambda ids: "".join(f"<{i}>" for i in ids))


def _step(token: int, top: int | None = None) -> TokenStep:
    """The server sampled ``token``; the model ranked ``top`` (default: the token) first."""
    top = token if top is None else top
    return TokenStep(token, {top: CONFIDENT} if top == token else {top: -0.5, token: -1.0})


def _run(spec, in_engine: bool, max_tokens: int = 40) -> RemoteRun:
    request = GenerationRequest([1, 2, 3], SamplingSettings(max_tokens=max_tokens), spec)
    return RemoteRun(VOCAB, request, in_engine, top_logprobs=5, start_probe=lambda *a: None)


def test_the_body_continues_from_every_kept_token_and_sends_settings_only_to_the_plugin():
    spec = make_spec(policy=EAGER)
    run = _run(spec, in_engine=False)
    run.feed(Chunk("cmpl-1", [_step(5, top=5)], "a", None, None))
    body = run.body()
    assert body["prompt"] == [1, 2, 3, 5] and body["max_tokens"] == 39 and "vllm_xargs" not in body
    assert body["logprobs"] == 5 and body["return_tokens_as_token_ids"]
    assert "agent_gravity" in _run(spec, in_engine=True).body()["vllm_xargs"]


def test_without_the_plugin_gravity_writes_the_marker_here_and_asks_the_server_to_go_on():
    run = _run(make_spec(policy=EAGER), in_engine=False)
    items, leave = [], False
    for token in (5, 6, 7, NL, 9):
        new, leave = run.feed(Chunk("cmpl-1", [_step(token)], f"<{token}>", None, None))
        items += new
        if leave:
            break
    assert leave and not run.done
    assert run.token_ids == [5, 6, 7, NL, END0, END1, PREFIX]  # the server's 9 was replaced by the marker
    assert run.steering.exit is Exit.GRAVITY and run.steering.reasoning_tokens == 4
    assert isinstance(items[-1], GenerationDelta) and items[-1].text == f"<{END0}><{END1}><{PREFIX}>"
    assert math.isnan(run.bounds[-1]) and run.body()["prompt"][-1] == PREFIX
    new, leave = run.feed(Chunk("cmpl-2", [_step(42)], "<42>", None, None))
    new, leave = run.feed(Chunk("cmpl-2", [_step(EOS)], "", "stop", None))
    result = new[-1]
    assert isinstance(result, GenerationResult) and result.finish_reason == "stop"
    assert result.response_id == "cmpl-1" and result.token_ids[-2:] == [42, EOS]
    assert len(result.entropy) == len(result.token_ids) == len(result.entropy_bound)


def test_an_end_of_sequence_in_the_reasoning_becomes_the_marker_as_in_the_engine():
    run = _run(make_spec(), in_engine=False)
    run.feed(Chunk("c", [_step(5)], "", None, None))
    _, leave = run.feed(Chunk("c", [_step(EOS)], "", "stop", None))
    assert leave and run.token_ids == [5, END0, END1, PREFIX] and run.steering.exit is Exit.MODEL


def test_the_budget_ends_a_run_that_the_forced_tokens_fill():
    run = _run(make_spec(policy=EAGER), in_engine=False, max_tokens=5)
    for token in (5, 6, 7, NL, 9):
        _, leave = run.feed(Chunk("c", [_step(token)], "", None, None))
    assert run.done and run.finish_reason == "length" and len(run.token_ids) == 5


def test_on_the_plugin_server_the_engine_exit_is_read_back_from_a_marker_the_model_did_not_rank_first():
    spec = make_spec(policy=EAGER)
    run = _run(spec, in_engine=True)
    steps = [_step(5), _step(6), _step(7), _step(NL), _step(END0, top=9), _step(END1, top=3), _step(PREFIX, top=3),
             _step(42), _step(EOS)]
    items, leave = run.feed(Chunk("c", steps, "text", "stop", None))
    result = items[-1]
    assert not leave and result.token_ids == [5, 6, 7, NL, END0, END1, PREFIX, 42, EOS]
    assert result.steering.exit is Exit.GRAVITY and result.steering.lock.policy == "window_mean"
    assert result.steering.reasoning_tokens == 4 and result.steering.answer_start == 7


def test_a_marker_the_model_ranked_first_stays_the_models_own_exit():
    follower = Steering.follower(make_spec(policy=EAGER))
    ids = [5, NL, END0, END1, PREFIX]
    for t in range(len(ids)):
        follower.step(0.0, ids[:t])
    credit_engine_exits(follower, make_spec(policy=EAGER), ids, [{i: CONFIDENT} for i in ids])
    assert follower.exit is Exit.MODEL


def test_a_completion_event_without_token_ids_is_refused_clearly():
    event = {"id": "c", "choices": [{"text": "x", "token_ids": [5], "logprobs": {"top_logprobs": [{"x": -1.0}]}}]}
    with pytest.raises(EngineError, match="return_tokens_as_token_ids"):
        parse_chunk(event)
    with pytest.raises(EngineError, match="mid-stream: boom"):
        parse_chunk({"error": {"message": "boom"}})
    assert completion_body("m", [1], SamplingSettings(max_tokens=3, json_schema={"type": "object"}), 3, 5,
                           None)["structured_outputs"] == {"json": {"type": "object"}}
