"""Drafting inside gravity zones on the transformers backend: the output stays the model's own, token for token."""

from __future__ import annotations

import pytest
import torch
from agent_gravity.backends._speculation import Drafter, DraftSpec, lookup
from agent_gravity.trim.gravity_zone import GravityZone
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import ValidationError

from agent_gravity import ChatGravity, ComputeConfig, GravityConfig, InvalidCallOptionError, SpeculationConfig

COPY = ('Copy this JSON exactly, then add a field "ok": true.\n{"id": 4172, "name": "Ada Lovelace", '
        '"city": "London", "tags": ["math", "engine", "notes"], "year": 1843}')
OFF = GravityConfig(enabled=False, reasoning=None, max_answer_tokens=64)


def test_lookup_takes_the_longest_match_and_its_most_recent_occurrence():
    assert lookup([1, 2, 3, 9, 2, 3, 7, 5, 2, 3], ngram=2, tokens=3) == [7, 5, 2]  # "2 3" last seen before "7 5"
    assert lookup([1, 2, 3, 4, 8, 3, 4, 5, 0, 2, 3, 4], ngram=3, tokens=2) == [8, 3]  # "2 3 4" beats "3 4"
    assert lookup([5, 6, 7, 6], ngram=3, tokens=4) == [7, 6]  # only "6" recurs; what follows it, to the end
    assert lookup([1, 2, 3], ngram=3, tokens=4) == [] == lookup([4], ngram=3, tokens=4)


def test_the_drafter_drafts_only_inside_a_zone_and_adapts_its_length_to_what_is_kept():
    drafter = Drafter(DraftSpec(max_draft=6, ngram=2), GravityZone(1.0, 3))
    context = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert drafter.draft(context, torch.tensor([0.2, 3.0, 0.1, 0.1]), room=10) == []  # mean 1.07: not a zone
    assert drafter.draft(context, torch.tensor([float("nan"), 0.1, 0.1]), room=10) == []  # unknown entropy
    assert drafter.draft(context, torch.tensor([0.1, 0.1]), room=10) == []  # too few tokens seen
    assert drafter.draft(context, torch.tensor([0.1, 0.2, 0.3]), room=10) == [3, 4, 5]
    for position in range(3):
        drafter.kept(position)
    assert drafter.draft(context, torch.tensor([0.1, 0.2, 0.3]), room=10) == [3, 4, 5, 6, 7]  # kept whole: longer
    drafter.kept(3)
    assert drafter.draft(context, torch.tensor([0.1, 0.2, 0.3]), room=2) == [3, 4]  # missed after one: shorter, room
    assert drafter.length == 4
    drafter.close()
    assert drafter.report.as_dict() == {"drafted": 10, "accepted": 4, "passes": 3, "acceptance": 0.4,
                                        "accepted_at": [0, 1, 2, 3], "layer_drafted": 0, "layer_accepted": 0}


def test_the_layer_skipped_model_drafts_only_where_the_context_has_no_match():
    asked = []

    def by_layers(n):
        asked.append(n)
        return [9] * n

    drafter = Drafter(DraftSpec(max_draft=6, ngram=2, layers=(3, 4)), GravityZone(1.0, 2))
    low = torch.tensor([0.1, 0.1])
    assert drafter.draft([1, 2, 3, 1, 2], low, room=10, by_layers=by_layers) == [3, 1, 2] and asked == []
    assert drafter.draft([5, 6, 7], low, room=10, by_layers=by_layers) == [9, 9] and asked == [2]  # after a miss
    drafter.kept(0)
    assert drafter.draft([5, 6, 7], torch.tensor([3.0, 3.0]), room=10, by_layers=by_layers) == []  # not a zone
    report = drafter.report
    assert (report.layer_drafted, report.layer_accepted, report.drafted, report.accepted) == (2, 1, 5, 1)
    no_layers = Drafter(DraftSpec(max_draft=6, ngram=2), GravityZone(1.0, 2))
    assert no_layers.draft([5, 6, 7], low, room=10, by_layers=by_layers) == [] and asked == [2]


def test_settings_are_bounded():
    with pytest.raises(ValidationError, match="max_draft"):
        SpeculationConfig(max_draft=10_000)
    with pytest.raises(ValidationError, match="below"):
        ComputeConfig(below=0)


def _pair(backend, messages, **options):
    plain = ChatGravity(backend=backend, **options).invoke(messages)
    drafted = ChatGravity(backend=backend, compute=ComputeConfig(), **options).invoke(messages)
    return plain, drafted


def test_layer_drafts_change_no_token_either(transformers_backend):
    question = [HumanMessage("Write the numbers from 1 to 30, separated by commas.")]
    layered = ComputeConfig(speculate=SpeculationConfig(ngram=1, layers=tuple(range(10, 20))))
    plain = ChatGravity(backend=transformers_backend, gravity=OFF).invoke(question)
    drafted = ChatGravity(backend=transformers_backend, gravity=OFF, compute=layered).invoke(question)
    report = drafted.response_metadata["gravity"]["compute"]["speculation"]
    assert drafted.content == plain.content and report["layer_drafted"] > 0


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_drafting_changes_no_token_and_keeps_most_drafts_when_the_answer_copies(transformers_backend, temperature):
    plain, drafted = _pair(transformers_backend, COPY, gravity=OFF, temperature=temperature, seed=3)
    assert drafted.content == plain.content and drafted.usage_metadata == plain.usage_metadata
    assert drafted.response_metadata["gravity"]["entropy"] == pytest.approx(plain.response_metadata["gravity"]["entropy"],
                                                                            abs=1e-3)
    report = drafted.response_metadata["gravity"]["compute"]["speculation"]
    assert plain.response_metadata["gravity"]["compute"] is None
    assert report["drafted"] > 0 and report["passes"] > 0
    # sampled tokens are verified against the model's own sample, so fewer drafts survive than under greedy copying
    assert report["acceptance"] > (0.5 if temperature == 0.0 else 0.0) and report["accepted"] > 0


def test_exits_probes_and_the_answer_are_the_same_with_drafting(transformers_backend):
    question = [HumanMessage("A shop sells pens at 3 dollars each. Mia buys 7 pens. How much does she pay?")]
    plain, drafted = _pair(transformers_backend, question, gravity=GravityConfig(max_reasoning_tokens=80,
                                                                                max_answer_tokens=24))
    keys = ("exit", "reason", "reasoning_tokens", "answer_tokens", "probe_steps", "probe_answers", "lock_step")
    assert drafted.content == plain.content
    assert drafted.additional_kwargs == plain.additional_kwargs
    assert {k: drafted.response_metadata["gravity"][k] for k in keys} == {
        k: plain.response_metadata["gravity"][k] for k in keys}


def test_a_drafted_turn_leaves_the_session_cache_as_an_undrafted_one_does(transformers_backend):
    first = [HumanMessage(COPY)]
    chat = ChatGravity(backend=transformers_backend, gravity=OFF, compute=ComputeConfig())
    one = chat.invoke(first, conversation_id="drafted-turns")
    assert one.response_metadata["gravity"]["compute"]["speculation"]["accepted"] > 0
    second = [*first, AIMessage(one.content), HumanMessage("Now give only the name.")]
    two = chat.invoke(second, conversation_id="drafted-turns")
    assert two.response_metadata["gravity"]["session"]["reused_tokens"] > 0
    fresh = ChatGravity(backend=transformers_backend, gravity=OFF).invoke(second)
    assert two.content == fresh.content
    transformers_backend.end_session("drafted-turns")


def test_a_backend_that_cannot_draft_refuses_and_says_what_to_use():
    class NoDrafts:
        provider, model_name, max_context, eos_ids = "vllm", "m", 4096, (0,)

        def render(self, chat, prefill=""):
            return [1, 2, 3]

    with pytest.raises(InvalidCallOptionError, match="speculative-config.*refuses custom logits processors"):
        ChatGravity(backend=NoDrafts(), gravity=OFF, compute=ComputeConfig()).invoke("hi")
