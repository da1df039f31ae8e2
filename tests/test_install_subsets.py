"""Users install only what they need: core alone, core + one GPU plugin — in a fresh virtualenv."""

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def pip(python: Path, *args: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("subset") / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    return where / "bin" / "python"


def test_core_alone_then_hopper(fresh_python, mosaic, root):
    pip(fresh_python, str(root / "packages" / "core"))
    alone = mosaic("plugins", python=fresh_python, check=0)
    assert "No mosaic plugins are installed" in alone.stdout and "pip install mosaic-gpu-hopper" in alone.stdout
    assert json.loads(mosaic("plugins", "--json", python=fresh_python, check=0).stdout) == {"plugins": []}
    gpus = mosaic("gpus", python=fresh_python, check=0).stdout
    assert "No GPU records are registered" in gpus
    # importing the core never drags a plugin in
    probe = subprocess.run([str(fresh_python), "-c", "import mosaic.cli, mosaic.plugins, sys; "
                            "print(sorted(m for m in sys.modules if m.startswith('mosaic_')))"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]"

    pip(fresh_python, "--no-deps", str(root / "packages" / "gpu-hopper"))
    data = json.loads(mosaic("plugins", "--json", python=fresh_python, check=0).stdout)
    assert [(p["name"], p["distribution"], p["status"]) for p in data["plugins"]] == \
        [("hopper", "mosaic-gpu-hopper", "ok")]
    names = {t["name"] for t in json.loads(mosaic("gpus", "--json", python=fresh_python, check=0).stdout)["targets"]}
    assert names == {"h100-sxm", "h100-pcie", "h200"}
    assert mosaic("amk", python=fresh_python, check=2).stderr.startswith("error: No such command 'amk'")


def test_this_environment_is_not_the_fresh_one(fresh_python):
    assert Path(sys.executable).resolve() != fresh_python.resolve()
