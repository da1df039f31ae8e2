"""``mosaic diff REF CAND``: ranked structural differences between two kernels, by layer (heavy imports stay
inside the functions)."""

from __future__ import annotations

import json

import click

from mosaic.commands.lift import GPU_DEFAULT, gpu_record, value_text, warn_fingerprint
from mosaic.commands.output import table


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
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_pair
    from mosaic.records import LAYERS

    gpu = gpu_record(gpu_name)
    ref, cand = lift_pair(reference, candidate, kernel=kernel, gpu=gpu)
    warn_fingerprint(ref)
    warn_fingerprint(cand)
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
        click.echo(table([[str(r.rank), r.key, value_text(r.reference), value_text(r.candidate), r.edit, r.where, r.why]
                           for r in rows], ["rank", "key", "reference", "candidate", "edit", "where", "why"]))
        click.echo("")
    click.echo(table([[n, f"{d:.3f}", str(result.compared[n]), ", ".join(result.unknown[n]) or "-"]
                       for n, d in result.layers], ["layer", "distance", "compared", "unknown (not compared)"]))
