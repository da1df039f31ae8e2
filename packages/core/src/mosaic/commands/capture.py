"""``mosaic capture``: build (and on a GPU run, check and time) one kernel in its own process and
write a bundle. ``--lower-only`` works on any machine: PTX, SASS, cubin, ptxas log, no outputs or times."""

from __future__ import annotations

import json

import click


@click.command("capture")
@click.option("--lang", "language", required=True, help="Kernel language (see `mosaic plugins`).")
@click.option("--family", required=True, help="Kernel family, e.g. gemm.")
@click.option("--shape", required=True, help="Problem shape: MxNxK for gemm (or m=..,n=..,k=..).")
@click.option("--dtype", required=True, help="Input/output format, e.g. bf16.")
@click.option("--knob", "knobs", multiple=True, help="A knob as name=value (repeatable).")
@click.option("--gpu", default="h200", show_default=True, help="GPU record to lower for and run on.")
@click.option("--lower-only", is_flag=True, help="Lower only (no GPU needed): PTX, SASS, ptxas log.")
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False), help="X.bundle to write.")
@click.option("--timeout", default=1800.0, show_default=True, help="Seconds before the capture process is killed.")
@click.option("--seed", default=0, show_default=True, help="Seed of the generated inputs.")
@click.option("--values", type=click.Choice(["normal", "int"]), default="normal", show_default=True,
              help="Input values: normal (rounded to dtype) or small integers (bit-exact check).")
@click.option("--runs", default=50, show_default=True, help="Timed runs per block.")
@click.option("--blocks", default=20, show_default=True, help="Blocks of runs (their spread is the noise).")
@click.option("--name", default="", help="Kernel name recorded in the spec.")
@click.option("--force", is_flag=True, help="Overwrite an existing bundle.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def capture(language, family, shape, dtype, knobs, gpu, lower_only, out, timeout, seed, values, runs, blocks, name,
            force, as_json) -> None:
    """Capture one kernel into a bundle, in a child process with a timeout; exit 1 unless it succeeded."""
    from pathlib import Path

    from mosaic.capture import CaptureOptions, parse_knobs, parse_shape
    from mosaic.capture import capture as run_capture
    from mosaic.errors import BadInput
    from mosaic.plugins import host
    from mosaic.records import KernelSpec

    if Path(out).exists() and not force:
        raise BadInput("bundle already exists; pass --force to replace it", out)
    h = host()
    lang = h.get("languages", language)
    h.get("gpus", gpu)
    if family not in lang.families:
        raise BadInput(f"language '{language}' builds no family '{family}'; it builds: "
                       f"{', '.join(lang.families) or 'nothing yet'}", "--family")
    spec = KernelSpec(family=family, shape=parse_shape(family, shape), dtype=dtype, language=language,
                      knobs=parse_knobs(knobs), name=name)
    if lang.backend is not None:
        lang.backend.knobs(family)(**spec.knobs)  # validate knobs here: one clear line, exit 2
    opts = CaptureOptions(lower_only=lower_only, timeout=timeout, seed=seed, values=values, runs=runs, blocks=blocks)
    result = run_capture(spec, gpu, out, opts)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(f"{result.status}: {result.bundle}" + (f" ({result.message})" if result.message else ""))
        s = result.summary
        if s.get("time_ns"):
            click.echo(f"  device time {s['time_ns'] / 1e3:.2f} us (median, {s.get('timer')}), "
                       f"noise {(s.get('noise_ns') or 0) / 1e3:.2f} us")
    ok = "lowered" if lower_only else "ok"
    if result.status != ok:
        raise click.exceptions.Exit(1)
