"""``mosaic plugins``: the installed plugins and what each registers."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json, table


def _provides_summary(provides: list[str], most: int = 3) -> str:
    """``gpu:h200, language:cute, 35 constructs``: names while few, a count when many (--json lists all)."""
    by_kind: dict[str, list[str]] = {}
    for item in provides:
        kind, _, name = item.partition(":")
        by_kind.setdefault(kind, []).append(name)
    parts = []
    for kind, names in by_kind.items():
        parts += [f"{len(names)} {'families' if kind == 'family' else kind + 's'}"] if len(names) > most else [f"{kind}:{n}" for n in names]
    return ", ".join(parts)


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """List installed plugins and what each registers."""
    from mosaic.plugins import host, singular

    h = host()
    infos = [info.to_json() for info in h.plugins.values()]
    owned: dict[str, list[str]] = {}
    for kind, registry in h.registries.items():
        for name, reg in registry.items():
            owned.setdefault(reg.plugin, []).append(f"{singular(kind)}:{name}")
    for name, plugin in h.commands.items():
        owned.setdefault(plugin, []).append(f"command:{name}")
    for info in infos:
        info["provides"] = sorted(owned.get(info["name"], []))
    if as_json:
        echo_json({"plugins": infos})
        return
    if not infos:
        click.echo("No mosaic plugins are installed. Install one, e.g.\n"
                   "  pip install mosaic-gpu-hopper      (GPU records: H100, H200)\n"
                   "  pip install mosaic-target-cutlass  (CUTLASS C++ kernels)\n"
                   "  pip install mosaic-amk             (the megakernel generator)\n"
                   "or from this repository: pip install ./packages/<name>")
        return
    rows = [[i["name"], i["distribution"], i["version"], i["status"],
             _provides_summary(i["provides"]) or ("-" if i["status"] == "ok" else i["error"])] for i in infos]
    click.echo(table(rows, ["plugin", "distribution", "version", "status", "provides"]))
