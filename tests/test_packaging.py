"""The wheel ships every module of the three source folders under the agent_gravity namespace."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent
LAYOUT = {"agent_gravity": "agent_gravity", "backends": "agent_gravity/backends", "kernels": "agent_gravity/kernels"}


def test_wheel_contains_every_module_and_builds_without_packaging_warnings(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--verbose", "--no-deps", "--no-build-isolation",
                            "--wheel-dir", str(tmp_path), str(ROOT)], check=True, cwd=tmp_path, capture_output=True,
                           text=True)
    assert "absent from the `packages` configuration" not in build.stdout + build.stderr
    (wheel,) = tmp_path.glob("agent_gravity-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    expected = {
        f"{target}/{path.relative_to(ROOT / source).as_posix()}"
        for source, target in LAYOUT.items()
        for path in (ROOT / source).rglob("*.py")
        if not (source == "agent_gravity" and path.relative_to(ROOT / source).parts[0] in ("backends", "kernels"))
    }
    assert expected <= shipped, f"missing from the wheel: {sorted(expected - shipped)}"
    assert not [n for n in shipped if n.split("/")[0] in ("backends", "kernels")], "generic top-level names"
    assert "agent_gravity/bench/data/family_tasks.jsonl" in zipfile.ZipFile(wheel).namelist()
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith("entry_points.txt"))).decode()
    assert "agent-gravity = agent_gravity._cli:main" in entry_points
    assert "[vllm.logits_processors]\nagent_gravity = agent_gravity.backends.vllm_plugin:GravityPlugin" in entry_points
