"""``mosaic bundle show|verify``: a bundle's manifest, and its schema and hashes checked."""

from __future__ import annotations

import sys

import click

from mosaic.commands.output import echo_json, table


@click.group("bundle")
def bundle() -> None:
    """Inspect and verify captured bundles."""


@bundle.command("show")
@click.argument("path", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True)
def bundle_show(path: str, as_json: bool) -> None:
    """Print a bundle's manifest summary (without verifying hashes)."""
    from mosaic.bundle import load_bundle

    b = load_bundle(path, verify=False)
    if as_json:
        echo_json(b.manifest)
        return
    k = b.kernel
    shape = "x".join(f"{v}" for v in k.shape.values())
    click.echo(f"bundle   {b.root}")
    click.echo(f"kernel   {k.family} {shape} {k.dtype} ({k.name or 'unnamed'})")
    click.echo(f"language {b.language}    gpu {b.gpu or '-'}    created {b.manifest.get('created', '-')}")
    if k.knobs:
        click.echo("knobs    " + ", ".join(f"{a}={v}" for a, v in sorted(k.knobs.items())))
    for tool, ver in sorted(b.toolchain.items()):
        click.echo(f"tool     {tool} {ver}")
    launch = b.launch()
    if launch:
        click.echo(f"launch   grid {launch.grid} block {launch.block} cluster {launch.cluster} "
                   f"smem {launch.static_smem}+{launch.dynamic_smem} regs {launch.registers_per_thread} "
                   f"(from {launch.source})")
    rows = [[f.path, f.role, str(f.size), f.sha256[:16]] for f in b.files]
    click.echo(table(rows, ["file", "role", "bytes", "sha256"]))


@bundle.command("verify")
@click.argument("path", type=click.Path(path_type=str))
def bundle_verify(path: str) -> None:
    """Check the schema and every file's size and SHA-256. Exit 1 naming the first bad file."""
    from mosaic.bundle import read_manifest, verify_bundle

    read_manifest(path)  # schema problems: BundleError
    problems = verify_bundle(path)
    if problems:
        click.echo(f"FAILED: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                   err=True)
        sys.exit(1)
    click.echo(f"OK: {path}")
