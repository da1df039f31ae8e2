"""``mosaic fuzz FILE|BUNDLE``: random shapes, dtypes, distributions and seeds for a kernel file against the
float64 oracle; the smallest failing case is written as a bundle (:mod:`mosaic.fuzz`)."""

from __future__ import annotations

from pathlib import Path

import click

from mosaic.commands.output import echo_json


@click.command("fuzz")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--lang", "lang", default=None, help="The kernel file's language (a bundle says its own).")
@click.option("--family", "family", default=None, help="The kernel family (a bundle says its own).")
@click.option("--dtype", "dtypes", multiple=True, help="Input format(s) to draw from (repeatable; default the bundle's, "
              "else bf16).")
@click.option("--knob", "knobs", multiple=True, help="name=value of the file's knob class (repeatable).")
@click.option("--minutes", type=click.FloatRange(0.05, 24 * 60), default=5.0, show_default=True,
              help="Time budget; the run stops earlier at the first failing case.")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=None, help="The fuzzer's own seed (default: drawn).")
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("fuzz-out"), show_default=True,
              help="Where the smallest failing case is written (smallest-failure.bundle).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fuzz(target: Path, lang: str | None, family: str | None, dtypes: tuple[str, ...], knobs: tuple[str, ...],
         minutes: float, seed: int | None, out: Path, as_json: bool) -> None:
    """Fuzz a kernel file (or a bundle captured from one) against the float64 oracle: every case through the
    numerics gate's stages, in the language's CPU interpreter. Exit 1 when a case failed."""
    from mosaic import fuzz as fz
    from mosaic.capture import parse_knobs
    from mosaic.errors import BadInput
    from mosaic.kernel_files import check_language, read_kernel_file

    knob_values = parse_knobs(knobs)
    with _kernel_file(target) as (path, spec):
        lang = lang or (spec.language if spec else None)
        family = family or (spec.family if spec else None)
        if not lang or not family:
            raise BadInput("a kernel file needs --lang and --family (a bundle records them)", str(target))
        dtypes = dtypes or ((spec.dtype,) if spec else ("bf16",))
        if spec:
            knob_values = {**dict(spec.knobs), **knob_values}
        kfile = read_kernel_file(path)
        check_language(kfile, lang)
        kfile.knob_values({k: v for k, v in knob_values.items() if kfile.knob(k) is not None})
        say = None if as_json else (lambda line: click.echo(line, err=True))
        r = fz.fuzz(kfile, lang, family, dtypes, knob_values, minutes=minutes, out=out, seed=seed, progress=say)
    if r.unavailable:
        raise BadInput(f"cannot fuzz here: {r.unavailable}", str(target))
    if as_json:
        echo_json(r.to_json())
    elif r.smallest is None:
        click.echo(f"fuzz: {r.cases} cases in {r.batches} batches, {r.wall_s:.0f} s, no failure (fuzzer seed {r.seed})")
    else:
        c, f = r.smallest["case"], r.smallest["finding"]
        click.echo(f"fuzz: FAILED after {r.cases} cases ({r.wall_s:.0f} s, fuzzer seed {r.seed}): [{f['stage']}] "
                   f"{f['reason']}")
        click.echo(f"smallest failing case: {c['shape']} {c['dtype']} {c['values']} seed {c['seed']} -> {r.bundle}")
    if r.smallest is not None:
        raise SystemExit(1)


class _kernel_file:
    """``(path of the kernel file, the bundle's KernelSpec or None)``: a bundle's copy of its file is written to a
    temporary directory for the run."""

    def __init__(self, target: Path):
        self.target, self.tmp = target, None

    def __enter__(self):
        import tempfile

        from mosaic.bundle import load_bundle
        from mosaic.errors import BadInput
        from mosaic.kernel_files import captured_file_source

        if self.target.is_file():
            return self.target, None
        if not self.target.is_dir():
            raise BadInput("no such kernel file or bundle", str(self.target))
        b = load_bundle(self.target)
        source = captured_file_source(b)
        if source is None:
            raise BadInput("this bundle is of a language's own kernel, not a kernel file: fuzz runs kernel files",
                           str(self.target))
        self.tmp = tempfile.TemporaryDirectory(prefix="mosaic-fuzz-file-")
        path = Path(self.tmp.name) / b.manifest["kernel_file"]["path"]
        path.write_text(source)
        return path, b.kernel

    def __exit__(self, *exc):
        if self.tmp is not None:
            self.tmp.cleanup()
        return False
