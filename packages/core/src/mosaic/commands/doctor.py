"""``mosaic doctor``: which tools, GPU, CUPTI and languages are usable here, and what to install for the rest."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json

TITLES = {"python": "Python", "distribution": "Installed mosaic distributions", "plugin": "Plugins",
          "tool": "CUDA toolchain", "gpu": "GPU", "cupti": "CUPTI", "language": "Kernel languages",
          "optional": "Optional packages"}


@click.command("doctor")
@click.option("--require", "required", multiple=True, metavar="X",
              help="Exit 1 unless X is usable here: a tool (nvcc, ptxas, nvdisasm, cuobjdump, or 'tools' for all), "
                   "'gpu', 'cupti', a language (cute, pallas, cutlass), a plugin name or an optional package (torch, "
                   "ray, mcp, rich, tqdm, cupy-cuda13x). Repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(required: tuple[str, ...], as_json: bool) -> None:
    """Report what is usable on this machine (Python, mosaic distributions and plugins, nvcc/ptxas/nvdisasm/
    cuobjdump, the GPU, CUPTI, each kernel language) and the exact line that installs each missing piece.
    Exits 0 (it is a report) unless a --require is not met."""
    from mosaic import doctor as doc
    from mosaic.errors import BadInput

    checks = doc.diagnose()
    unmet: list[str] = []
    for what in required:
        found = doc.find(checks, what)
        if found is None:
            raise BadInput(f"--require: unknown '{what}'; known: {', '.join(doc.requirable(checks))}", "doctor")
        if not doc.satisfied(found, what):
            unmet.append(what)
    fixes = doc.missing_fixes(checks)
    if as_json:
        echo_json({"checks": [c.to_json() for c in checks], "install": fixes,
                   "required": {w: w not in unmet for w in required}})
    else:
        for section in doc.SECTIONS:
            rows = [c for c in checks if c.section == section]
            if not rows:
                continue
            click.echo(f"{TITLES[section]}:")
            width = max(len(c.name) for c in rows)
            for c in rows:
                fix = f"  ({c.fix})" if c.section == "optional" and not c.ok else ""
                click.echo(f"  {'ok' if c.ok else '--'}  {c.name.ljust(width)}  {c.detail}{fix}")
        if fixes:
            click.echo("\nTo install what is missing:")
            for line in fixes:
                click.echo(f"  {line}")
        for what in unmet:
            click.echo(f"required '{what}' is not usable here", err=True)
    if unmet:
        raise click.exceptions.Exit(1)
