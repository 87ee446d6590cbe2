"""Per-model gravity profiles: what ``agent-gravity calibrate`` found, loaded by ChatGravity."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_gravity._config import GravityConfig
from agent_gravity._model_store import cache_dir


class Calibration(BaseModel):
    """The guarantee a profile was calibrated to, the data it rests on, and whether it was met."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: float = Field(gt=0, lt=1)
    """The expected share of lost answers allowed."""
    delta: float = Field(gt=0, lt=1)
    """The chance allowed that the calibration set misleads (the guarantee holds with 1 - delta)."""
    bound_met: bool
    candidate: str | None
    """The chosen grid candidate; None when none met the bound (the shipped defaults are kept)."""
    bound: float | None
    """The chosen candidate's Clopper-Pearson bound at level 1 - delta, computed before the choice among the
    candidates that passed: evidence, while the certified claim is ``loss <= epsilon``."""
    loss: float | None
    """The chosen candidate's answer loss on the calibration set."""
    reasoning_saved: float | None
    items: int = Field(ge=1)
    """Calibration items (each question in up to two wordings, counted once by the test)."""
    families: list[str]
    guarantee: str
    when: str

    def risk(self, profile: str) -> dict[str, Any]:
        """The per-call risk record: which profile, at what level, certified or not."""
        return {"profile": profile, "epsilon": self.epsilon, "delta": self.delta, "bound": self.bound,
                "bound_met": self.bound_met, "candidate": self.candidate}


class LayerStep(BaseModel):
    """One step of the layer search: the layers skipped so far and the top-1 agreement with the full model kept."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: tuple[int, ...]
    agreement: float = Field(ge=0, le=1)


class LayerCalibration(BaseModel):
    """The decoder layers this model does without inside gravity zones, as ``agent-gravity calibrate --layers``
    chose them, and the search they were chosen on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    draft_layers: tuple[int, ...] | None
    """Skipped when the model drafts itself (lossless); None when no set's modelled speedup beat context drafts."""
    modelled_speedup: float | None
    draft_length: int | None
    skip_layers: tuple[int, ...] | None
    """Skipped outright inside zones (lossy): the largest set keeping ``skip_target`` agreement; None when none did."""
    skip_target: float = Field(gt=0, le=1)
    path: list[LayerStep]
    below: float
    window: int
    answers: int = Field(ge=1)
    positions: int = Field(ge=1)
    """Zone positions scored (teacher-forced along the full model's calibration answers)."""
    layers_total: int = Field(ge=1)
    when: str


class RouteCalibration(BaseModel):
    """The direct-answer threshold ``agent-gravity calibrate --route`` certified for this model (RouteConfig's
    ``direct_below="profile"``), and the test it passed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    direct_below: float | None
    """Nats; None when no threshold met the bound: adaptive thinking then reasons on every call."""
    epsilon: float = Field(gt=0, lt=1)
    delta: float = Field(gt=0, lt=1)
    bound: float | None
    loss: float | None
    """Answers changed against the reasoned answer, on the calibration items the threshold sends direct."""
    direct_share: float | None
    """Share of calibration items the threshold answers directly."""
    reasoning_saved: float | None
    items: int = Field(ge=1)
    families: list[str]
    guarantee: str
    tests: list[dict[str, Any]] = []
    when: str


class GravityProfile(BaseModel):
    """A calibrated configuration for one model, and the evidence it was chosen on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    gravity: GravityConfig | None = None
    """The exit settings to use; None when only the layers were calibrated (ChatGravity keeps its defaults)."""
    calibration: Calibration | None = None
    """The risk-controlled calibration that chose ``gravity``; None for a profile written by hand."""
    measured: dict[str, Any] = {}
    """Everything else calibration measured (each candidate's test)."""
    layers: LayerCalibration | None = None
    """What ``calibrate --layers`` chose: layers drafts and lossy skipping use under ``layers="profile"``."""
    route: RouteCalibration | None = None
    """What ``calibrate --route`` certified: the direct-answer threshold of adaptive thinking."""


def profile_path(model_name: str) -> Path:
    """Where the profile of ``model_name`` lives: ``$AGENT_GRAVITY_PROFILES``, else ``<cache>/profiles``."""
    folder = Path(os.environ["AGENT_GRAVITY_PROFILES"]) if "AGENT_GRAVITY_PROFILES" in os.environ \
        else cache_dir() / "profiles"
    return folder / f"{re.sub(r'[^A-Za-z0-9._-]', '_', model_name)}.json"


def load_profile(model_name: str) -> GravityProfile | None:
    """The saved profile of ``model_name``, None when there is none; ValueError names a broken file."""
    path = profile_path(model_name)
    if not path.is_file():
        return None
    try:
        return GravityProfile.model_validate_json(path.read_text())
    except (ValidationError, ValueError) as exc:
        raise ValueError(f"the gravity profile {path} is invalid ({exc}); run `agent-gravity calibrate` "
                         "again or delete the file to use the defaults") from exc


def save_profile(profile: GravityProfile) -> Path:
    """Write the profile atomically (a reader never sees half a file); return its path."""
    path = profile_path(profile.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(profile.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    os.replace(staging, path)
    return path


def update_profile(model_name: str, **fields: Any) -> Path:
    """Save ``fields`` into the profile of ``model_name`` (created when there is none), keeping the rest of what
    it holds: an exit calibration keeps the calibrated layers, and the other way round."""
    current = load_profile(model_name) or GravityProfile(model=model_name)
    return save_profile(GravityProfile.model_validate({**current.model_dump(), **fields}))
