"""Routing by entropy without a model: the direct-answer gate, escalation, adaptive thinking and tiered cascades
through ChatGravity on scripted backends, their metadata and spans, and the config's refusals."""

from __future__ import annotations

import asyncio
import math

import pytest
from langchain_core.messages import HumanMessage
from pydantic import ValidationError

from agent_gravity import ChatGravity, GravityConfig, InvalidCallOptionError, RouteConfig, Tier
from agent_gravity._profile import RouteCalibration, update_profile
from agent_gravity._route import DirectGate, entropy_quantile, escalation, probes_unsettled, sure_reasoning
from agent_gravity.backends.base import GenerationDelta, GenerationRequest, GenerationResult
from tests.serve._scripted_backend import ScriptedBackend

ANSWER_PREFIX = "</think>\nAnswer:"


class RoutedBackend(ScriptedBackend):
    """Answers a direct request (its prompt ends with the answer prefix) with ``direct`` at ``direct_entropy`` per
    token, and a reasoning request with ``reply`` at ``entropy``; counts both."""

    def __init__(self, reply: str = "4 + 4 = 8.</think>\nAnswer: 8", entropy: float | list[float] = 0.5,
                 direct: str = " 8\n", direct_entropy: float = 0.05, name: str = "scripted") -> None:
        super().__init__(reply)
        self.entropy, self.direct, self.direct_entropy, self.model_name = entropy, direct, direct_entropy, name
        self.calls = {"direct": 0, "reason": 0}
        self.aborted = 0
        self.requests: list[GenerationRequest] = []

    def _is_direct(self, request: GenerationRequest) -> bool:
        return self.decode(request.prompt_ids).endswith(ANSWER_PREFIX)

    def stream(self, request: GenerationRequest):
        direct = self._is_direct(request)
        self.calls["direct" if direct else "reason"] += 1
        self.requests.append(request)
        text, entropy = (self.direct, self.direct_entropy) if direct else (self.reply, self.entropy)
        ids = self.encode(text)[:request.sampling.max_tokens]
        entropy = entropy[:len(ids)] if isinstance(entropy, list) else [entropy] * len(ids)
        finished = False
        try:
            for i in range(0, len(ids), 2):  # two tokens a delta, as an engine batches them
                yield GenerationDelta(ids[i:i + 2], self.decode(ids[i:i + 2]), entropy[i:i + 2])
            finished = True
            yield GenerationResult(f"{self.model_name}-1", ids, self.decode(ids), "stop", len(request.prompt_ids),
                                   entropy)
        finally:
            self.aborted += not finished

    async def astream(self, request: GenerationRequest):
        items = self.stream(request)
        try:
            for item in items:
                await asyncio.sleep(0)
                yield item
        finally:
            items.close()


def _delta(text: str, entropy: float) -> GenerationDelta:
    ids = list(text.encode())
    return GenerationDelta(ids, text, [entropy] * len(ids))


def _decode(ids) -> str:
    return bytes(ids).decode()


# -- the decisions -------------------------------------------------------------------------------------------


def test_entropy_quantile_interpolates_and_skips_unmeasured_tokens():
    assert entropy_quantile([0.0, 1.0, 2.0, 3.0, math.nan], 0.5) == 1.5
    assert entropy_quantile([0.0, 10.0], 0.9) == pytest.approx(9.0)
    assert entropy_quantile([math.nan], 0.9) is None


def test_the_gate_reads_the_first_line_only_and_passes_only_when_every_token_was_sure():
    gate = DirectGate(0.3, 12, _decode)
    assert gate.feed(_delta(" 4", 0.1)) is None  # the line has not ended
    assert gate.feed(_delta("2\nThe", 0.2)) is True  # decided at the line break, the rest is not read
    assert gate.text == " 42\n" and gate.score == pytest.approx(0.2) and len(gate.held) == 2
    unsure = DirectGate(0.3, 12, _decode)
    unsure.feed(_delta(" 4", 0.1))
    assert unsure.feed(_delta("2\n", 0.9)) is False and unsure.score == pytest.approx(0.9)
    assert unsure.record(0.3) == {"route": "reason", "direct_score": pytest.approx(0.9), "direct_below": 0.3,
                                  "probe_tokens": 4, "probe_answer": "42"}


def test_the_gate_decides_at_its_token_budget_or_at_the_end_of_the_answer():
    capped = DirectGate(1.0, 3, _decode)
    assert capped.feed(_delta("a long answer", 0.1)) is True and len(capped.entropy) == 3
    ended = DirectGate(1.0, 12, _decode)
    assert ended.feed(GenerationResult("r", [55], "7", "stop", 3, [0.4])) is True
    empty = DirectGate(1.0, 12, _decode)
    assert empty.feed(GenerationResult("r", [], "", "stop", 3, [])) is False  # nothing read is never sure


def test_escalation_reads_the_quantile_the_answer_and_the_probes():
    calm, spike = [0.1] * 19, [0.1] * 16 + [3.0] * 4
    assert not escalation(calm, [], True, 0.9, 1.0, True).escalate
    assert escalation(spike, [], True, 0.9, 1.0, True).why.startswith("entropy q0.9")
    assert not escalation([0.1] * 19 + [5.0], [], True, 0.9, 1.0, True).escalate  # one spike: a mean would not see
    assert escalation(calm, [], False, 0.9, 1.0, True).why == "no answer"
    assert escalation(calm, ["7", "", "8"], True, 0.9, 1.0, True).why == "probes unsettled"
    assert not escalation(calm, ["7", "", "8"], True, 0.9, 1.0, False).escalate
    assert probes_unsettled(["5", "7", "7"]) is False and probes_unsettled(["7"]) is False


# -- adaptive thinking ---------------------------------------------------------------------------------------


def test_a_sure_direct_answer_skips_reasoning_and_says_so():
    backend = RoutedBackend(direct_entropy=0.05)
    model = ChatGravity(backend=backend, route=RouteConfig(think="adaptive", direct_below=0.2))
    msg = model.invoke("What is 4 + 4?")
    route = msg.response_metadata["gravity"]["route"]
    assert msg.content == "8" and "reasoning_content" not in msg.additional_kwargs
    assert route["route"] == "direct" and route["direct_score"] == pytest.approx(0.05)
    assert msg.response_metadata["gravity"]["reasoning_tokens"] == 0
    assert backend.calls == {"direct": 1, "reason": 0} and backend.aborted == 0


def test_an_unsure_direct_answer_is_abandoned_and_the_call_reasons():
    backend = RoutedBackend(direct_entropy=0.9)
    model = ChatGravity(backend=backend, route=RouteConfig(think="adaptive", direct_below=0.2))
    msg = model.invoke("What is 4 + 4?")
    route = msg.response_metadata["gravity"]["route"]
    assert msg.content == "8" and msg.additional_kwargs["reasoning_content"] == "4 + 4 = 8."
    assert route["route"] == "reason" and route["probe_tokens"] == 3 and route["probe_answer"] == "8"
    assert backend.calls == {"direct": 1, "reason": 1} and backend.aborted == 1  # the direct answer was abandoned


@pytest.mark.parametrize("sure", [True, False])
def test_streams_carry_the_routed_answer_sync_and_async(sure):
    backend = RoutedBackend(direct_entropy=0.05 if sure else 0.9, direct=" 8\nand then some more text\n")
    model = ChatGravity(backend=backend, route=RouteConfig(think="adaptive", direct_below=0.2))
    chunks = list(model.stream("What is 4 + 4?"))
    achunks = asyncio.run(_collect(model.astream("What is 4 + 4?")))
    for got in (chunks, achunks):
        text = "".join(c.content for c in got)
        assert text.strip().startswith("8")
        assert got[-1].response_metadata["gravity"]["route"]["route"] == ("direct" if sure else "reason")
    assert backend.aborted == (0 if sure else 2)  # an unsure direct answer is cut at its first line


async def _collect(stream):
    return [c async for c in stream]


def test_adaptive_thinking_leaves_excluded_tasks_tools_and_structured_calls_alone():
    backend = RoutedBackend()
    model = ChatGravity(backend=backend, route=RouteConfig(think="adaptive", direct_below=10.0))
    assert model.invoke("Is this legal?", task="legal").response_metadata["gravity"]["route"] is None
    assert backend.calls["direct"] == 0


def test_direct_below_profile_reads_the_calibration_and_refuses_without_one(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_GRAVITY_PROFILES", str(tmp_path))
    backend = RoutedBackend(direct_entropy=0.05, name="routed-model")
    model = ChatGravity(backend=backend, gravity=GravityConfig(), route=RouteConfig(think="adaptive"))
    with pytest.raises(InvalidCallOptionError, match="calibrate --route"):
        model.invoke("What is 4 + 4?")
    fields = dict(epsilon=0.05, delta=0.1, bound=0.04, loss=0.0, direct_share=0.5, reasoning_saved=0.5, items=60,
                  families=["dates"], guarantee="test", when="now")
    update_profile("routed-model", route=RouteCalibration(direct_below=0.1, **fields))
    assert model.invoke("What is 4 + 4?").response_metadata["gravity"]["route"]["direct_below"] == 0.1
    update_profile("routed-model", route=RouteCalibration(direct_below=None, **fields))
    route = model.invoke("What is 4 + 4?").response_metadata["gravity"]["route"]
    assert route["route"] == "reason" and "no direct-answer threshold" in route["why"]
    assert backend.calls["direct"] == 1  # an uncertified profile probes nothing


# -- tiers ---------------------------------------------------------------------------------------------------


def _tiers(cheap_entropy: float, **route) -> tuple[ChatGravity, RoutedBackend, RoutedBackend]:
    cheap = RoutedBackend("cheap.</think>\nAnswer: 7", entropy=cheap_entropy, name="cheap-model")
    full = RoutedBackend("full.</think>\nAnswer: 8", entropy=0.2, name="full-model")
    model = ChatGravity(tiers=[Tier(name="cheap", backend=cheap, gravity=GravityConfig(max_reasoning_tokens=32)),
                               Tier(name="full", backend=full)], route=RouteConfig(escalate_above=1.0, **route))
    return model, cheap, full


def test_a_calm_cheap_tier_answers_and_an_unsure_one_goes_up(spans):
    model, cheap, full = _tiers(0.3)
    msg = model.invoke("q")
    assert msg.content == "7" and msg.response_metadata["model_name"] == "cheap-model"
    assert msg.response_metadata["gravity"]["route"]["tier"] == "cheap" and full.calls["reason"] == 0
    model, cheap, full = _tiers(2.5)
    msg = model.invoke("q")
    route = msg.response_metadata["gravity"]["route"]
    assert msg.content == "8" and route["tier"] == "full" and not route["escalated"]
    assert route["tried"] == [{"tier": "cheap", "escalated": True, "why": "entropy q0.9 2.5 > 1", "score": 2.5,
                               "output_tokens": len("cheap.</think>\nAnswer: 7")}]
    first, second = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")][-2:]
    assert first.attributes["agent_gravity.route.tier"] == "cheap" and first.attributes["agent_gravity.route.escalated"]
    assert second.attributes["agent_gravity.route.escalated_from"] == ("cheap",)
    assert "agent_gravity.route.probe_answer" not in second.attributes  # content only when opted in


@pytest.mark.parametrize("mode", ["invoke", "ainvoke", "stream", "astream"])
def test_every_surface_escalates_alike(mode):
    model, _, full = _tiers(2.5)
    if mode == "invoke":
        text, meta = (m := model.invoke("q")).content, m.response_metadata
    elif mode == "ainvoke":
        text, meta = (m := asyncio.run(model.ainvoke("q"))).content, m.response_metadata
    else:
        chunks = list(model.stream("q")) if mode == "stream" else asyncio.run(_collect(model.astream("q")))
        text, meta = "".join(c.content for c in chunks), chunks[-1].response_metadata
    assert text == "8" and meta["gravity"]["route"]["tier"] == "full" and full.calls["reason"] == 1


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_an_escalated_call_continues_the_reasoning_the_cheap_tier_was_sure_of(mode):
    sure = "8 + 8 = 16, and half of 16 is 8."
    cheap = RoutedBackend(sure + " Or 7?</think>\nAnswer: 7", entropy=[0.2] * len(sure) + [3.0] * 99, name="cheap")
    full = RoutedBackend(" So 8.</think>\nAnswer: 8", entropy=0.2, name="full")
    model = ChatGravity(tiers=[Tier(name="cheap", backend=cheap), Tier(name="full", backend=full)],
                        route=RouteConfig(escalate_above=1.0, escalate_quantile=1.0))  # the max: "sure" ends at 3.0
    if mode == "invoke":
        msg = model.invoke("q")
        text, reasoning, meta = msg.content, msg.additional_kwargs["reasoning_content"], msg.response_metadata
    else:
        chunks = list(model.stream("q"))
        text = "".join(c.content for c in chunks)
        reasoning = "".join(c.additional_kwargs.get("reasoning_content", "") for c in chunks)
        meta = chunks[-1].response_metadata
    route = meta["gravity"]["route"]
    assert text == "8" and reasoning.strip() == sure + " So 8."
    assert route["tier"] == "full" and route["carried_tokens"] == len(sure) and route["carried_from"] == "cheap"
    cheap_request, full_request = cheap.requests[-1], full.requests[-1]
    assert full_request.prompt_ids[-len(sure):] == cheap.encode(sure)  # prefilled, not written again
    assert full_request.sampling.max_tokens == cheap_request.sampling.max_tokens - len(sure)
    budget = full_request.steering.reasoning.max_reasoning_tokens
    assert budget == cheap_request.steering.reasoning.max_reasoning_tokens - len(sure)


def test_the_carried_reasoning_is_the_longest_start_that_would_have_stood_and_never_the_marker():
    text = "abcdefghij</think>\nAnswer: 7"
    result = GenerationResult("r", list(text.encode()), text, "stop", 3, [0.2] * 8 + [30.0] * 30)
    # q0.9 of a start tolerates a tenth of unsure tokens: 9 tokens hold one 30.0 at the interpolated 0.9 point only
    assert _decode(sure_reasoning(result, "</think>", _decode, 1.0, 1.0)) == "abcdefgh"
    assert _decode(sure_reasoning(result, "</think>", _decode, 0.9, 1.0)) == "abcdefgh"
    calm = GenerationResult("r", list(text.encode()), text, "stop", 3, [0.2] * len(text))
    assert _decode(sure_reasoning(calm, "</think>", _decode, 0.9, 1.0)) == "abcdefghij"  # never the marker
    assert sure_reasoning(GenerationResult("r", [], "", "stop", 3, []), "</think>", _decode, 0.9, 1.0) == []


def test_tiers_with_different_tokenizers_or_no_carry_start_over():
    sure = "8 + 8 = 16."
    for other_vocab, carry in ((True, True), (False, False)):
        cheap = RoutedBackend(sure + " Or 7?</think>\nAnswer: 7", entropy=[0.2] * len(sure) + [3.0] * 99)
        full = RoutedBackend(" So 8.</think>\nAnswer: 8", entropy=0.2)
        if other_vocab:
            full.token_texts = [*ScriptedBackend.token_texts[:-1], "\u2581other"]
        model = ChatGravity(tiers=[Tier(name="cheap", backend=cheap), Tier(name="full", backend=full)],
                            route=RouteConfig(escalate_above=1.0, carry=carry))
        route = model.invoke("q").response_metadata["gravity"]["route"]
        assert route["tier"] == "full" and "carried_tokens" not in route
        assert full.requests[-1].sampling.max_tokens == cheap.requests[-1].sampling.max_tokens


def test_a_tier_keeps_its_own_gravity_while_a_call_option_sets_the_others():
    model, _, _ = _tiers(0.3)
    cheap, full = model._cascade().models
    assert model._cascade().options(0, {"gravity": GravityConfig(max_reasoning_tokens=99)}) == {}
    assert cheap.gravity.max_reasoning_tokens == 32 and full.gravity.max_reasoning_tokens == 256
    assert model.get_backend().model_name == "full-model" and model.profile_key() == "full-model"


def test_task_rules_pin_a_tier_and_tool_calls_skip_the_cascade_unless_asked():
    model, cheap, full = _tiers(2.5, tasks={"summarize": "cheap"})
    assert model.invoke("q", task="summarize").response_metadata["gravity"]["route"]["tier"] == "cheap"
    path = model._cascade().path
    assert path({"tools": [{"type": "function"}]}) == [1] and path({"response_format": {}}) == [1]
    assert path({}) == [0, 1] and path({"task": "summarize"}) == [0]
    assert path({"tools": [1], "route": RouteConfig(tools=True)}) == [0, 1]


def test_bad_routes_and_tiers_are_refused_with_what_to_fix():
    with pytest.raises(ValidationError, match="at least two tiers"):
        ChatGravity(tiers=[Tier(name="only")])
    with pytest.raises(ValidationError, match="distinct names"):
        ChatGravity(tiers=[Tier(name="a"), Tier(name="a")])
    with pytest.raises(ValidationError, match="not among the tiers"):
        ChatGravity(tiers=[Tier(name="a"), Tier(name="b")], route=RouteConfig(tasks={"x": "c"}))
    with pytest.raises(ValidationError, match="direct_below"):
        RouteConfig(direct_below=-0.1)
    with pytest.raises(ValidationError):
        RouteConfig(escalate_quantile=0)
