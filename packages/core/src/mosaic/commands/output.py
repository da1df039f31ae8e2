"""What every verb prints with: JSON and plain aligned tables."""

from __future__ import annotations

import json

import click


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])
