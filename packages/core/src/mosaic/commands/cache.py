"""``mosaic cache info|prune``: the user cache (float64 oracle references, campaign scratch, builds, converted
checkpoints) measured per section, and trimmed least recently used first (:mod:`mosaic.user_cache`)."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json, table


@click.group("cache")
def cache() -> None:
    """Show and trim the user cache ($MOSAIC_CACHE_DIR, capped by $MOSAIC_CACHE_MAX)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True)
def cache_info(as_json: bool) -> None:
    """The cache's root, its cap, and each section's size and entry count."""
    from mosaic.user_cache import UserCache, human

    data = UserCache.from_env().info()
    if as_json:
        echo_json(data)
        return
    cap = "off (MOSAIC_CACHE_MAX=off)" if data["cap"] is None else f"{human(data['cap'])} (MOSAIC_CACHE_MAX)"
    click.echo(f"root   {data['root']}")
    click.echo(f"cap    {cap}")
    rows = [[s["name"], human(s["bytes"]), str(s["entries"]), s["what"]] for s in data["sections"]]
    rows.append(["total", human(data["total"]), str(sum(s["entries"] for s in data["sections"] if s["managed"])),
                 "of the sections mosaic writes"])
    click.echo(table(rows, ["section", "size", "entries", "holds"]))
    if data["cap"] is not None and data["total"] > data["cap"]:
        click.echo(f"over the cap by {human(data['total'] - data['cap'])}: `mosaic cache prune` trims it")


@cache.command("prune")
@click.option("--max", "max_size", metavar="SIZE", default=None,
              help="Trim to this size (20GiB, 500MB, bytes); default the cap, MOSAIC_CACHE_MAX.")
@click.option("--section", default=None, metavar="NAME", help="Trim only this section (oracle, scratch, cutlass, ...).")
@click.option("--all", "everything", is_flag=True, help="Remove every entry (of the section) that is not in use.")
@click.option("--json", "as_json", is_flag=True)
def cache_prune(max_size: str | None, section: str | None, everything: bool, as_json: bool) -> None:
    """Remove least recently used entries until the cache (or --section) is at most --max; entries in use (a
    running campaign's scratch, a write in progress) stay."""
    from mosaic.errors import BadInput
    from mosaic.user_cache import UserCache, human, parse_size

    if everything and max_size is not None:
        raise BadInput("--all and --max cannot be given together", "mosaic cache prune")
    c = UserCache.from_env()
    if everything:
        target = 0
    elif max_size is not None:
        target = parse_size(max_size, "--max")
    elif c.cap is None:
        raise BadInput("the cap is off (MOSAIC_CACHE_MAX=off): say how far with --max SIZE or --all",
                       "mosaic cache prune")
    else:
        target = c.cap
    done = c.trim(target, section=section)
    if as_json:
        echo_json({"root": str(c.root), "section": section, "max": target,
                   "removed": [e.to_json() for e in done.removed],
                   "in_use": [{**e.to_json(), "why": why} for e, why in done.in_use],
                   "before": done.before, "after": done.after, "freed": done.freed})
        return
    for e in done.removed:
        click.echo(f"removed {e.section}/{e.path.relative_to(c.root / e.section)}  {human(e.bytes)}")
    for e, why in done.in_use:
        click.echo(f"kept    {e.section}/{e.path.relative_to(c.root / e.section)}  {human(e.bytes)} ({why})")
    where = f"section {section}" if section else "the cache"
    n = len(done.removed)
    click.echo(f"{n} {'entry' if n == 1 else 'entries'} removed, {done.freed:,} bytes ({human(done.freed)}) freed: "
               f"{where} {human(done.before)} -> {human(done.after)} (target {human(target)})")
