"""``mosaic trust``: the installed exploit kernel files submitted to the numerics gate, one table row each;
exit 1 when the gate accepted an exploit or rejected an honest control (:mod:`mosaic.trust`)."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json


@click.command("trust")
@click.option("--family", "family", default=None, help="Only exploits of this kernel family (softmax, ...).")
@click.option("--lang", "lang", default=None, help="Only exploits written in this language.")
@click.option("--exploit", "names", multiple=True, help="Only this exploit (repeatable; NAME or NAME@LANG).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--timeout", "timeout", type=click.FloatRange(1, 3600), default=600.0, show_default=True,
              help="Seconds one exploit's gate may run before its child is killed.")
def trust(family: str | None, lang: str | None, names: tuple[str, ...], as_json: bool, timeout: float) -> None:
    """Submit every registered exploit (a zero output, a skipped block, a seed-0 answer, a library call, a race,
    a write into the campaign, ...) to the numerics gate -- three shapes, two seeds drawn for this run, every
    value distribution -- and print what caught each. The figure is the accepted count (goal 0)."""
    from mosaic import trust as suite
    from mosaic.errors import BadInput
    from mosaic.plugins import host

    everything = host().items("exploits")
    chosen = suite.selected(everything, family, lang, names)
    if not chosen:
        known = ", ".join(sorted(everything)) or "none (install a language plugin that registers exploits)"
        raise BadInput(f"no exploit matches; installed: {known}", "--exploit" if names else "--family/--lang")
    rows = []
    for i, e in enumerate(chosen, 1):
        if not as_json:
            click.echo(f"[{i}/{len(chosen)}] {e.name} ({e.kind}): {e.summary}", err=True)
        rows.append(suite.run_one(e, timeout=timeout))
    if not (family or lang or names):
        rows += suite.uncovered(list(everything.values()))
    totals = suite.summary(rows)
    if as_json:
        echo_json({"summary": totals, "rows": [r.to_json() for r in rows]})
    else:
        click.echo(suite.table(rows))
        click.echo(f"exploits accepted: {totals['accepted']} of {totals['exploits_run']} run (goal 0); honest controls "
                   f"rejected: {totals['controls_rejected']} of {totals['controls']}; kinds not run here: "
                   f"{totals['not_run']}")
    if totals["accepted"] or totals["controls_rejected"]:
        raise SystemExit(1)
    if not totals["exploits_run"]:  # nothing was judged: not a pass
        click.echo("no exploit could run on this machine (see the reasons above); nothing was judged", err=True)
        raise SystemExit(1)
