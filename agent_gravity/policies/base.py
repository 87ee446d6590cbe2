"""The gravity policy extension point: watch the entropy stream, say when it has locked in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable


@dataclass(frozen=True)
class Lock:
    """A policy's verdict that generation has locked in, with the values behind it."""

    step: int
    policy: str
    values: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """Return one human sentence saying why the policy fired."""
        shown = ", ".join(f"{k}={v:.3g}" for k, v in self.values.items())
        return f"{self.policy} locked at token {self.step} ({shown})"


@runtime_checkable
class GravityPolicy(Protocol):
    """Stateful detector fed one confirmed reasoning-token entropy at a time."""

    name: ClassVar[str]

    def observe(self, step: int, entropy: float) -> Lock | None:
        """Take the entropy (nats) of generated token ``step``; return a Lock once locked in."""
        ...
