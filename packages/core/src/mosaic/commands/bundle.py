"""``mosaic bundle show|verify|pack|unpack``: a bundle's manifest, its schema and hashes checked, and its storage
(large members compressed, or every member plain) changed without changing its identity."""

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
    rows = [[f.path, f.role, str(f.size), f"{f.codec} {f.stored_size}" if f.codec else "plain", f.sha256[:16]]
            for f in b.files]
    click.echo(table(rows, ["file", "role", "bytes", "stored", "sha256"]))


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


def _bundles_under(paths: tuple[str, ...]) -> list:
    """Every bundle directory named, or found (``*.bundle`` with a manifest) under a named directory."""
    from pathlib import Path

    from mosaic.bundle import MANIFEST
    from mosaic.errors import BadInput

    found = []
    for raw in paths:
        p = Path(raw)
        if (p / MANIFEST).is_file():
            found.append(p)
        elif p.is_dir():
            hits = sorted(d for d in p.rglob("*.bundle") if (d / MANIFEST).is_file() and not d.is_symlink())
            if not hits:
                raise BadInput("holds no bundle (a directory with a manifest.json)", raw)
            found.extend(hits)
        else:
            raise BadInput("no such bundle or directory", raw)
    return found


def _restore_all(paths: tuple[str, ...], compress: bool, preset: int | None) -> None:
    """Rewrite every bundle; one that does not verify is named and left as it is (exit 1 at the end)."""
    from mosaic.bundle import restore
    from mosaic.errors import BundleError

    before = after = 0
    bundles, skipped = _bundles_under(paths), []
    for root in bundles:
        try:
            _, was, now = restore(root, compress=compress, preset=preset)
        except BundleError as exc:
            skipped.append(root)
            click.echo(f"{root}: skipped, it does not verify ({exc.what}); left as it was", err=True)
            continue
        before, after = before + was, after + now
        click.echo(f"{root}: {was:,} -> {now:,} bytes")
    done = len(bundles) - len(skipped)
    click.echo(f"{done} bundle(s): {before:,} -> {after:,} bytes stored; identities (content SHA-256s) unchanged"
               + (f"; {len(skipped)} skipped" if skipped else ""))
    if skipped:
        sys.exit(1)


@bundle.command("pack")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--preset", type=click.IntRange(0, 9), default=None, help="xz preset (default 6; 9 packs tighter).")
def bundle_pack(paths: tuple[str, ...], preset: int | None) -> None:
    """Store every large member of the bundles (or of every bundle under a directory) xz-compressed.

    The manifest keeps each member's SHA-256 and size of its plain content, so the bundle's identity does not
    change; every reader (show, verify, lift, diff, check, run --offline) reads both forms."""
    _restore_all(paths, True, preset)


@bundle.command("unpack")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
def bundle_unpack(paths: tuple[str, ...]) -> None:
    """Store every member of the bundles plain again (for tools that read a bundle's files directly)."""
    _restore_all(paths, False, None)
