"""Leave-one-family-out bookkeeping, the answer-loss measure and the paraphrase check, on synthetic answers."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from agent_gravity.bench import heldout
from agent_gravity._config import GravityConfig
from agent_gravity.bench.savings import Answers, Budgets, ItemResult, answer_lost, reference_figures, summarize
from agent_gravity.bench.tasks import Task

FAMILIES = ("alpha", "beta", "gamma")


def task(family: str, i: int, answer: str | None = "4") -> Task:
    return Task(f"{family}-{i:04d}", family, f"{family} question {i}?", answer,
                "number" if answer else "free_text", f"{family}-p{i // 2:04d}")


def result(t: Task, answer: str, reasoning: int = 40, capped: bool = False, early: bool = False,
           finish: str = "stop") -> ItemResult:
    reason = "gravity" if early else "reasoning_budget" if capped else "model_ended"
    return ItemResult(t.id, t.kind, answer, reasoning, reasoning + 4, 0, 0, 0.1, reason, early,
                      t.answer is not None and answer == t.answer, finish_reason=finish)


TASKS = [task(f, i) for f in FAMILIES for i in range(60)]
FULL = [result(t, "4", 40) for t in TASKS]


def test_answer_loss_counts_changes_where_the_full_run_settled_and_only_real_losses_where_it_was_capped():
    t, free = task("alpha", 0), task("alpha", 1, None)
    settled, capped = result(t, "4"), result(t, "4", 256, capped=True)
    assert answer_lost(t, settled, result(t, "5")) and not answer_lost(t, settled, result(t, "4"))
    assert answer_lost(t, capped, result(t, "5")), "a capped run that was right and is now wrong lost it"
    wrong_capped = result(t, "7", 256, capped=True)
    assert not answer_lost(t, wrong_capped, result(t, "9")), "an arbitrary wrong answer changing is no loss"
    ramble = result(free, "the cat sat", 256, capped=True)
    reference = result(free, "the cat sat on the mat")
    assert answer_lost(free, ramble, result(free, "dogs bark loudly"), reference)
    assert not answer_lost(free, ramble, result(free, "dogs bark loudly"), result(free, "x", 1024, capped=True)), \
        "an unsettled reference judges nothing"
    looping = result(free, "1000000000000", 12, finish="length")
    assert looping.capped and not settled.capped, "an answer cut by the output cap is no settled reference"
    assert not answer_lost(free, looping, result(free, "100")), "a repeating answer cut shorter is no loss"
    assert answer_lost(free, looping, result(free, "the bees"), result(free, "1000000000000", 12)), \
        "unless its longer-budget reference settled on the full answer"
    assert result(free, "x", 40, finish="length").capped and not result(free, "x", 1024, capped=False).capped


def test_summary_splits_settled_and_capped_items_and_judges_capped_ones_by_accuracy_and_reference():
    tasks = [task("alpha", i) for i in range(4)]
    full = [result(tasks[0], "4"), result(tasks[1], "4"), result(tasks[2], "4", 256, True),
            result(tasks[3], "9", 256, True)]
    ours = [result(tasks[0], "4", 10), result(tasks[1], "5", 40), result(tasks[2], "3", 10), result(tasks[3], "4", 10)]
    refs = {tasks[2].id: result(tasks[2], "4", 300), tasks[3].id: result(tasks[3], "4", 1024, True)}
    s = summarize(tasks, full, ours, 1.0, refs)
    assert s["kept_settled"]["value"] == 0.5 and s["kept_settled"]["n"] == 2
    assert s["capped_accuracy_change"]["value"] == pytest.approx(0.0), "one right answer lost, one gained"
    assert s["capped_kept_vs_reference"]["n"] == 1 and s["capped_kept_vs_reference"]["value"] == 0.0
    assert s["answer_loss"]["value"] == 0.5 and s["lost_in_answer"] == 1, "one loss kept all of its reasoning"
    assert s["reasoning_saved_settled"]["value"] == pytest.approx(1 - 50 / 80), "40+40 settled tokens became 10+40"
    assert s["reasoning_saved_capped"]["value"] == pytest.approx(1 - 20 / 512)
    assert s["capped_reasoning_share"] == pytest.approx(512 / 592)
    ref = reference_figures(tasks, full, refs)
    assert ref["capped_items"] == 2 and ref["reference_settled"]["value"] == 0.5 and ref["answer_capped_items"] == 0
    full[1] = result(tasks[1], "4", finish="length")
    s = summarize(tasks, full, ours, 1.0, {**refs, tasks[1].id: result(tasks[1], "4", 40, finish="length")})
    assert s["kept_settled"]["n"] == 1 and s["capped_accuracy_change"]["n"] == 3, "the answer-capped item is capped"
    assert s["answer_loss"]["value"] == 0.5, "its right answer turned wrong: still a real loss"
    assert s["reasoning_saved_settled"]["value"] == pytest.approx(1 - 50 / 80) and s["capped_reasoning_share"] == \
        pytest.approx(512 / 592), "its reasoning closed by itself: it is no ramble in where the saving comes from"
    ref = reference_figures(tasks, full, {**refs, tasks[1].id: result(tasks[1], "4", 40, finish="length")})
    assert ref["capped_items"] == 3 and ref["answer_capped_items"] == 1 and ref["settled_items"] == 1
    assert ref["full_agrees_with_reference"]["value"] == 1.0


def test_references_get_more_reasoning_and_more_answer_budget_for_the_capped_items_only(monkeypatch):
    from agent_gravity.bench import savings

    seen = []

    def run_method(model, tasks, config, concurrency):
        seen.append((config, [t.id for t in tasks]))
        return [result(t, "4", 300) for t in tasks], 1.0

    monkeypatch.setattr(savings, "run_method", run_method)
    tasks = [task("alpha", i) for i in range(3)]
    full = [result(tasks[0], "4"), result(tasks[1], "4", 256, capped=True), result(tasks[2], "4", finish="length")]
    refs = savings.run_references(None, tasks, full, 2)
    (config, ids), = seen
    assert ids == [tasks[1].id, tasks[2].id] and set(refs) == set(ids) and not config.enabled
    assert (config.max_reasoning_tokens, config.max_answer_tokens) == (1024, 1024), "4x both budgets"


def test_no_item_of_the_held_out_family_reaches_calibration():
    folds = heldout.folds(TASKS)
    assert [f.family for f in folds] == list(FAMILIES)
    for f in folds:
        assert all(TASKS[i].kind == f.family for i in f.evaluation) and len(f.evaluation) == 60
        assert all(TASKS[i].kind != f.family for i in f.calibration) and len(f.calibration) == 120
    with pytest.raises(ValueError, match="at least two task families"):
        heldout.folds(TASKS[:60])


def _answers(losing_family: str | None) -> Answers:
    """'safe' never changes an answer; 'bold' saves more and loses a third of ``losing_family``'s answers."""
    safe = [result(t, "4", 30) for t in TASKS]
    bold = [result(t, "5" if t.kind == losing_family and i % 3 == 0 else "4", 10) for i, t in enumerate(TASKS)]
    return Answers(TASKS, FULL, {}, {"full": FULL, "safe": safe, "bold": bold})


def test_each_fold_calibrates_on_the_other_families_only():
    """'bold' loses answers only on gamma: calibrating without gamma certifies it, and gamma then shows the
    loss the calibration could not see, which the report flags against epsilon."""
    report = heldout.leave_one_family_out(_answers("gamma"), ["safe", "bold"], "safe", 0.05, 0.1, ["safe"])
    rows = {r["family"]: r for r in report["families"]}
    assert rows["gamma"]["chosen"] == "bold" and rows["gamma"]["calibration_families"] == ["alpha", "beta"]
    assert rows["gamma"]["held_out"]["answer_loss"]["value"] == pytest.approx(20 / 60)
    assert not rows["gamma"]["loss_within_epsilon"] and not report["goal"]["loss_within_epsilon_on_every_family"]
    assert rows["alpha"]["chosen"] == "safe", "with gamma in calibration, bold is refused"
    assert report["worst"]["answer_loss"]["family"] == "gamma"
    assert report["worst"]["kept_settled"]["value"] == pytest.approx(40 / 60)
    assert "gamma" in report["goal"]["families_missing"]
    assert rows["alpha"]["compared"]["safe"]["reasoning_saved"]["value"] == pytest.approx(0.25)


def test_the_fallback_is_kept_when_no_candidate_is_certified():
    answers = _answers("alpha")
    report = heldout.leave_one_family_out(answers, ["bold"], "safe", 0.05, 0.1)
    rows = {r["family"]: r for r in report["families"]}
    assert rows["beta"]["chosen"] == "safe" and not rows["beta"]["bound_met"] and rows["beta"]["bound"] is None
    assert rows["alpha"]["chosen"] == "bold", "without alpha, bold loses nothing and is certified"


def test_paraphrase_check_compares_twin_discordance_with_random_pairs():
    tasks = [task(f, i) for f in FAMILIES for i in range(40)]
    full = [result(t, "4") for t in tasks]
    # The first twin of every other pair loses its answer, the second keeps it: wording decides.
    by_wording = [result(t, "5" if i % 4 == 0 else "4", 10, early=True) for i, t in enumerate(tasks)]
    check = heldout.paraphrase_check(Answers(tasks, full, {}, {"m": by_wording}), "m")
    assert check["pairs"] == 60 and check["discordant"] == pytest.approx(0.5) and check["lost_items"] == 30
    assert check["discordant"] > check["chance"] and check["p_value"] < 0.05
    # Both twins of a pair share their fate: far less discordant than random pairs.
    by_pair = [result(t, "5" if (i // 2) % 2 == 0 else "4", 10, early=True) for i, t in enumerate(tasks)]
    same = heldout.paraphrase_check(Answers(tasks, full, {}, {"m": by_pair}), "m")
    assert same["discordant"] == 0.0 and same["chance"] > 0.3 and same["p_value"] == 1.0
    # Questions with no early exit in either wording could lose nothing: they are not counted.
    quiet = [result(t, "4", 40, early=i < 8) for i, t in enumerate(tasks)]
    assert heldout.paraphrase_check(Answers(tasks, full, {}, {"m": quiet}), "m")["pairs"] == 4


def test_risk_control_counts_questions_not_wordings():
    """Twins are not independent: a question whose two wordings both lose counts once, and so does one where
    only one wording loses."""
    tasks = [task("alpha", i) for i in range(8)]
    full = [result(t, "4") for t in tasks]
    ours = [result(t, "5" if i in (0, 1, 2) else "4") for i, t in enumerate(tasks)]
    answers = Answers(tasks, full, {}, {"m": ours})
    assert answers.losses("m", range(8)) == [1, 1, 1, 0, 0, 0, 0, 0]
    assert answers.question_losses("m", range(8)) == [1, 1, 0, 0]
    assert answers.select(["m"], range(8), 0.5, 0.5).test("m").n == 4


def test_the_split_table_names_every_family_the_worst_why_answers_were_lost_and_the_verdict():
    bold = _answers("gamma").runs["bold"]
    lossy = [dataclasses.replace(r, reason="gravity", terminated_early=True, probe_confidence=(0.3, 0.5))
             if r.answer == "5" else r for r in bold]
    runs = {"full": FULL, "default": lossy, "dynasor": FULL, "vllm_budget": FULL}
    report = heldout.analyse(heldout.Experiment("m", Answers(TASKS, FULL, {}, runs), {}, 10, 8, {}), ["default"],
                             0.05, 0.1)
    text = heldout.table(report)
    assert all(f in text for f in FAMILIES) and "worst family" in text and "goal: not met" in text
    assert "why default lost answers: by exit {'gravity': 20} (0 with all of the full run's reasoning" in text
    assert "least probe confidence 0.30" in text
    assert not math.isnan(report["split"]["mean"]["reasoning_saved"])
    assert "in rambles it ran into the reasoning budget" in text and "(0%)" in text, "no family had a capped ramble"
    assert "the full run settled 180 items and was capped on 0 (0 of them answers" in text


def test_a_free_text_family_is_not_failed_on_accuracy_it_cannot_have():
    tasks = [task(f, i) for f in ("alpha", "beta") for i in range(60)] + [task("prose", i, None) for i in range(60)]
    full = [result(t, "4" if t.answer else "a short sentence") for t in tasks]
    ours = [result(t, r.answer, 10) for t, r in zip(tasks, full, strict=True)]
    report = heldout.leave_one_family_out(Answers(tasks, full, {}, {"m": ours}), ["m"], "m", 0.05, 0.1)
    prose = next(r for r in report["families"] if r["family"] == "prose")
    assert math.isnan(prose["held_out"]["accuracy_change"]["value"]) and all(prose["goal"].values())
    assert report["worst"]["accuracy_change"]["family"] != "prose" and report["goal"]["every_family"]


def test_a_saved_split_run_is_analysed_again_to_the_same_report(tmp_path):
    runs = {"full": FULL, "default": [result(t, "4", 20, early=True) for t in TASKS],
            "dynasor": FULL, "vllm_budget": FULL}
    experiment = heldout.Experiment("m", Answers(TASKS, FULL, {}, runs), {n: 1.0 for n in runs}, 20, 8, {})
    report = heldout.main(experiment, ["default"], 0.05, 0.1, tmp_path)
    again = heldout.analyse(heldout.load_experiment(tmp_path / "savings.json"), ["default"], 0.05, 0.1)
    assert json.loads(json.dumps(again)) == json.loads((tmp_path / "savings.json").read_text())
    assert report["split"]["families"][0]["chosen"] == "default" and (tmp_path / "savings.png").exists()
    (tmp_path / "other.json").write_text('{"model": "m"}')
    with pytest.raises(ValueError, match="not the savings.json of a split run"):
        heldout.load_experiment(tmp_path / "other.json")
    old = json.loads((tmp_path / "savings.json").read_text())
    for r in old["per_item"]["full"]:
        del r["finish_reason"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="predates finish reasons.*without --baseline or --answers"):
        heldout.load_experiment(tmp_path / "old.json")


def test_a_baseline_run_supplies_the_full_and_reference_answers_and_only_steered_methods_run(monkeypatch, tmp_path):
    refs = {TASKS[0].id: result(TASKS[0], "4", 1024, capped=True)}
    baseline = heldout.Experiment("m", Answers(TASKS, FULL, refs, {"full": FULL}), {"full": 9.0}, 20, 8,
                                  {"default": GravityConfig().model_dump(mode="json")})
    ran = []

    def run_method(model, tasks, config, concurrency):
        ran.append(config.enabled)
        return [result(t, "4", 20, early=True) for t in tasks], 1.0

    monkeypatch.setattr(heldout, "run_method", run_method)
    monkeypatch.setattr(heldout, "_warm", lambda *a: None)
    monkeypatch.setattr(heldout, "ChatGravity", lambda **kw: None)
    model = type("Model", (), {"gravity": None, "get_backend": lambda self: type("B", (), {"model_name": "m"})()})()
    experiment = heldout.answer_all(model, TASKS, 8, lambda n: None, baseline=baseline)
    assert experiment.answers.full is FULL and experiment.answers.references == refs and experiment.walls["full"] == 9.0
    assert ran == [True] * (len(heldout.GRID) + 1) + [False], "the grid and Dynasor ran again, then vLLM's budget"
    with pytest.raises(ValueError, match="model 'm', this one 'other'"):
        heldout.check_baseline(baseline, TASKS, "other")
    with pytest.raises(ValueError, match="answered other items"):
        heldout.check_baseline(baseline, TASKS[:-1])
    with pytest.raises(ValueError, match="budgets 256/256, this one 64/32: pass the same --max-reasoning-tokens"):
        heldout.answer_all(model, TASKS, 8, lambda n: None, baseline=baseline, budgets=Budgets(64, 32))


def test_the_cli_refuses_a_baseline_of_other_items_before_starting_the_engine(tmp_path, capsys):
    from agent_gravity._cli import main

    runs = {"full": FULL, "default": FULL, "dynasor": FULL, "vllm_budget": FULL}
    heldout.main(heldout.Experiment("m", Answers(TASKS, FULL, {}, runs), {}, 20, 8, {}), ["default"], 0.05, 0.1,
                 tmp_path)
    assert main(["bench", "savings", "--tasks", "families", "--split", "leave-one-family-out", "--per-family", "2",
                 "--baseline", str(tmp_path / "savings.json")]) == 2
    assert "answered other items" in capsys.readouterr().err
