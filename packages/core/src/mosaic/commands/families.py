"""``mosaic families``: the registered kernel families (built-in and from plugins) and what each provides."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json, table


def _dims(f) -> str:
    text = " x ".join(f.dims)
    return text + (f" [{', '.join(f.optional_dims)}]" if f.optional_dims else "")


@click.command("families")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def families(as_json: bool) -> None:
    """List kernel families: dimensions, input formats and distributions, oracle, yardsticks, floor."""
    from mosaic.families import providers, registry
    from mosaic.families.inputs import DISTRIBUTIONS
    from mosaic.oracle import oracles

    fams, owners, known_oracles = registry(), providers(), oracles()
    if as_json:
        out = []
        for f in fams.values():
            o = known_oracles.get(f.oracle)
            out.append({
                "name": f.name, "summary": f.summary, "provided_by": owners[f.name], "dims": list(f.dims),
                "optional_dims": dict(f.optional_dims), "dtypes": list(f.dtypes),
                "inputs": f.make_inputs is not None,
                "distributions": {d: DISTRIBUTIONS.get(d, "") for d in f.distributions},
                "oracle": {"name": f.oracle, "registered": o is not None, "summary": o.summary if o else None,
                           "formula": getattr(o.reference, "formula", None) if o else None},
                "yardsticks": [y.to_json() for y in f.yardsticks], "floor": f.floor})
        echo_json({"families": out})
        return
    rows = [[f.name, _dims(f), ",".join(f.dtypes) or "-",
             ",".join(f.distributions) if f.make_inputs is not None else "(no generator)",
             f.oracle + ("" if f.oracle in known_oracles else " (not registered)"),
             ",".join(y.name for y in f.yardsticks) or "-", owners[f.name], f.floor or "-"] for f in fams.values()]
    click.echo(table(rows, ["family", "dims", "dtypes", "distributions", "oracle", "yardsticks", "from", "floor"]))
