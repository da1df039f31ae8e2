"""`pip install mosaic-core` into a fresh virtualenv (real pip, real resolution) brings the disassemblers with it:
`mosaic doctor` there finds nvdisasm and cuobjdump inside that environment's own nvidia wheels, and names the line
that installs each language plugin it lacks."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(sys.platform == "darwin", reason="NVIDIA ships the disassembler wheels for Linux and Windows")
def test_core_alone_pulls_nvdisasm_and_cuobjdump_and_doctor_finds_them_there(tmp_path):
    where = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    python = where / "bin" / "python"
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           str(ROOT / "packages" / "core")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = subprocess.run([str(where / "bin" / "mosaic"), "doctor", "--json", "--require", "nvdisasm",
                          "--require", "cuobjdump"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    site = str(where / "lib")
    for tool in ("nvdisasm", "cuobjdump"):
        assert checks[tool]["ok"] and checks[tool]["data"]["path"].startswith(site), checks[tool]
        assert checks[tool]["data"]["version"].startswith("13.")
    assert [c["name"] for c in report["checks"] if c["section"] == "distribution"] == ["mosaic-core"]
    assert not [c for c in report["checks"] if c["section"] == "plugin"]
    for lang in ("cute", "cutlass", "pallas"):
        assert not checks[lang]["ok"] and checks[lang]["detail"] == f"plugin not installed (mosaic-target-{lang})"
        assert f"pip install mosaic-target-{lang}  # from this repository: pip install ./packages/target-{lang}" \
            in report["install"]
    missing = subprocess.run([str(where / "bin" / "mosaic"), "doctor", "--require", "cute"],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and missing.stderr == "required 'cute' is not usable here\n"
