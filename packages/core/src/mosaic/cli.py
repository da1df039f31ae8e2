"""The ``mosaic`` command line.

Plugins add commands through ``register_commands``. Errors a user can cause print one line,
``error: <what> (<where>)``, and exit 2 (a failed verify exits 1); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import json
import os
import sys

import click

from mosaic import __version__
from mosaic.errors import MosaicError


def _echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mosaic", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
    """Mosaicist: port GPU kernels between kernel languages by convergence, and build validated
    megakernels. Run `mosaic plugins` to see what is installed."""


def _provides_summary(provides: list[str], most: int = 3) -> str:
    """``gpu:h200, language:cute, 35 constructs``: names while few, a count when many (--json lists all)."""
    by_kind: dict[str, list[str]] = {}
    for item in provides:
        kind, _, name = item.partition(":")
        by_kind.setdefault(kind, []).append(name)
    parts = []
    for kind, names in by_kind.items():
        parts += [f"{len(names)} {kind}s"] if len(names) > most else [f"{kind}:{n}" for n in names]
    return ", ".join(parts)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """List installed plugins and what each registers."""
    from mosaic.plugins import host

    h = host()
    infos = [info.to_json() for info in h.plugins.values()]
    owned: dict[str, list[str]] = {}
    for kind, registry in h.registries.items():
        for name, reg in registry.items():
            owned.setdefault(reg.plugin, []).append(f"{kind[:-1]}:{name}")
    for name, plugin in h.commands.items():
        owned.setdefault(plugin, []).append(f"command:{name}")
    for info in infos:
        info["provides"] = sorted(owned.get(info["name"], []))
    if as_json:
        _echo_json({"plugins": infos})
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
    click.echo(_table(rows, ["plugin", "distribution", "version", "status", "provides"]))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def gpus(as_json: bool) -> None:
    """List registered GPU targets and detect the device(s) present."""
    from mosaic.gpus import detect
    from mosaic.plugins import host

    targets = host().items("gpus")
    detection = detect(targets.values())
    if as_json:
        _echo_json({"targets": [t.to_json() for t in targets.values()],
                    "devices": [d.to_json() for d in detection.devices], "reason": detection.reason})
        return
    if targets:
        rows = [[t.name, t.display_name, t.arch, str(t.sm_count), f"{t.smem_per_block // 1024} KiB",
                 f"{t.l2_bytes / 2**20:.0f} MiB", f"{t.hbm_bandwidth_gbs:.0f} GB/s",
                 f"{t.peak_bf16_tflops:.0f}", str(t.max_cluster_size)] for t in targets.values()]
        click.echo(_table(rows, ["name", "model", "arch", "SMs", "smem/block", "L2", "DRAM BW",
                                 "bf16 TFLOP/s", "cluster"]))
    else:
        click.echo("No GPU records are registered: pip install mosaic-gpu-hopper or mosaic-gpu-blackwell.")
    click.echo("")
    if not detection.devices:
        click.echo(f"Detected: none ({detection.reason})")
    for d in detection.devices:
        what = f"matches '{d.target.name}'" if d.target else "matches no registered record"
        click.echo(f"Detected: device {d.index}: {d.name}, sm_{d.compute_capability[0]}{d.compute_capability[1]}, "
                   f"{d.sm_count} SMs — {what}")


@cli.group()
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
        _echo_json(b.manifest)
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
    click.echo(_table(rows, ["file", "role", "bytes", "sha256"]))


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


@cli.command("catalog")
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
        _echo_json(cat.to_json(langs))
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


from mosaic.lift.commands import diff, lift  # noqa: E402

cli.add_command(lift)
cli.add_command(diff)


from mosaic.capture_command import capture as _capture_command  # noqa: E402  (issue 4)
from mosaic.check_command import check as _check_command  # noqa: E402  (issue 4)

cli.add_command(_check_command)
cli.add_command(_capture_command)

from mosaic.run_command import run as _run_command  # noqa: E402 - the convergence loop (issue 6)

cli.add_command(_run_command)


def _add_plugin_commands() -> None:
    from mosaic.plugins import host

    host().add_commands(cli)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one-line errors with exit 2, tracebacks only with --debug (or MOSAIC_DEBUG=1)."""
    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args or os.environ.get("MOSAIC_DEBUG") == "1"
    try:
        _add_plugin_commands()
        rv = cli.main(args=args, prog_name="mosaic", standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) else 0)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:  # bad arguments: one line, exit 2
        if debug:
            raise
        where = f" (try 'mosaic {exc.ctx.command_path.partition(' ')[2]} --help')".replace("  ", " ") \
            if getattr(exc, "ctx", None) is not None else ""
        click.echo(f"error: {exc.format_message()}{where}", err=True)
        sys.exit(2)
    except MosaicError as exc:
        if debug:
            raise
        click.echo(f"error: {exc.line()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # an unreadable or missing file named by the user
        if debug:
            raise
        click.echo(f"error: {exc.strerror or exc} ({exc.filename or 'file system'})", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
