"""``mosaic lift FILE`` and ``mosaic diff REF CAND`` (heavy imports stay inside the functions)."""

from __future__ import annotations

import json

import click

GPU_DEFAULT = "h200"


def _gpu(name: str | None):
    """The GpuTarget for occupancy; with no GPU plugin installed, occupancy is reported unknown."""
    from mosaic.errors import PluginError
    from mosaic.plugins import host

    try:
        return host().get("gpus", name or GPU_DEFAULT)
    except PluginError:
        if name is not None:
            raise
        click.echo(f"warning: no GPU record '{GPU_DEFAULT}' is registered (pip install mosaic-gpu-hopper); "
                   "occupancy is unknown", err=True)
        return None


def _warn(fp) -> None:
    for w in fp.warnings:
        click.echo(f"warning: {fp.origin}: {w}", err=True)


def _value(v, width: int = 60) -> str:
    text = _plain_value(v)
    return text if len(text) <= width else text[: width - 3] + "..."


def _plain_value(v) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(map(str, v)) + "]" if v else "[]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {x}" for k, x in v.items()) + "}" if v else "{}"
    return str(v)


@click.command("lift")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--kernel", help="Kernel to lift when the file holds several (default: the largest).")
@click.option("--gpu", "gpu_name", help=f"GPU record for occupancy (default {GPU_DEFAULT} when registered).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def lift(path: str, kernel: str | None, gpu_name: str | None, as_json: bool) -> None:
    """Print the six-layer fingerprint of a .cubin, SASS listing, PTX module or bundle."""
    from mosaic.cli import _table
    from mosaic.lift.inputs import lift_path
    from mosaic.records import LAYERS

    fp = lift_path(path, kernel=kernel, gpu=_gpu(gpu_name))
    _warn(fp)
    if as_json:
        click.echo(json.dumps(fp.to_json(), indent=2))
        return
    click.echo(f"kernel {fp.kernel}  ({fp.dialect}, {fp.instructions} instructions, from {fp.origin})")
    click.echo("roles  " + ", ".join(f"{r['name']} ({r['instructions']} insns, hot loop {r['hot_loop'] or '-'})"
                                     for r in fp.roles))
    click.echo("loops  " + (", ".join(f"{lp['name']} depth {lp['depth']} body {lp['body']} unroll {lp['unroll']}"
                                      + (f" [{lp['role']}]" if lp["role"] not in (None, "all") else "")
                                      for lp in fp.loops) or "none"))
    rows = []
    for layer in LAYERS:
        for f in fp.layer(layer):
            shown = _value(f.value)
            if f.value is None and layer == "machine" and f.key in ("stalls.top", "tensor_pipe", "memory_throughput"):
                shown = "absent (no Nsight Compute metrics)"
            rows.append([layer, f.key, f.where if f.role else "kernel", shown])
    click.echo(_table(rows, ["layer", "key", "where", "value"]))


def _measured(path: str) -> str:
    """`` — 172.74 us (noise 0.45 us, cupti)`` when ``path`` is a bundle with recorded device time."""
    from pathlib import Path

    timings = Path(path) / "timings.json"
    if not timings.is_file():
        return ""
    try:
        t = json.loads(timings.read_text())
        text = f" — {t['time_ns'] / 1e3:.2f} us"
    except (ValueError, KeyError, TypeError):
        return ""
    noise = (t.get("noise") or {}).get("value_ns")
    return text + (f" (noise {noise / 1e3:.2f} us, {t.get('source', '?')})" if noise is not None
                   else f" ({t.get('source', '?')}, no noise figure)")


@click.command("diff")
@click.argument("reference", type=click.Path(path_type=str))
@click.argument("candidate", type=click.Path(path_type=str))
@click.option("--kernel", help="Kernel name to lift on both sides when files hold several.")
@click.option("--gpu", "gpu_name", help=f"GPU record for occupancy (default {GPU_DEFAULT} when registered).")
@click.option("--json", "as_json", is_flag=True,
              help='Write {"layers": [{"name", "distance"}], "rows": [{"rank", "layer", "key", "reference", '
                   '"candidate", "edit", "where", "why"}]}.')
def diff(reference: str, candidate: str, kernel: str | None, gpu_name: str | None, as_json: bool) -> None:
    """Ranked structural differences between two kernels (.cubin, SASS, PTX or bundle), by layer."""
    from mosaic.cli import _table
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_pair
    from mosaic.records import LAYERS

    gpu = _gpu(gpu_name)
    ref, cand = lift_pair(reference, candidate, kernel=kernel, gpu=gpu)
    _warn(ref)
    _warn(cand)
    result = diff_fingerprints(ref, cand)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    for label, fp, path in (("reference", ref, reference), ("candidate", cand, candidate)):
        click.echo(f"{label} {fp.kernel} ({fp.origin}){_measured(path)}")
    click.echo("")
    if not result.rows:
        click.echo("no differences in the compared features")
    for layer in LAYERS:
        rows = [r for r in result.rows if r.layer == layer]
        if not rows:
            continue
        click.echo(f"[{layer}]")
        click.echo(_table([[str(r.rank), r.key, _value(r.reference), _value(r.candidate), r.edit, r.where, r.why]
                           for r in rows], ["rank", "key", "reference", "candidate", "edit", "where", "why"]))
        click.echo("")
    click.echo(_table([[n, f"{d:.3f}", str(result.compared[n]), ", ".join(result.unknown[n]) or "-"]
                       for n, d in result.layers], ["layer", "distance", "compared", "unknown (not compared)"]))
