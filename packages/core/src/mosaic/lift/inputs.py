"""What can be lifted: a cubin, a SASS listing, a PTX module, or a bundle directory.

The type is decided by content (an ELF header, SASS address comments, PTX directives), never by running
anything from the file. Cubins are disassembled with nvdisasm and their attributes read with cuobjdump
(:mod:`mosaic.toolchain`). A bundle is lifted from its SASS (or its cubin) together with its launch record, ptxas log
and Nsight Compute metrics; a bundle with neither SASS nor a cubin is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from mosaic import limits
from mosaic.errors import BadInput, BundleError
from mosaic.lift.fingerprint import Context, Fingerprint, lift_program
from mosaic.lift.instruction import Program
from mosaic.lift.ptx import looks_like_ptx, parse_ptx
from mosaic.lift.resources import parse_ptxas_log, read_metrics
from mosaic.lift.sass import looks_like_sass, parse_sass
from mosaic.toolchain.cubin import ELF_MAGIC, cubin_attributes
from mosaic.toolchain.nvdisasm import disassemble as disassemble_cubin


def choose_kernel(programs: dict[str, Program], kernel: str | None, where: str) -> Program:
    if kernel is not None:
        if kernel not in programs:
            raise BadInput(f"no kernel {kernel!r}; the file has {', '.join(sorted(programs))}", where)
        return programs[kernel]
    prog = max(programs.values(), key=lambda p: (len(p.instructions), p.kernel))
    if len(programs) > 1:
        others = sorted(k for k in programs if k != prog.kernel)
        prog.warnings.append(f"{len(programs)} kernels in {where}; lifted the largest, {prog.kernel} "
                             f"(others: {', '.join(others)}; pick one with --kernel)")
    return prog


def _text(data: bytes, where: str) -> str:
    if b"\x00" in data[:65536]:
        raise BadInput("binary file that is not a cubin (not SASS, PTX, a cubin or a bundle)", where)
    return data.decode("utf-8", errors="replace")


def parse_text(text: str, where: str) -> dict[str, Program]:
    if looks_like_sass(text):
        return parse_sass(text, where=where)
    if looks_like_ptx(text):
        return parse_ptx(text, where=where)
    raise BadInput("not SASS, PTX, a cubin or a bundle (no SASS addresses, no PTX directives)", where)


def lift_cubin(path: Path, kernel: str | None, ctx: Context) -> Fingerprint:
    programs = parse_sass(disassemble_cubin(path), where=str(path))
    prog = choose_kernel(programs, kernel, str(path))
    ctx.cubin = cubin_attributes(path).get(prog.kernel)
    return lift_program(prog, ctx)


def lift_path(path: str | os.PathLike, *, kernel: str | None = None, gpu=None) -> Fingerprint:
    """Lift a cubin, SASS listing, PTX module or bundle directory into a fingerprint. A member of a bundle named
    by its path (``X.bundle/kernel.sass``) is read whatever its storage (plain, or compressed as ``kernel.sass.xz``)."""
    from mosaic.bundle import member_path

    where = str(path)
    p = Path(path)
    if p.is_dir():
        return lift_bundle(p, kernel=kernel, gpu=gpu)
    p = member_path(p)
    data = limits.read_bytes(p, "text_bytes", where)  # a regular file within the limit; never /dev/zero
    ctx = Context(gpu=gpu, origin=where)
    if data[:4] == ELF_MAGIC:
        return lift_cubin(p, kernel, ctx)
    reader = _plugin_reader(p.suffix)
    if reader is not None:
        try:
            text = reader(data)
        except Exception as exc:  # a plugin's reader failing on a user's file is bad input, reported in one line
            raise BadInput(f"the {p.suffix} reader could not read the file: {exc}", where) from None
        return lift_program(choose_kernel(parse_sass(text, where=where), kernel, where), ctx)
    text = _text(data, where)
    return lift_program(choose_kernel(parse_text(text, where), kernel, where), ctx)


def _plugin_reader(suffix: str):
    if not suffix or suffix in (".cubin", ".sass", ".ptx", ".txt", ".s"):
        return None
    from mosaic.plugins import host

    reg = host().artifact_readers.get(suffix)
    return reg.item if reg is not None else None


def _metrics_file(b) -> Path | None:
    """The bundle's Nsight Compute metrics: ``profile.json`` (``capture --profile``), else a ``metrics``-role
    ``metrics.json`` handed in; a capture's other ``metrics`` files (lowering.json, oracle.json) are not it."""
    for role, name in (("profile", "profile.json"), ("metrics", "metrics.json")):
        for path in b.find(role):
            if path.name == name:
                return path
    return None


def lift_bundle(root: Path, *, kernel: str | None = None, gpu=None) -> Fingerprint:
    from mosaic.bundle import load_bundle

    b = load_bundle(root)
    where = str(root)
    kernel = kernel or (b.kernel.name or None)
    ctx = Context(gpu=gpu, origin=where, launch=b.launch())
    log = b.read_text("ptxas_log")
    metrics_path = _metrics_file(b)
    if metrics_path is not None:
        try:
            data = limits.read_json(metrics_path)
        except BadInput as exc:
            raise BundleError(f"metrics file: {exc.what}", str(metrics_path)) from None
        ctx.metrics = read_metrics(data, str(metrics_path))
    sass_path, cubin_path = b.one("sass"), b.one("cubin")
    if sass_path is None and cubin_path is None:
        raise BundleError("bundle has no SASS (and no cubin to disassemble); re-capture it with SASS", where)
    if sass_path is not None:
        programs = parse_sass(limits.read_text(sass_path), where=str(sass_path))
        prog = _pick_in_bundle(programs, kernel, ctx, where)
        if cubin_path is not None:
            ctx.cubin = cubin_attributes(cubin_path).get(prog.kernel)
    else:
        programs = parse_sass(disassemble_cubin(cubin_path), where=str(cubin_path))
        prog = _pick_in_bundle(programs, kernel, ctx, where)
        ctx.cubin = cubin_attributes(cubin_path).get(prog.kernel)
    if log:
        ctx.ptxas = parse_ptxas_log(log).get(prog.kernel)
    return lift_program(prog, ctx)


def _pick_in_bundle(programs, kernel, ctx, where) -> Program:
    if kernel and kernel not in programs and ctx.launch is not None and ctx.launch.kernel_name in programs:
        kernel = ctx.launch.kernel_name
    if kernel and kernel not in programs:
        kernel = None  # the spec's display name need not be the symbol
    return choose_kernel(programs, kernel, where)


PARALLEL_MIN_BYTES = 4 * 2**20


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    return path.stat().st_size if path.exists() else 0


def _lift_one(args):
    path, kernel, gpu = args
    return lift_path(path, kernel=kernel, gpu=gpu)


def lift_pair(reference, candidate, *, kernel: str | None = None, gpu=None) -> tuple[Fingerprint, Fingerprint]:
    """Lift both sides; large inputs are lifted in two forked worker processes at once (one per core).

    The workers return fingerprints that this process's own code built (pickled between our own processes
    by multiprocessing; nothing user-supplied is ever unpickled). Errors come back as the same BadInput.
    """
    ref, cand = Path(reference), Path(candidate)
    if min(_size(ref), _size(cand)) < PARALLEL_MIN_BYTES or (os.cpu_count() or 1) < 2:
        return lift_path(ref, kernel=kernel, gpu=gpu), lift_path(cand, kernel=kernel, gpu=gpu)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    try:
        ctx = mp.get_context("fork")
    except ValueError:  # no fork on this platform
        return lift_path(ref, kernel=kernel, gpu=gpu), lift_path(cand, kernel=kernel, gpu=gpu)
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        a, b = pool.map(_lift_one, [(ref, kernel, gpu), (cand, kernel, gpu)])
    return a, b
