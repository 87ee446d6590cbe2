"""bench groups: seeded long structured outputs, figures as ratios to the full group, and a small run."""

from __future__ import annotations


from agent_gravity.bench import groups
from agent_gravity.bench.structured_tasks import KINDS, generate_structured_tasks


def test_structured_tasks_are_seeded_cover_every_kind_and_judge_by_their_values():
    tasks = generate_structured_tasks(2, seed=5)
    assert tasks == generate_structured_tasks(2, seed=5) != generate_structured_tasks(2, seed=6)
    assert [t.kind for t in tasks[:len(KINDS)]] == list(KINDS) and len(tasks) == 2 * len(KINDS)
    for t in tasks:
        assert t.facts and all(f in t.question or f.startswith("def get_") for f in t.facts)
        assert t.correct(" ".join(t.facts)) and not t.correct("")


def _run(item, group, total, drafted=0, accepted=0, text="same"):
    return groups.Run(item, group, 0.5, total, 10, text, True, drafted, accepted, 1 if drafted else 0)


def test_ratios_are_paired_with_the_full_group_and_idle_items_are_reported_apart():
    runs = [_run("a", "full", 2.5), _run("b", "full", 4.5),
            _run("a", "lossless", 1.5, drafted=8, accepted=6), _run("b", "lossless", 4.5, text="other")]
    s = groups.summarize(runs, ["full", "lossless"])["lossless"]
    assert s["decode_speedup"]["value"] == (2.0 + 4.0) / (1.0 + 4.0)
    assert s["total_ratio"]["value"] == 6.0 / 7.0 and s["acceptance"] == 0.75 and s["passes_saved"] == 6 / 20
    assert s["identical_to_full"]["value"] == 0.5
    assert s["never_drafted"]["items"] == 1 and s["never_drafted"]["total_ratio"]["value"] == 1.0
    full = groups.summarize(runs, ["full", "lossless"])["full"]
    assert full["decode_speedup"]["value"] == 1.0 and full["never_drafted"]["items"] == 2


def test_a_small_run_keeps_every_answer_and_writes_its_report(transformers_backend, tmp_path):
    report = groups.main(transformers_backend, 0, 1, ["full", "lossless"], tmp_path, lambda _: None)
    s = report["sets"]["structured"]["lossless"]
    assert s["identical_to_full"]["value"] == 1.0 and s["drafted"] > 0
    assert (tmp_path / "groups.json").exists() and (tmp_path / "groups.png").exists()
    assert "lossless" in groups.table(report)
