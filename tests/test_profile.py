"""Calibrated per-model profiles: saved atomically, loaded by ChatGravity unless gravity is given."""

import pytest

from agent_gravity import ChatGravity, GravityConfig
from agent_gravity._calibrate import candidates, choose, scaled
from agent_gravity._profile import GravityProfile, load_profile, profile_path, save_profile


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_GRAVITY_PROFILES", str(tmp_path))
    return tmp_path


def test_a_saved_profile_is_what_chat_gravity_uses_for_that_model(profiles):
    chosen = GravityConfig(policy={"name": "cusum", "ceiling": 0.4}, min_tokens=8)
    path = save_profile(GravityProfile(model="SmolLM2-135M-Instruct", gravity=chosen, measured={"items": 3}))
    assert path == profile_path("SmolLM2-135M-Instruct") and path.parent == profiles
    assert list(profiles.iterdir()) == [path], "no staging file left behind"
    assert ChatGravity().gravity == chosen
    assert ChatGravity(gravity=GravityConfig()).gravity == GravityConfig(), "an explicit config wins"
    assert ChatGravity(model="/models/other-model").gravity == GravityConfig(), "no profile: the defaults"


def test_a_broken_profile_says_which_file_and_what_to_do(profiles):
    profile_path("m").write_text("{not json")
    with pytest.raises(ValueError, match=r"(?s)m\.json is invalid.*agent-gravity calibrate"):
        load_profile("m")


def test_model_names_cannot_escape_the_profile_folder(profiles):
    assert profile_path("../../etc/passwd").parent == profiles


def test_scaling_reaches_every_threshold_of_a_composed_policy():
    spec = {"name": "all_of", "within": 4, "policies": [
        {"name": "window_mean", "window": 8, "threshold": 0.6},
        {"name": "ewma", "threshold": 0.7, "varentropy_threshold": 1.5}]}
    out = scaled(spec, 2.0)
    assert out["within"] == 4 and out["policies"][0] == {"name": "window_mean", "window": 8, "threshold": 1.2}
    assert out["policies"][1]["varentropy_threshold"] == 3.0
    assert [c.policy["policies"][0]["threshold"] for c in candidates(GravityConfig(policy=spec), (0.5, 1)).values()] == [0.3, 0.6]


def test_choose_takes_the_biggest_saving_that_keeps_the_target_else_the_best_preserver():
    def m(kept, saved):
        return {"preservation": {"value": kept}, "reasoning_saved": {"value": saved}, "reasoning_tokens": {"value": 1}}
    measured = {"a": m(0.99, 0.2), "b": m(0.96, 0.5), "c": m(0.90, 0.7)}
    assert choose(measured, 0.95) == ("b", True)
    assert choose(measured, 0.995) == ("a", False)
