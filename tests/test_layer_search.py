"""calibrate --layers: the layer search scores sets at zone positions only, its choices follow the modelled speedup
and the agreement target, and the profile's layers are what ComputeConfig(layers="profile") runs with."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import HumanMessage

from agent_gravity import (
    ChatGravity,
    ComputeConfig,
    GravityConfig,
    InvalidCallOptionError,
    LayerSkipConfig,
    SpeculationConfig,
)
from agent_gravity._cli import main
from agent_gravity._layer_search import (
    LayerSearch,
    Sample,
    answer_samples,
    calibrate_layers,
    choose,
    modelled_speedup,
    zone_positions,
)
from agent_gravity._profile import LayerStep, load_profile, update_profile
from agent_gravity.backends._compute import ComputeSpec

HARMLESS = {3, 5}
"""The fake model below computes the same tokens without these layers."""


def _fake_top1(prompt, output, skip):
    """Top-1 tokens of a fake 8-layer model: each harmful skipped layer changes one more zone position."""
    harm = len(set(skip) - HARMLESS)
    return [t + 1 if i < harm else t for i, t in enumerate(output)]


def test_the_modelled_speedup_needs_agreement_and_skipped_layers_and_picks_its_draft_length():
    assert modelled_speedup(0.0, 15, 30, 8) == (1.0, 0), "drafts never kept: no draft pays"
    assert modelled_speedup(1.0, 0, 30, 8) == (1.0, 0), "a draft as dear as the model never pays"
    speedup, length = modelled_speedup(1.0, 15, 30, 8)
    assert speedup == pytest.approx(9 / 5) and length == 8, "always kept: the longest draft"
    assert modelled_speedup(0.95, 15, 30, 8)[0] > modelled_speedup(0.8, 15, 30, 8)[0] > 1
    assert modelled_speedup(0.95, 1, 30, 8) == (1.0, 0), "one layer of thirty saves less than misses cost"


def test_zone_positions_are_those_the_decode_loop_tests_as_inside_a_zone():
    spec = ComputeSpec(below=1.0, window=2)
    assert zone_positions([3.0, 0.1, 0.1, 0.2, 4.0, 0.1, 0.1], spec) == (3, 4)
    assert zone_positions([0.1] * 3, ComputeSpec(below=1.0, window=4)) == ()


def test_the_greedy_search_finds_the_harmless_layers_first_and_stops_under_its_floor():
    samples = [Sample((1,), tuple(range(10, 20)), zone=tuple(range(10)), top1=tuple(range(10, 20))),
               Sample((1,), (7, 8), zone=(), top1=(7, 8))]
    search = LayerSearch(samples, _fake_top1)
    assert search.positions == 10 and len(search.samples) == 1, "answers without a zone do not count"
    assert search.agreement(()) == 1.0 and search.agreement((0, 1)) == 0.8
    path = search.greedy(8, most=6, floor=0.85)
    assert [set(s.layers) for s in path[:2]] == [{3}, {3, 5}] and [s.agreement for s in path[:2]] == [1.0, 1.0]
    assert path[-1].agreement < 0.85 and len(path) == 4, "one step under the floor ends the search"
    with pytest.raises(ValueError, match="no calibration answer entered a gravity zone"):
        LayerSearch(samples[1:], _fake_top1)


def test_choices_follow_the_modelled_speedup_and_the_agreement_target():
    path = [LayerStep(layers=(3,), agreement=1.0), LayerStep(layers=(3, 5), agreement=0.99),
            LayerStep(layers=tuple(range(12)), agreement=0.97), LayerStep(layers=tuple(range(15)), agreement=0.6)]
    chosen = choose(path, 30, 8, skip_target=0.98)
    assert chosen["skip_layers"] == (3, 5) and chosen["draft_layers"] == tuple(range(12))
    assert chosen["modelled_speedup"] > 1 and chosen["draft_length"] >= 1
    none = choose([LayerStep(layers=(4,), agreement=0.9)], 30, 8, skip_target=0.95)
    assert none == {"draft_layers": None, "modelled_speedup": None, "draft_length": None, "skip_layers": None}


def test_calibrated_layers_on_the_model_go_into_the_profile_and_profile_layers_run_with_them(
        transformers_backend, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_GRAVITY_PROFILES", str(tmp_path))
    spec = ComputeConfig().spec()
    samples = answer_samples(transformers_backend, ["List the numbers from 1 to 12, comma separated."], 40, spec)
    assert len(samples) == 1 and samples[0].zone, "counting locks in"
    search = LayerSearch(samples, lambda p, o, skip: transformers_backend.forced(p, o, skip)[0])
    assert search.agreement(()) == 1.0, "the full model agrees with itself"
    found = calibrate_layers(search, transformers_backend.num_layers, spec, most=1, skip_target=0.01, max_draft=4)
    assert len(found.path) == 1 and found.skip_layers == found.path[0].layers and found.positions == search.positions
    name = transformers_backend.model_name
    update_profile(name, layers=found)
    update_profile(name, gravity=GravityConfig(min_tokens=9))
    profile = load_profile(name)
    assert profile.layers == found and profile.gravity.min_tokens == 9, "each calibration keeps the other's result"
    chat = ChatGravity(backend=transformers_backend, gravity=GravityConfig(enabled=False, reasoning=None,
                                                                          max_answer_tokens=24),
                       compute=ComputeConfig(speculate=None, skip=LayerSkipConfig(layers="profile")))
    message = chat.invoke([HumanMessage("List the numbers from 1 to 12, comma separated.")])
    assert message.response_metadata["gravity"]["compute"]["skip"]["layers"] == list(found.skip_layers)


def test_profile_layers_without_a_calibration_say_how_to_get_one(transformers_backend, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_GRAVITY_PROFILES", str(tmp_path))
    chat = ChatGravity(backend=transformers_backend, compute=ComputeConfig(speculate=SpeculationConfig(layers="profile")))
    with pytest.raises(InvalidCallOptionError, match="calibrate --layers"):
        chat.invoke("hi")


def test_the_cli_calibrates_layers_into_the_model_profile(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGENT_GRAVITY_PROFILES", str(tmp_path))
    assert main(["calibrate", "--layers", "--layer-questions", "2", "--layer-tokens", "24", "--max-skip", "1"]) == 0
    out = capsys.readouterr().out
    assert "top-1 agreement in zones" in out and "wrote" in out
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert saved["gravity"] is None and len(saved["layers"]["path"]) == 1
    with pytest.raises(SystemExit, match="--layer-questions"):
        main(["calibrate", "--layers", "--layer-questions", "1"])
