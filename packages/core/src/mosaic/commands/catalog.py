"""``mosaic catalog``: the construct catalog, each concept in every installed language; ``--rewrites``: the
mechanical source rewrites the installed languages register, grouped by concept."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json


@click.command("catalog")
@click.option("--lang", "lang", default=None, help="Only this language (pallas, cute, cutlass, ...).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--rewrites", "rewrites", is_flag=True,
              help="The installed source rewrites (register_rewrites), grouped by concept.")
def catalog_cmd(lang: str | None, as_json: bool, rewrites: bool) -> None:
    """The construct catalog: each concept, how each language writes it, the fingerprint that reveals it."""
    from mosaic.catalog import catalog_from_host
    from mosaic.errors import BadInput
    from mosaic.plugins import host

    cat = catalog_from_host(host())
    if lang is not None and lang not in cat.languages:
        raise BadInput(f"unknown language '{lang}'; the catalog covers {', '.join(cat.languages)}", "--lang")
    langs = (lang,) if lang else cat.languages
    if rewrites:
        _rewrites(cat, langs, host(), as_json)
        return
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


def _rewrites(cat, langs: tuple, plugin_host, as_json: bool) -> None:
    """Every installed rewrite of ``langs`` under its concept (registration order); a concept/language pair
    with none is listed as having none, and nothing is said of it."""
    regs = [(reg.item, reg.plugin) for reg in plugin_host.registries["rewrites"].values()
            if reg.item.language in langs]
    names = [c.name for c in cat.concepts]
    extra = sorted({rw.concept for rw, _ in regs} - set(names))  # a plugin's concept core does not know
    by_concept = {name: {lang: [] for lang in langs} for name in (*names, *extra)}
    for rw, plugin in regs:
        by_concept[rw.concept][rw.language].append((rw, plugin))
    if as_json:
        echo_json({"languages": list(langs),
                   "rewrites": [{**rw.to_json(), "plugin": plugin} for rw, plugin in regs],
                   "concepts": [{"name": name, "known": name in names,
                                 "rewrites": {lang: [rw.name for rw, _ in got] for lang, got in per.items()}}
                                for name, per in by_concept.items()]})
        return
    click.echo(f"{len(regs)} rewrite(s) installed for {', '.join(langs)}")
    layers = {c.name: c.layer for c in cat.concepts}
    none: dict[str, list[str]] = {lang: [] for lang in langs}
    for name, per in by_concept.items():
        for lang, got in per.items():
            if not got:
                none[lang].append(name)
        if not any(per.values()):
            continue
        label = f"[{layers[name]}]" if name in layers else "[not a catalog concept]"
        click.echo(f"{name}  {label}")
        for lang, got in per.items():
            if not got:
                click.echo(f"    {lang:<8} no rewrite")
            for rw, _ in got:
                forms = f" {' '.join(rw.forms)}" if rw.forms else ""
                click.echo(f"    {lang:<8} {rw.rewrite:<14} {', '.join(rw.rows)} ({rw.side}{forms}) — {rw.summary}")
    for lang, missing in none.items():
        if missing:
            click.echo(f"no rewrite in {lang} for {len(missing)} concept(s): {', '.join(missing)}")
