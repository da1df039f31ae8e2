"""What the device benchmarks share: the ``--json`` option (default ``$OUT/<benchmark>.json``, ``$OUT`` defaulting
to benchmarks/results/), a one-line argument-error parser, progress lines, a child process whose failure becomes a
record, the environment, and the CUDA-event timing of a VM launcher."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def out_dir() -> Path:
    """``$OUT`` (the device tool's return folder) or benchmarks/results/."""
    return Path(os.environ.get("OUT") or RESULTS)


def add_json(p: argparse.ArgumentParser, name: str) -> None:
    """``--json PATH`` for the benchmark's report (default ``$OUT/<name>.json``)."""
    p.add_argument("--json", type=Path, default=None, help=f"Report path (default $OUT/{name}.json, $OUT defaulting "
                                                           "to benchmarks/results/).")
    p.set_defaults(json_name=f"{name}.json")


def json_path(a: argparse.Namespace) -> Path:
    return a.json if a.json is not None else out_dir() / a.json_name


def plain(o):
    """numpy scalars and arrays in results -> JSON numbers and lists (a ``json.dumps`` default)."""
    return o.tolist() if hasattr(o, "tolist") else str(o)


def write_json(path: Path, data, **kw) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, **kw) + "\n")
    return path


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (never the usage block)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def checked(p: argparse.ArgumentParser, a: argparse.Namespace, positive=(), shapes=None) -> argparse.Namespace:
    """The common argument checks: each of ``positive`` >= 1, and ``shapes`` (an attribute holding comma-separated
    model shapes of mosaic_amk.bench.hf_gpu.SHAPES) split into a list of known names; a bad one is ``p.error``."""
    for name in positive:
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if shapes:
        from mosaic_amk.bench.hf_gpu import SHAPES

        setattr(a, shapes, [s for s in getattr(a, shapes).split(",") if s])
        bad = [s for s in getattr(a, shapes) if s not in SHAPES]
        if bad:
            p.error(f"unknown shape(s) {bad}; known: {', '.join(SHAPES)}")
    return a


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def isolated(script: str, args: list[str], timeout: float, result: Path) -> dict:
    """Run ``script``'s child mode in its own process; any failure (timeout, crash, exit) becomes a record."""
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"status": "timeout", "message": f"killed after {timeout:.0f} s", "tail": tail[-2000:]}
    if result.is_file():
        data = json.loads(result.read_text())
        data.setdefault("status", "ok")
        data["wall_s"] = round(time.time() - t0, 1)
        return data
    what = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return {"status": "crashed" if proc.returncode < 0 else "failed", "message": what,
            "tail": (proc.stdout + proc.stderr)[-3000:]}


def nvidia_smi(fields: str = "name,driver_version,clocks.sm,clocks.max.sm") -> str:
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc}"


def versions(modules) -> dict:
    """Each module's ``__version__`` (or that it imports), or why it does not import."""
    out = {}
    for mod in modules:
        try:
            out[mod] = getattr(__import__(mod), "__version__", "importable")
        except Exception as exc:  # noqa: BLE001
            out[mod] = f"NOT importable: {type(exc).__name__}: {exc}"
    return out


def time_launch(lz, n: int = 10, steps: int = 1, **kw) -> float:
    """us per step of a VM launcher: one checked warm-up launch, then n launches of ``steps`` steps each between two
    CUDA events (steps > 1: the launch overhead is paid once per launch, a grid sync separates the steps)."""
    import cupy as cp

    lz.launch(n_steps=steps, **kw)
    lz.check()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    for _ in range(n):
        lz.launch(n_steps=steps, **kw)
    e.record()
    e.synchronize()
    lz.check()
    return cp.cuda.get_elapsed_time(s, e) / (n * steps) * 1e3


def gpu_record(name: str | None, on_device: bool = True) -> str:
    """``--gpu`` or, when none is named, the detected device's record (``mosaic.gpus.resolve_gpu``), a record that contradicts the device is one error line."""
    from mosaic.errors import MosaicError
    from mosaic.gpus import resolve_gpu

    try:
        choice = resolve_gpu(name, on_device=on_device)
    except MosaicError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    return choice.name
