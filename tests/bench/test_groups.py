"""bench groups: seeded long structured outputs, figures as ratios to the full group, and a small run."""

from __future__ import annotations


from agent_gravity._cli import _GROUPS
from agent_gravity.bench import groups
from agent_gravity.bench.structured_tasks import KINDS, generate_structured_tasks


def test_structured_tasks_are_seeded_cover_every_kind_and_judge_by_their_values():
    tasks = generate_structured_tasks(2, seed=5)
    assert tasks == generate_structured_tasks(2, seed=5) != generate_structured_tasks(2, seed=6)
    assert [t.kind for t in tasks[:len(KINDS)]] == list(KINDS) and len(tasks) == 2 * len(KINDS)
    for t in tasks:
        assert t.facts and all(f in t.question or f.startswith("def get_") for f in t.facts)
        assert t.correct(" ".join(t.facts)) and not t.correct("")


def _run(item, group, total, drafted=0, accepted=0, text="same", **more):
    return groups.Run(item, group, 0.5, total, 10, text, True, text, drafted, accepted, 1 if drafted else 0, **more)


def test_ratios_are_paired_with_the_full_group_and_idle_items_are_reported_apart():
    runs = [_run("a", "full", 2.5, kv_bytes=400), _run("b", "full", 4.5, kv_bytes=400),
            _run("a", "lossless", 1.5, drafted=8, accepted=6, kv_bytes=400),
            _run("b", "lossless", 4.5, text="other", kv_bytes=400),
            _run("a", "kv8", 2.5, kv_bytes=100, zone_entries=4, zone_bytes_held=100, zone_bytes_full=300, forced=10,
                 forced_same=9),
            _run("b", "kv8", 4.5, kv_bytes=300, skip_steps=2, layer_passes_saved=6, forced=10, forced_same=10)]
    report = groups.summarize(runs, ["full", "lossless", "kv8"], layers=3)
    s = report["lossless"]
    assert s["decode_speedup"]["value"] == (2.0 + 4.0) / (1.0 + 4.0)
    assert s["total_ratio"]["value"] == 6.0 / 7.0 and s["acceptance"] == 0.75 and s["passes_saved"] == 6 / 20
    assert s["identical_to_full"]["value"] == 0.5 == s["answers_kept"]["value"]
    assert s["idle"]["items"] == 1 and s["idle"]["total_ratio"]["value"] == 1.0
    kv = report["kv8"]
    assert kv["kv_bytes_fewer"]["value"] == 2.0 and kv["zone_bytes_fewer"] == 3.0
    assert kv["teacher_forced_top1"]["value"] == 19 / 20 and kv["layer_passes_saved"] == 6 / 60
    full = report["full"]
    assert full["decode_speedup"]["value"] == 1.0 and full["idle"]["items"] == 2 and full["zone_bytes_fewer"] is None


def test_the_cli_lists_every_group():
    assert list(_GROUPS) == list(groups.GROUPS)


def test_a_small_run_writes_its_report_with_top2_on_the_sampled_set_only(transformers_backend, tmp_path):
    report = groups.main(transformers_backend, 1, 0, ["full", "never-zone", "kv8", "skip", "top2"], tmp_path,
                         lambda _: None)
    assert set(report["sets"]) == {"savings", "sampled"} and report["layers"] == 30
    assert set(report["sets"]["savings"]) == {"full", "never-zone", "kv8", "skip"}
    assert set(report["sets"]["sampled"]) == {"full", "top2"}
    assert report["sets"]["savings"]["never-zone"]["idle"]["items"] == 1, "no zone that certain: nothing drafted"
    assert report["layers_used"]["source"]["skip"].startswith("middle quarter (not calibrated")
    kv8 = report["sets"]["savings"]["kv8"]
    assert kv8["teacher_forced_top1"]["n"] > 0 and kv8["kv_bytes_fewer"]["value"] >= 1.0
    runs = {(r["group"], r["item"]): r for r in report["runs"]["savings"]}
    assert all(r["peak_rss_mib"] and r["kv_bytes"] > 0 for r in runs.values())
    assert (tmp_path / "groups.json").exists() and (tmp_path / "groups.png").exists()
    assert "top2" in groups.table(report)
