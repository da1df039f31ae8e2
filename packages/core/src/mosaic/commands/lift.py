"""``mosaic lift FILE``: the six-layer fingerprint of a cubin, SASS, PTX or bundle (heavy imports stay inside the
functions). The GPU record and value helpers here are shared with ``mosaic diff``."""

from __future__ import annotations

import json

import click

from mosaic.commands.output import table

GPU_DEFAULT = "h200"


def gpu_record(name: str | None):
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


def check_bundle(path: str) -> None:
    """When ``path`` is a bundle directory, verify it first, so that a tampered bundle is named (where)."""
    from pathlib import Path

    from mosaic.bundle import load_bundle
    from mosaic.errors import BundleError

    root = Path(path)
    if not (root.is_dir() and (root / "manifest.json").exists()):
        return
    try:
        load_bundle(root)
    except BundleError as exc:
        if exc.where is None:
            raise BundleError(exc.what, str(root)) from None
        raise


def warn_fingerprint(fp) -> None:
    for w in fp.warnings:
        click.echo(f"warning: {fp.origin}: {w}", err=True)


def value_text(v, width: int = 60) -> str:
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
    from mosaic.lift.inputs import lift_path
    from mosaic.records import LAYERS

    check_bundle(path)
    fp = lift_path(path, kernel=kernel, gpu=gpu_record(gpu_name))
    warn_fingerprint(fp)
    if as_json:
        click.echo(json.dumps(fp.to_json(), indent=2))
        return
    click.echo(f"kernel {fp.kernel}  ({fp.dialect}, {fp.instructions} instructions, from {fp.origin})")
    click.echo("roles  " + ", ".join(f"{r['name']} ({r['instructions']} insns, hot loop {r['hot_loop'] or '-'})"
                                     for r in fp.roles))
    click.echo("loops  " + (", ".join(f"{lp['name']} depth {lp['depth']} body {lp['body']} unroll {lp['unroll']}"
                                      + (f" [{lp['role']}]" if lp["role"] not in (None, "all") else "")
                                      for lp in fp.loops) or "none"))
    from mosaic.lift.resources import METRICS

    profile_keys = ("stalls.top", *METRICS)  # the machine-layer keys only a profile (capture --profile) gives
    rows = []
    for layer in LAYERS:
        for f in fp.layer(layer):
            shown = value_text(f.value)
            if f.value is None and layer == "machine" and f.key in profile_keys:
                shown = "absent (no Nsight Compute metrics: capture --profile)"
            rows.append([layer, f.key, f.where if f.role else "kernel", shown])
    click.echo(table(rows, ["layer", "key", "where", "value"]))
