"""Rebuild the cause corpus: each variant of pairs.json -> artifacts/<variant>.{cubin,ptxas.log}.

One nvcc compile per variant for the spec's arch (sm_90a), -O3, its -D defines and flags. Only what lifting
reads is committed: the cubin (``lift_path`` disassembles it with the pip nvdisasm and reads its attributes,
registers included, with cuobjdump) and the ptxas -v log (resource usage, for reading). Needs nvcc (12.8 or
newer) on PATH.  Usage:  python packages/core/tests/lift/causes/build.py [OUT_DIR] [VARIANT ...]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = json.loads((HERE / "pairs.json").read_text())


def nvcc_command(variant: dict, arch: str, out: Path) -> list[str]:
    cmd = ["nvcc", f"-arch={arch}", "-O3", "-std=c++17", "-cubin", "-o", str(out), "-Xptxas", "-v"]
    cmd += [f"-D{k}={v}" for k, v in sorted(variant.get("defines", {}).items())]
    cmd += list(variant.get("flags", []))
    return [*cmd, str(HERE / "src" / variant["src"])]


def build_variant(name: str, variant: dict, arch: str, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"cubin": out_dir / f"{name}.cubin", "ptxas_log": out_dir / f"{name}.ptxas.log"}
    done = subprocess.run(nvcc_command(variant, arch, paths["cubin"]), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"nvcc failed for {name}:\n{done.stderr}")
    # keep the resource lines; drop the wall-clock 'Compile time' line so rebuilds are byte-stable
    paths["ptxas_log"].write_text("".join(line + "\n" for line in done.stderr.splitlines()
                                          if "Compile time" not in line))
    return paths


def main(argv: list[str]) -> int:
    if shutil.which("nvcc") is None:
        print("error: nvcc is not on PATH (install the CUDA toolkit, 12.8 or newer)", file=sys.stderr)
        return 2
    out_dir = Path(argv[0]) if argv else HERE / "artifacts"
    names = argv[1:] or list(SPEC["variants"])
    for name in names:
        build_variant(name, SPEC["variants"][name], SPEC["arch"], out_dir)
        print(f"built {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
