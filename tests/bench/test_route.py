"""Routing on the real engine: adaptive thinking and tiered cascades through ChatGravity, ``bench route`` and
``calibrate --route`` end to end in a reduced size, and the deferral bookkeeping on known answers."""

from __future__ import annotations

import json

import pytest

from agent_gravity import ChatGravity, GravityConfig, RouteConfig, Tier
from agent_gravity._cli import main
from agent_gravity._profile import load_profile
from agent_gravity.bench.route import REASON, THRESHOLDS, adaptive_results, deferral_curves
from agent_gravity.bench.savings import ItemResult
from agent_gravity.bench.tasks import Task
from tests.bench import SMALL

QUESTION = "Tom has 3 apples and buys 5 more. How many apples does he have?"


def _item(answer: str, correct: bool, reasoning: int = 10, scores: dict | None = None, prompt: int = 5,
          route: dict | None = None) -> ItemResult:
    return ItemResult("i", "k", answer, reasoning, reasoning + 2, 0, 0, 1.0, None, False, correct,
                      prompt_tokens=prompt, route=route, entropy_scores=scores or {})


def _task(i: int) -> Task:
    return Task(f"t-{i}", "word_problems", "q", "number", str(i))


def test_deferral_curves_send_the_highest_scores_up_first_and_random_is_the_straight_line():
    tasks = [_task(i) for i in range(4)]
    top = [_item(str(i), True) for i in range(4)]
    # the cheap tier is wrong exactly where its entropy is high, and the longest prompts are the easy ones
    cheap = [_item("0", True, scores={"q90": 0.1}, prompt=9), _item("x", False, scores={"q90": 2.0}, prompt=1),
             _item("2", True, scores={"q90": 0.2}, prompt=8), _item("y", False, scores={"q90": 3.0}, prompt=2)]
    curves = deferral_curves(tasks, cheap, top)
    q90 = curves["routers"]["entropy q90"]["kept"]
    assert q90[0] == 0.5 and q90[5] == 1.0 and q90[-1] == 1.0  # half sent up: both wrong ones
    assert curves["routers"]["random"]["kept"][5] == pytest.approx(0.75)
    assert curves["routers"]["length"]["kept"][5] == 0.5  # the two longest prompts were already right
    assert curves["dominates"] == {"random": True, "length": True} and curves["goal"]["dominates_random_and_length"]


def test_adaptive_results_take_the_direct_answer_under_the_threshold_and_charge_the_probe_otherwise():
    reason = [_item("8", True, reasoning=40), _item("9", True, reasoning=40)]
    direct = [_item("8", True, reasoning=0, route={"direct_score": 0.05}),
              _item("3", False, reasoning=0, route={"direct_score": 0.9})]
    mixed = adaptive_results(direct, reason, 0.1)
    assert [r.answer for r in mixed] == ["8", "9"] and mixed[0].reasoning_tokens == 0
    assert mixed[1].probe_tokens == direct[1].output_tokens and THRESHOLDS == tuple(sorted(THRESHOLDS))


@pytest.mark.engine
def test_adaptive_thinking_on_the_engine_answers_directly_or_reasons_as_the_threshold_says(chat):
    plain = chat.invoke(QUESTION)
    sure = chat.invoke(QUESTION, route=RouteConfig(think="adaptive", direct_below=64.0))
    g = sure.response_metadata["gravity"]
    assert g["route"]["route"] == "direct" and g["reasoning_tokens"] == 0 and sure.content.strip()
    assert g["route"]["direct_score"] is not None and g["route"]["probe_tokens"] >= 1
    never = chat.invoke(QUESTION, route=RouteConfig(think="adaptive", direct_below=0.0))
    assert never.response_metadata["gravity"]["route"]["route"] == "reason" and never.content == plain.content


@pytest.mark.engine
def test_a_cascade_on_the_engine_keeps_the_cheap_answer_or_gives_the_full_tiers(chat):
    cheap = GravityConfig(max_reasoning_tokens=16, min_tokens=8)

    def tiered(above: float, carry: bool = False) -> ChatGravity:
        return ChatGravity(backend=chat.get_backend(), tiers=[Tier(name="cheap", gravity=cheap), Tier(name="full")],
                           route=RouteConfig(escalate_above=above, escalate_unsettled=False, carry=carry))

    stays = tiered(64.0).invoke(QUESTION)
    assert stays.response_metadata["gravity"]["route"]["tier"] == "cheap"
    assert stays.content == chat.invoke(QUESTION, gravity=cheap).content
    goes = tiered(0.0).invoke(QUESTION)
    route = goes.response_metadata["gravity"]["route"]
    assert route["tier"] == "full" and route["tried"][0]["tier"] == "cheap" and route["tried"][0]["escalated"]
    assert goes.content == chat.invoke(QUESTION).content and "carried_tokens" not in route
    # escalating on the cheap output's highest entropy: the full tier goes on from the reasoning before it
    entropy = stays.response_metadata["gravity"]["entropy"][:16]  # the cheap tier's reasoning budget
    above = sorted(set(entropy))[-2]
    first_unsure = next(i for i, e in enumerate(entropy) if e > above)
    tiers = [Tier(name="cheap", gravity=cheap), Tier(name="full")]
    carried = ChatGravity(backend=chat.get_backend(), tiers=tiers, route=RouteConfig(
        escalate_above=above, escalate_quantile=1.0, escalate_unsettled=False)).invoke(QUESTION)
    route = carried.response_metadata["gravity"]["route"]
    assert route["tier"] == "full" and carried.content.strip()
    assert 1 <= first_unsure < 16 and route["carried_tokens"] == first_unsure
    assert carried.additional_kwargs["reasoning_content"][:8] == stays.additional_kwargs["reasoning_content"][:8]


@pytest.mark.engine
def test_bench_route_reports_held_out_thresholds_baselines_deferral_curves_and_online_arms(chat, tmp_path, capsys):
    families = ["word_problems", "dates"]
    assert main(["bench", "route", "--per-family", "2", "--families", *families, "--epsilon", "0.5", "--delta", "0.5",
                 "--cheap-reasoning-tokens", "16", *SMALL, "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert all(f in table for f in families) and "adaptive goal" in table and "deferral areas" in table
    report = json.loads((tmp_path / "route.json").read_text())
    assert report["budgets"] == {"reasoning": 64, "answer": 32} and report["cheap_tier"]["max_reasoning_tokens"] == 16
    assert all(r["reasoning_tokens"] <= 64 for r in report["per_item"]["full"])
    assert report["items"] == 4 and list(report["methods"]) == ["full", "reason", "direct", "cheap", "adaptive",
                                                                "cascade"]
    direct = report["per_item"]["direct"]
    assert all(r["reasoning_tokens"] == 0 and r["route"]["route"] == "direct" for r in direct)
    for row in report["adaptive"]["families"]:
        assert row["family"] not in row["calibration_families"] and row["items"] == 2
        below = None if row["chosen"] == REASON else float(row["chosen"].split("<=")[1])
        assert below is None or below in THRESHOLDS
        scores = [r["route"]["direct_score"] for r in direct if r["kind"] == row["family"]]
        direct_below = [s is not None and s <= below for s in scores] if below is not None else [False] * len(scores)
        assert row["direct_share"] == sum(direct_below) / len(scores)
    curves = report["deferral"]
    assert curves["shares"][0] == 0 and curves["shares"][-1] == 1
    for router in curves["routers"].values():  # nothing sent up: the cheap tier's quality; everything: the top's
        assert router["kept"][-1] == 1.0 and router["kept"][0] == curves["routers"]["random"]["kept"][0]
    # online, the cascade keeps a call on the cheap tier exactly when that tier's verdict did not send it up
    above, routes = report["cascade"]["escalate_above"], [r["route"] for r in report["per_item"]["cascade"]]
    cheap = [route["tried"][0] if route["tried"] else route for route in routes]  # the cheap tier's verdict
    assert all(c["tier"] == "cheap" for c in cheap)
    assert [r["tier"] == "cheap" for r in routes] == [not c["escalated"] for c in cheap]
    assert report["cascade"]["kept_on_cheap"] == sum(not c["escalated"] for c in cheap) / len(cheap)
    for c in cheap:  # above the threshold (or no score) always goes up; at or under it only for a reason of its own
        assert c["escalated"] == (c["why"] is not None)
        if c["score"] is None or c["score"] > above:
            assert c["escalated"] and c["why"] != "probes unsettled"
        else:
            assert c["why"] in (None, "no answer", "probes unsettled")
    assert report["seconds_per_token"]["cheap"] > 0
    assert (tmp_path / "route.png").stat().st_size > 1000


@pytest.mark.engine
def test_calibrate_route_writes_a_threshold_chat_gravity_then_routes_with(chat, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGENT_GRAVITY_PROFILES", str(tmp_path))
    assert main(["calibrate", "--route", "--per-family", "2", "--families", "word_problems", "dates",
                 "--epsilon", "0.9", "--delta", "0.5", *SMALL]) == 0
    assert "wrote" in capsys.readouterr().out
    found = load_profile("SmolLM2-135M-Instruct").route
    assert found.items == 4 and found.families == ["dates", "word_problems"] and len(found.tests) >= 1
    # at these loose levels the most conservative threshold is certified on 4 items, so the profile carries one
    assert found.direct_below in THRESHOLDS and found.bound <= found.epsilon
    route = chat.invoke(QUESTION, route=RouteConfig(think="adaptive")).response_metadata["gravity"]["route"]
    assert route["direct_below"] == found.direct_below
    sure = route["direct_score"] is not None and route["direct_score"] <= found.direct_below
    assert route["route"] == ("direct" if sure else "reason")
