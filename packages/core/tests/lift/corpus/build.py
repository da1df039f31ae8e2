"""Rebuild the lifting corpus: each variant of pairs.json -> artifacts/<variant>.{cubin,sass,ptx,ptxas.log}.

Needs nvcc (13.x) on PATH; SASS comes from the pip nvdisasm that mosaic's lifter finds. The artifacts are
committed so the tests run without nvcc.  Usage:  python packages/core/tests/lift/corpus/build.py [OUT_DIR]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def nvcc_command(variant: dict, arch: str, out: Path, kind: str) -> list[str]:
    cmd = ["nvcc", f"-arch={arch}", "-O3", "-std=c++17", f"-{kind}", "-o", str(out)]
    cmd += [f"-D{k}={v}" for k, v in sorted(variant.get("defines", {}).items())]
    cmd += list(variant.get("flags", []))
    return [*cmd, str(HERE / "src" / variant["src"])]


def build_variant(name: str, variant: dict, arch: str, out_dir: Path) -> dict[str, Path]:
    from mosaic.toolchain.nvdisasm import disassemble as disassemble_cubin

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {k: out_dir / f"{name}.{k}" for k in ("cubin", "ptx", "sass")}
    log_path = out_dir / f"{name}.ptxas.log"
    done = subprocess.run([*nvcc_command(variant, arch, paths["cubin"], "cubin"), "-Xptxas", "-v"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"nvcc failed for {name}:\n{done.stderr}")
    # ptxas -v: keep the resource lines, drop the wall-clock 'Compile time' line so rebuilds are byte-stable.
    log = "".join(line + "\n" for line in done.stderr.splitlines() if "Compile time" not in line)
    log_path.write_text(log)
    subprocess.run(nvcc_command(variant, arch, paths["ptx"], "ptx"), check=True)
    paths["sass"].write_text(disassemble_cubin(paths["cubin"]))
    paths["ptxas_log"] = log_path
    return paths


def main(argv: list[str]) -> int:
    if shutil.which("nvcc") is None:
        print("error: nvcc is not on PATH (install the CUDA toolkit, 12.8 or newer)", file=sys.stderr)
        return 2
    spec = json.loads((HERE / "pairs.json").read_text())
    out_dir = Path(argv[0]) if argv else HERE / "artifacts"
    for name, variant in spec["variants"].items():
        build_variant(name, variant, spec["arch"], out_dir)
        print(f"built {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
