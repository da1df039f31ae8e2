import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_mosaic(*args, env=None, python=None, check=None):
    """Run the installed `mosaic` console script in a subprocess (the real entry point)."""
    exe = Path(python).parent / "mosaic" if python else BIN / "mosaic"
    full_env = {**os.environ, **(env or {})}
    full_env.pop("MOSAIC_DEBUG", None)
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, env=full_env, timeout=300)
    if check is not None:
        assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.fixture(scope="session")
def mosaic():
    """The `mosaic` command: mosaic(*args, env=, python=, check=) -> CompletedProcess."""
    return run_mosaic


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
