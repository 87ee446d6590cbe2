"""What a decode loop may do to make the tokens inside a gravity zone cheaper, and what it did.

One zone test serves every action: the last ``window`` next-token entropies of the model are all known and
their mean is under ``below`` nats. Each action lives in its own module: drafts checked in one pass
(``_speculation``, lossless), zone entries stored in fewer bits (``_zone_kv``), middle layers skipped
(``_layer_skip``, lossy), and sampling from the top two (``_top2``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_gravity.backends._layer_skip import SkipReport, SkipSpec
from agent_gravity.backends._speculation import DraftSpec, SpeculationReport
from agent_gravity.backends._top2 import Top2Report, Top2Spec
from agent_gravity.backends._zone_kv import ZoneKVReport, ZoneKVSpec
from agent_gravity.trim.gravity_zone import GravityZone


@dataclass(frozen=True)
class ComputeSpec:
    """The zone test and the actions taken inside zones (None: not taken)."""

    below: float = 1.0
    window: int = 4
    draft: DraftSpec | None = None
    kv: ZoneKVSpec | None = None
    skip: SkipSpec | None = None
    top2: Top2Spec | None = None

    @property
    def zone(self) -> GravityZone:
        return GravityZone(self.below, self.window)


@dataclass
class ComputeReport:
    """What each action did in one call (None: not asked for), and the bytes the KV cache held at the end."""

    kv_bytes: int = 0
    speculation: SpeculationReport | None = None
    kv: ZoneKVReport | None = None
    skip: SkipReport | None = None
    top2: Top2Report | None = None

    def as_dict(self) -> dict[str, Any]:
        parts = {"speculation": self.speculation, "kv": self.kv, "skip": self.skip, "top2": self.top2}
        return {"kv_bytes": self.kv_bytes, **{k: v.as_dict() if v is not None else None for k, v in parts.items()}}
