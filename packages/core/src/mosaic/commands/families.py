"""``mosaic families``: the registered kernel families (built-in and from plugins) and what each provides;
``--check`` runs each one's conformance checks (:mod:`mosaic.families.conformance`) on the CPU."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json, table


def _dims(f) -> str:
    text = " x ".join(f.dims)
    return text + (f" [{', '.join(f.optional_dims)}]" if f.optional_dims else "")


@click.command("families")
@click.argument("names", nargs=-1)
@click.option("--check", "run_check", is_flag=True,
              help="Check each family on its example shape (seeded, representable inputs the oracle accepts); "
                   "exit 1 if any fails.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def families(names: tuple[str, ...], run_check: bool, as_json: bool) -> None:
    """List kernel families (or only NAMES): dimensions, input formats and distributions, oracle, yardsticks,
    floor."""
    from mosaic.errors import BadInput
    from mosaic.families import providers, registry
    from mosaic.families.inputs import DISTRIBUTIONS
    from mosaic.oracle import oracles

    fams, owners, known_oracles = registry(), providers(), oracles()
    unknown = [n for n in names if n not in fams]
    if unknown:
        raise BadInput(f"unknown family '{unknown[0]}'; known: {', '.join(fams)}", "families")
    if names:
        fams = {n: fams[n] for n in names}
    problems: dict[str, list[str]] = {}
    if run_check:
        from mosaic.families.conformance import check_family

        problems = {n: check_family(f) for n, f in fams.items()}
    if as_json:
        out = []
        for f in fams.values():
            o = known_oracles.get(f.oracle)
            item = {
                "name": f.name, "summary": f.summary, "provided_by": owners[f.name], "dims": list(f.dims),
                "optional_dims": dict(f.optional_dims), "example": dict(f.example), "dtypes": list(f.dtypes),
                "inputs": f.make_inputs is not None,
                "distributions": {d: DISTRIBUTIONS.get(d, "") for d in f.distributions},
                "oracle": {"name": f.oracle, "registered": o is not None, "summary": o.summary if o else None,
                           "formula": getattr(o.reference, "formula", None) if o else None},
                "yardsticks": [y.to_json() for y in f.yardsticks], "floor": f.floor}
            if run_check:
                item["check"] = {"passed": not problems[f.name], "problems": problems[f.name]}
            out.append(item)
        echo_json({"families": out})
    else:
        rows = [[f.name, _dims(f), ",".join(f.dtypes) or "-",
                 ",".join(f.distributions) if f.make_inputs is not None else "(no generator)",
                 f.oracle + ("" if f.oracle in known_oracles else " (not registered)"),
                 ",".join(y.name for y in f.yardsticks) or "-", owners[f.name], f.floor or "-"] for f in fams.values()]
        header = ["family", "dims", "dtypes", "distributions", "oracle", "yardsticks", "from", "floor"]
        if run_check:
            for row, name in zip(rows, fams, strict=True):
                row.insert(1, "ok" if not problems[name] else f"FAIL ({len(problems[name])})")
            header.insert(1, "check")
        click.echo(table(rows, header))
        for name, found in problems.items():
            for p in found:
                click.echo(f"{name}: {p}")
    if any(problems.values()):
        raise click.exceptions.Exit(1)
