"""Extension points built from plain specs: ``{"name": ..., **parameters}``."""

from __future__ import annotations

from typing import Any


def from_spec(registry: dict[str, type], spec: Any, kind: str, example: str) -> Any:
    """An instance of ``registry[spec["name"]]`` with the other keys as parameters; ValueError says what to fix."""
    if not isinstance(spec, dict):
        raise ValueError(f"a {kind} spec is a dict like {example}, got {spec!r}")
    params = dict(spec)
    name = params.pop("name", None)
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(registry)}")
    try:
        return registry[name](**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for {kind} {name!r}: {exc}") from exc
