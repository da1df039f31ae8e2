"""``mosaic catalog``: the construct catalog, each concept in every installed language."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json


@click.command("catalog")
@click.option("--lang", "lang", default=None, help="Only this language (pallas, cute, cutlass, ...).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def catalog_cmd(lang: str | None, as_json: bool) -> None:
    """The construct catalog: each concept, how each language writes it, the fingerprint that reveals it."""
    from mosaic.catalog import catalog_from_host
    from mosaic.errors import BadInput
    from mosaic.plugins import host

    cat = catalog_from_host(host())
    if lang is not None and lang not in cat.languages:
        raise BadInput(f"unknown language '{lang}'; the catalog covers {', '.join(cat.languages)}", "--lang")
    langs = (lang,) if lang else cat.languages
    if as_json:
        echo_json(cat.to_json(langs))
        return
    for concept in cat.concepts:
        click.echo(f"{concept.name}  [{concept.layer}]  {concept.summary}")
        click.echo(f"    reveals: {', '.join(concept.fingerprint)}")
        for name in langs:
            e = cat.entry(concept.name, name)
            c = e.construct
            if c is None:
                click.echo(f"    {name:<8} MISSING")
            elif c.analogue == "none":
                click.echo(f"    {name:<8} no analogue — {c.notes}")
            else:
                flag = " (partial)" if c.analogue == "partial" else ""
                click.echo(f"    {name:<8} {c.expression}{flag}" + (f" — {c.notes}" if c.notes else ""))
