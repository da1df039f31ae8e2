"""``mosaic diff REF CAND``: ranked structural differences between two kernels, by layer (heavy imports stay
inside the functions)."""

from __future__ import annotations

import json

import click

from mosaic.commands.lift import GPU_DEFAULT, check_bundle, gpu_record, value_text, warn_fingerprint
from mosaic.commands.output import table


def _measured(path: str) -> str:
    """`` — 172.74 us (noise 0.45 us, cupti)`` when ``path`` is a bundle with recorded device time."""
    import math
    from pathlib import Path

    from mosaic import limits
    from mosaic.errors import BadInput

    def number(v) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    from mosaic.bundle import member_path

    timings = Path(path) / "timings.json"
    try:
        timings = member_path(timings)  # plain, or stored compressed as timings.json.xz
    except (BadInput, OSError):
        return ""
    if timings.is_symlink() or not timings.is_file():
        return ""
    try:
        t = limits.read_json(timings)
    except BadInput:
        return ""
    if not isinstance(t, dict) or not number(t.get("time_ns")):
        return ""
    text = f" — {t['time_ns'] / 1e3:.2f} us"
    noise = t.get("noise") if isinstance(t.get("noise"), dict) else {}
    source = str(t.get("source", "?"))[:40]
    value = noise.get("value_ns")
    return text + (f" (noise {value / 1e3:.2f} us, {source})" if number(value) else f" ({source}, no noise figure)")


@click.command("diff")
@click.argument("reference", type=click.Path(path_type=str))
@click.argument("candidate", type=click.Path(path_type=str))
@click.option("--kernel", help="Kernel name to lift on both sides when files hold several.")
@click.option("--gpu", "gpu_name", help=f"GPU record for occupancy (default {GPU_DEFAULT} when registered).")
@click.option("--json", "as_json", is_flag=True,
              help='Write {"layers": [{"name", "distance"}], "rows": [{"rank", "layer", "key", "reference", '
                   '"candidate", "edit", "where", "why", "cause", "cost"}]}: "cause" names the row a row is a '
                   'consequence of ("" for a cause), "cost" the expected share of the time gap.')
def diff(reference: str, candidate: str, kernel: str | None, gpu_name: str | None, as_json: bool) -> None:
    """Ranked structural differences between two kernels (.cubin, SASS, PTX or bundle): causes first, by expected
    cost, each followed by the rows it explains."""
    from mosaic.lift.diff import diff_fingerprints
    from mosaic.lift.inputs import lift_pair

    gpu = gpu_record(gpu_name)
    check_bundle(reference)
    check_bundle(candidate)
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
    else:
        click.echo("causes first, by expected cost (share of the time gap, estimated); the rows a cause explains "
                   "follow it, marked '<-'")
        click.echo(table([[str(r.rank), r.key if not r.cause else f"  <- {r.key}", r.layer, value_text(r.reference),
                           value_text(r.candidate), r.edit, f"{r.cost:.2f}", r.where, r.why] for r in result.rows],
                         ["rank", "key", "layer", "reference", "candidate", "edit", "cost", "where", "why"]))
        click.echo("")
    click.echo(table([[n, f"{d:.3f}", str(result.compared[n]), ", ".join(result.unknown[n]) or "-"]
                       for n, d in result.layers], ["layer", "distance", "compared", "unknown (not compared)"]))
