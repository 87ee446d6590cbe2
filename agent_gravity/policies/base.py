"""The gravity policy extension point: watch the signal stream, say when it has locked in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, runtime_checkable

Reason = Literal["gravity", "loop"]


@dataclass(frozen=True)
class Observation:
    """One generated token and the distribution it was sampled from."""

    step: int
    """Index of the token among the generated ones."""
    token: int
    entropy: float
    """Entropy of the distribution (nats); NaN for a step the engine never showed."""
    varentropy: float = float("nan")
    """Variance of the surprisal under the distribution (nats squared)."""


@dataclass(frozen=True)
class Lock:
    """A policy's verdict that generation has locked in, with the values behind it."""

    step: int
    policy: str
    values: dict[str, float] = field(default_factory=dict)
    reason: Reason = "gravity"
    """``gravity``: the reasoning has converged; ``loop``: the output repeats itself."""

    def describe(self) -> str:
        """Return one human sentence saying why the policy fired."""
        shown = ", ".join(f"{k}={v:.3g}" for k, v in self.values.items())
        return f"{self.policy} locked at token {self.step} ({shown})"


@runtime_checkable
class GravityPolicy(Protocol):
    """Stateful detector fed one generated token at a time.

    A policy reports a level, not an edge: it returns a Lock on every step where the
    condition holds, so a caller that needs a second opinion can ask again later.
    """

    name: ClassVar[str]

    def observe(self, obs: Observation) -> Lock | None:
        """Take one token's observation; return a Lock while the stream is locked in."""
        ...


def check(condition: bool, message: str) -> None:
    """Raise ValueError with ``message`` unless ``condition``: policy parameters fail early and clearly."""
    if not condition:
        raise ValueError(message)
