"""Calibrated per-model profiles: saved atomically, loaded by ChatGravity unless gravity is given."""

import pytest

from agent_gravity import ChatGravity, GravityConfig
from agent_gravity._calibrate import (
    DEFAULT_CANDIDATE,
    GRID,
    Candidate,
    calibrate,
    calibration_record,
    candidates,
    scaled,
)
from agent_gravity._profile import GravityProfile, load_profile, profile_path, save_profile
from agent_gravity._risk import learn_then_test
from agent_gravity.bench.tasks import Task


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
    grid = (Candidate("half", 0.5, {"agree": 3}), Candidate("same"))
    configs = candidates(GravityConfig(policy=spec), grid)
    assert list(configs) == ["half", "same"], "the grid's order is the order risk control tests it in"
    assert [c.policy["policies"][0]["threshold"] for c in configs.values()] == [0.3, 0.6]
    assert configs["half"].probe.agree == 3 and configs["same"] == GravityConfig(policy=spec)


def test_the_grid_holds_the_shipped_default_and_runs_from_conservative_to_aggressive():
    configs = candidates(GravityConfig())
    assert configs[DEFAULT_CANDIDATE] == GravityConfig()
    factors = [c.factor for c in GRID]
    assert factors == sorted(factors), "thresholds only loosen along the grid"


def test_a_calibrated_profile_round_trips_with_its_guarantee(profiles):
    tasks = [Task(f"t{i}", "fam" + str(i % 3), "q", "1", "number") for i in range(60)]
    selection = learn_then_test([("careful", [0] * 60, 0.2), ("default", [0] * 59 + [1], 0.4)], 0.1, 0.1)
    calibration = calibration_record(selection, tasks)
    assert calibration.bound_met and calibration.candidate == "default" and calibration.items == 60
    assert calibration.families == ["fam0", "fam1", "fam2"] and calibration.loss == pytest.approx(1 / 60)
    profile = GravityProfile(model="m", gravity=GravityConfig(min_tokens=9), calibration=calibration)
    save_profile(profile)
    assert load_profile("m") == profile
    risk = calibration.risk(str(profile_path("m")))
    assert risk["epsilon"] == 0.1 and risk["delta"] == 0.1 and risk["bound"] == calibration.bound


def test_a_profile_says_when_no_candidate_met_the_bound(profiles):
    tasks = [Task(f"t{i}", "fam", "q", "1", "number") for i in range(10)]
    calibration = calibration_record(learn_then_test([("a", [0] * 10, 0.5)], 0.05, 0.1), tasks)
    assert not calibration.bound_met and calibration.candidate is None and calibration.bound is None
    assert "shipped defaults are kept" in calibration.guarantee


def test_calibration_refuses_a_set_too_small_to_certify_anything_before_running_the_model():
    twins = [Task(f"t{i}", "fam", f"q{i // 2}", "1", "number", f"p{i // 2}") for i in range(60)]
    with pytest.raises(ValueError, match="30 calibration questions cannot certify epsilon=0.05 at delta=0.1"):
        calibrate(None, twins, 0.05, 0.1)
