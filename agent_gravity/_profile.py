"""Per-model gravity profiles: what ``agent-gravity calibrate`` found, loaded by ChatGravity."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from agent_gravity._config import GravityConfig
from agent_gravity._model_store import cache_dir


class GravityProfile(BaseModel):
    """A calibrated configuration for one model, and the evidence it was chosen on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    gravity: GravityConfig
    measured: dict[str, Any] = {}
    """What calibration measured for the chosen configuration (preservation, savings, items)."""


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
