"""Entropy traces from real calls, the report rendered from them, and that report in a real headless browser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_gravity import ChatGravity, GravityConfig, TelemetryConfig, entropy_trace
from agent_gravity._cli import main
from agent_gravity._entropy_report import load_trace, render_report, segments, zone_spans
from tests._browser import CHROMIUM, Browser

pytestmark = pytest.mark.engine

LOOPING = "If a shirt costs 20 dollars and is 25% off, what is the price?"
SIMPLE = "Tom has 3 apples and buys 5 more. How many apples does he have?"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "test"


@pytest.fixture(scope="module")
def trace_file(chat, tmp_path_factory) -> tuple[Path, list]:
    path = tmp_path_factory.mktemp("trace") / "run.jsonl"
    with entropy_trace(path):
        messages = [chat.invoke(LOOPING), chat.invoke(SIMPLE, conversation_id="c1"),
                    chat.invoke(LOOPING, gravity=GravityConfig(policy=None, probe=None, loop={"name": "loop"}))]
    return path, messages


def test_each_call_inside_the_block_is_one_line_with_its_trace_and_decisions_and_no_text(trace_file):
    path, messages = trace_file
    calls = load_trace(path)
    assert len(calls) == 3
    for call, msg in zip(calls, messages):
        g = msg.response_metadata["gravity"]
        assert call["response_id"] == msg.id and call["model"] == "SmolLM2-135M-Instruct"
        assert len(call["entropy"]) == msg.usage_metadata["output_tokens"] == len(g["entropy"])
        assert (call["reason"], call["lock"], call["exit"], call["tokens_saved_upper_bound"]) == (
            g["reason"], g["lock"], g["exit"], g["tokens_saved_upper_bound"])
    assert [c["zone"] for c in calls] == [{"threshold": 1.2, "window": 8}] * 2 + [{"threshold": 1.0, "window": 10}], \
        "the default policy's windowed mean; the concept's 1 nat over 10 tokens for a policy that names none"
    assert calls[1]["conversation_id"] == "c1" and calls[2]["reason"] == "loop"
    text = path.read_text()
    for m in messages:
        assert m.additional_kwargs["reasoning_content"][:30] not in text
    assert "shirt" not in text and "apples" not in text


def test_a_configured_trace_file_gets_every_call_and_a_bad_path_is_a_clear_error(chat, tmp_path):
    path = tmp_path / "calls.jsonl"
    model = ChatGravity(backend=chat.get_backend(), telemetry=TelemetryConfig(trace_file=path))
    model.invoke(SIMPLE)
    model.invoke(SIMPLE)
    assert len(path.read_text().splitlines()) == 2
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot write the entropy trace file .*choose a writable path"):
        with entropy_trace(blocker / "trace.jsonl"):
            pass


def test_the_report_shows_each_curve_its_zone_segments_and_a_summary(trace_file, tmp_path, capsys):
    path, messages = trace_file
    assert main(["report", str(path), "--out", str(tmp_path)]) == 0
    html_path = Path(capsys.readouterr().out.strip())
    assert html_path == tmp_path / "report.html"
    page = html_path.read_text()
    assert page.count("<img ") == 4 and "Summary across 3 calls" in page
    assert all((tmp_path / f"call-00{i}.png").stat().st_size > 10_000 for i in (1, 2, 3))
    totals = json.loads((tmp_path / "summary.json").read_text())
    saved = sum(m.response_metadata["gravity"]["tokens_saved_upper_bound"] for m in messages)
    assert totals["tokens_saved_upper_bound"] == saved
    assert totals["early_exits"].get("loop") == 1
    first = load_trace(path)[0]
    seg = segments(first)
    assert seg["reasoning"] == (0, first["reasoning_tokens"]) and seg["answer"][1] == len(first["entropy"])
    assert zone_spans(first), "a converged reasoning has a gravity zone"


def test_bad_trace_files_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"entropy": []}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1 lacks reasoning_tokens"):
        load_trace(bad)
    assert main(["report", str(tmp_path / "missing.jsonl")]) == 2
    assert "no entropy trace file" in capsys.readouterr().err


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it)")
def test_the_report_loads_in_a_real_browser_with_no_console_errors_and_shows_its_figures(trace_file, tmp_path):
    html_path = render_report(trace_file[0], tmp_path)
    browser = Browser()
    try:
        probe = "[...document.images].map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
        page = browser.load(html_path.as_uri(), probe, screenshot=ARTIFACTS / "report.png")
    finally:
        browser.close()
    assert page.errors == []
    assert len(page.value) == 4 and all(ok and w > 500 and h > 200 for ok, w, h in page.value)
    assert (ARTIFACTS / "report.png").stat().st_size > 20_000
