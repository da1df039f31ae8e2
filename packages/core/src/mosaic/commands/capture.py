"""``mosaic capture``: build (and on a GPU run, check and time) one kernel in its own process and
write a bundle. ``--lower-only`` works on any machine: PTX, SASS, cubin, ptxas log, no outputs or times."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click


def _is_bundle(path: Path) -> bool:
    """A directory (not a link) holding a regular manifest.json: what ``capture --force`` may replace."""
    return path.is_dir() and not path.is_symlink() and (path / "manifest.json").is_file() \
        and not (path / "manifest.json").is_symlink()


@click.command("capture")
@click.option("--lang", "language", required=True, help="Kernel language (see `mosaic plugins`).")
@click.option("--family", required=True, help="Kernel family, e.g. gemm.")
@click.option("--file", "kernel_file", default=None,
              help="Build this kernel file (.cu, or a CuTe DSL / Pallas .py) instead of the language's own "
                   "kernels; its contract: docs/kernel-files.md. --knob sets the file's knob class.")
@click.option("--shape", required=True, help="Problem shape: MxNxK for gemm (or m=..,n=..,k=..).")
@click.option("--dtype", required=True, help="Input/output format, e.g. bf16.")
@click.option("--knob", "knobs", multiple=True, help="A knob as name=value (repeatable).")
@click.option("--gpu", default=None,
              help="GPU record to lower for and run on (mosaic gpus); default: the detected device's record, h200 "
                   "without a GPU. With --lower-only any record may be named; otherwise it must be the device's.")
@click.option("--lower-only", is_flag=True, help="Lower only (no GPU needed): PTX, SASS, ptxas log.")
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False), help="X.bundle to write.")
@click.option("--timeout", default=1800.0, show_default=True, help="Seconds before the capture process is killed.")
@click.option("--seed", default=0, show_default=True, help="Seed of the generated inputs.")
@click.option("--values", default="normal", show_default=True,
              help="Input value distribution: normal (rounded to dtype), int (small integers: bit-exact check), "
                   "large, equal-rows, denormal (see `mosaic families`).")
@click.option("--runs", default=50, show_default=True, help="Timed runs per block.")
@click.option("--blocks", default=20, show_default=True, help="Blocks of runs (their spread is the noise).")
@click.option("--name", default="", help="Kernel name recorded in the spec.")
@click.option("--force", is_flag=True, help="Overwrite an existing bundle.")
@click.option("--profile", is_flag=True,
              help="After a successful capture, profile one launch under Nsight Compute (ncu, clocks left "
                   "alone) and store its metrics in the bundle: the fingerprint's machine layer.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def capture(language, family, kernel_file, shape, dtype, knobs, gpu, lower_only, out, timeout, seed, values, runs,
            blocks, name, force, profile, as_json) -> None:
    """Capture one kernel into a bundle, in a child process with a timeout; exit 1 unless it succeeded."""
    from mosaic.capture import CaptureOptions, parse_knobs, parse_shape
    from mosaic.capture import capture as run_capture
    from mosaic.errors import BadInput
    from mosaic.gpus import resolve_gpu
    from mosaic.plugins import host
    from mosaic.records import KernelSpec

    if Path(out).exists() or Path(out).is_symlink():
        if not force:
            raise BadInput("bundle already exists; pass --force to replace it", out)
        if not _is_bundle(Path(out)):
            raise BadInput("exists and is not a bundle (a directory holding manifest.json); --force replaces only "
                           "a bundle: remove it yourself or choose another -o", out)
    for flag, value in (("--timeout", timeout),):
        if not (value > 0 and math.isfinite(value)):
            raise BadInput(f"{flag} {value!r} must be a positive number of seconds", flag)
    for flag, value in (("--runs", runs), ("--blocks", blocks)):
        if value < 1:
            raise BadInput(f"{flag} {value!r} must be a positive integer", flag)
    if profile:
        from mosaic.profile import find_ncu

        if lower_only:
            raise BadInput("--profile runs the kernel: it cannot go with --lower-only", "--profile")
        find_ncu()  # none: one line, before anything is built
    h = host()
    lang = h.get("languages", language)
    choice = resolve_gpu(gpu, on_device=not lower_only)  # a lowering only may target any record
    gpu = choice.name
    if kernel_file is not None:
        opts = CaptureOptions(lower_only=lower_only, timeout=timeout, seed=seed, values=values, runs=runs,
                              blocks=blocks)
        result, kfile = _capture_file(kernel_file, language, family, shape, dtype, knobs, gpu, lower_only, out,
                                      name, values, opts)
        _profile(result, profile, gpu, opts, kfile)
        _show(result, lower_only, as_json, choice)
        return
    if family not in lang.families:
        raise BadInput(f"language '{language}' builds no family '{family}'; it builds: "
                       f"{', '.join(lang.families) or 'nothing yet'}", "--family")
    spec = KernelSpec(family=family, shape=parse_shape(family, shape), dtype=dtype, language=language,
                      knobs=parse_knobs(knobs), name=name)
    if not lower_only:  # the family must generate these inputs: one clear line, exit 2, before any child
        from mosaic.families import input_generator

        input_generator(spec, values)
    if lang.backend is not None:  # validate knobs here: one clear line, exit 2
        knob_cls = lang.backend.knobs(family)
        try:
            knob_cls(**spec.knobs)
        except TypeError as exc:
            import attrs

            known = ", ".join(f.name for f in attrs.fields(knob_cls)) if attrs.has(knob_cls) else "see the plugin"
            unknown = sorted(set(spec.knobs) - {f.name for f in attrs.fields(knob_cls)}) if attrs.has(knob_cls) else []
            what = f"unknown knob(s) {', '.join(unknown)}" if unknown else f"knobs not valid: {exc}"
            raise BadInput(f"{what} for {language} {family}; known: {known}", "--knob") from None
        except ValueError as exc:
            raise BadInput(f"knobs not valid for {language} {family}: {exc}", "--knob") from None
    opts = CaptureOptions(lower_only=lower_only, timeout=timeout, seed=seed, values=values, runs=runs, blocks=blocks)
    result = run_capture(spec, gpu, out, opts)
    _profile(result, profile, gpu, opts, None)
    _show(result, lower_only, as_json, choice)


def _profile(result, profile: bool, gpu: str, opts, kfile) -> None:
    """``--profile`` after a capture that passed: the bundle gains Nsight Compute's metrics (mosaic.profile).
    A failed profile is one line on stderr and exit 1 (the bundle itself stays as captured)."""
    if not profile or result.status != "ok":
        return
    from mosaic.errors import MosaicError
    from mosaic.profile import profile_bundle

    try:
        record = profile_bundle(result.bundle, gpu, opts, kernel_file=kfile,
                                progress=lambda line: click.echo(line, err=True))
    except MosaicError as exc:
        click.echo(f"error: profile: {exc.line()}", err=True)
        raise click.exceptions.Exit(1) from None
    result.summary["profile"] = {"kernel": record["kernel"], "picked_by": record["picked_by"],
                                 "metrics": len(record["metrics"]), "tool": record["version"]}


def _capture_file(path, language, family, shape, dtype, knobs, gpu, lower_only, out, name, values, opts):
    """``--file``: read the file's contract here (nothing of it runs in this process), then build it in
    the child. A broken file -- its contract, its import, its compile -- is one error line, exit 2."""
    from mosaic import kernel_files as kf
    from mosaic.capture import parse_knobs, parse_shape
    from mosaic.errors import BadInput
    from mosaic.families import get, registry
    from mosaic.records import KernelSpec

    kfile = kf.read_kernel_file(path)
    kf.check_language(kfile, language)
    fam = get(family)
    if fam is None:
        raise BadInput(f"no family '{family}'; known: {', '.join(registry())}", "--family")
    kfile.check_family(tuple(fam.dims), fam.optional_dims)
    spec = KernelSpec(family=family, shape=parse_shape(family, shape), dtype=dtype, language=language,
                      knobs=kfile.knob_values(parse_knobs(knobs)), name=name or kfile.name)
    if not lower_only:
        from mosaic.families import input_generator

        input_generator(spec, values)
    result = kf.capture_file(kfile, spec, gpu, out, opts)
    built = result.bundle is not None and (Path(result.bundle) / "lowering.json").is_file()
    if result.status == "bad-file" or (result.status == "unbuildable" and not built):  # the file does not build
        kept = f"; the bundle {result.bundle} records it" if result.bundle else ""
        raise BadInput(f"{result.message or result.status}{kept}")
    return result, kfile


def _show(result, lower_only: bool, as_json: bool, choice) -> None:
    """The result; its first line (or its JSON) names the GPU record and why it is that one."""
    if as_json:
        click.echo(json.dumps({**result.to_json(), "gpu": choice.name, "gpu_provenance": choice.provenance},
                              indent=2))
    else:
        click.echo(f"{result.status}: {result.bundle} for gpu {choice.line()}"
                   + (f" ({result.message})" if result.message else ""))
        s = result.summary
        if s.get("profile"):
            p = s["profile"]
            click.echo(f"  profile: {p['metrics']} Nsight Compute metrics of {p['kernel'][:80]} ({p['tool']})")
        if s.get("time_ns"):
            click.echo(f"  device time {s['time_ns'] / 1e3:.2f} us (median, {s.get('timer')}), "
                       f"noise {(s.get('noise_ns') or 0) / 1e3:.2f} us")
    ok = "lowered" if lower_only else "ok"
    if result.status != ok:
        raise click.exceptions.Exit(1)
