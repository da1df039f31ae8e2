"""Ahead-of-time lowering of the CuTe kernels for an SM architecture on a machine with no GPU.

``cute.compile(..., options="--gpu-arch sm_90a --keep-ptx --keep-cubin --dump-dir D")`` with fake
tensors (shapes and strides only) gives PTX and a cubin; the cubin's ELF gives registers and static
shared memory, the kernel object gives the launch's dynamic shared memory, and :mod:`budget` checks them
against the GpuTarget record. Families: ``gemm`` (:func:`compile_gemm`) and ``attention``
(:func:`compile_attention`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import attrs
from mosaic.backend import Unbuildable
from mosaic.errors import BadInput, ToolMissing
from mosaic.kernel_files import failure
from mosaic.toolchain import nvdisasm, ptxas
from mosaic.toolchain.cubin import read_cubin
from mosaic.toolchain.tools import version_line

from mosaic_target_cute.knobs import AttentionKnobs, AttentionShape, GemmKnobs

CUTE_DTYPES = {"bf16": "BFloat16", "f16": "Float16"}


@attrs.frozen
class CuteBuild:
    kernel_name: str
    ptx: Path | None  # None for a build loaded from the artifact store (it keeps the cubin only)
    cubin: Path
    registers: int
    static_smem: int
    dynamic_smem: int
    threads: int
    cluster: tuple
    grid_ctas: int
    compile_seconds: float


def gemm_tensors(m: int, n: int, k: int, dtype: str):
    """Fake (M, K, L) A, (N, K, L) B and (M, N, L) C for row-major a (m×k), b (k×n), c (m×n)."""
    import cutlass
    from cutlass.cute.runtime import make_fake_tensor

    t = getattr(cutlass, CUTE_DTYPES[dtype])
    a = make_fake_tensor(t, (m, k, 1), (k, 1, m * k), assumed_align=16)
    b = make_fake_tensor(t, (n, k, 1), (1, n, n * k), assumed_align=16)
    c = make_fake_tensor(t, (m, n, 1), (n, 1, m * n), assumed_align=16)
    return a, b, c


def make_kernel(knobs: GemmKnobs, m: int, n: int, sm_count: int):
    if knobs.kernel == "naive":
        from mosaic_target_cute.kernels.naive_gemm import NaiveGemm

        return NaiveGemm(knobs)
    if knobs.kernel == "blackwell":
        from mosaic_target_cute.kernels.blackwell_gemm import BlackwellGemm
        from mosaic_target_cute.kernels.blackwell_gemm import max_active_clusters as bw_clusters

        return BlackwellGemm(knobs, bw_clusters(knobs, m, n, sm_count))
    from mosaic_target_cute.kernels.hopper_gemm import HopperGemm, max_active_clusters

    return HopperGemm(knobs, max_active_clusters(knobs, m, n, sm_count))


def line_info() -> bool:
    """``MOSAIC_CUTE_DEBUG`` set: compile with line info (for compute-sanitizer / cuda-gdb reports)."""
    return bool(os.environ.get("MOSAIC_CUTE_DEBUG"))


def compile_gemm(knobs: GemmKnobs, m: int, n: int, k: int, dtype: str, arch: str, sm_count: int,
                 dump_dir: Path, tensors=None, stream=None):
    """Compile; return (compiled callable, CuteBuild). Raises Unbuildable with the compiler's message."""
    if dtype not in CUTE_DTYPES:
        raise Unbuildable(f"cute gemm supports dtypes {', '.join(CUTE_DTYPES)}, not {dtype}", "dtype")
    kernel = make_kernel(knobs, m, n, sm_count)
    args = tensors if tensors is not None else gemm_tensors(m, n, k, dtype)
    compiled, ptx, cubin, seconds = _compile(kernel, args, stream, arch, dump_dir, str(knobs))
    return compiled, describe(kernel, knobs, m, n, ptx, cubin, seconds)


def _compile(kernel, args, stream, arch: str, dump_dir: Path, where: str):
    """``cute.compile`` for ``arch`` keeping PTX and cubin under ``dump_dir`` (made afresh); returns (compiled
    callable, ptx, cubin, seconds). Raises Unbuildable with the compiler's first line."""
    import time

    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream

    dump_dir = Path(dump_dir)
    if dump_dir.exists():
        shutil.rmtree(dump_dir)
    dump_dir.mkdir(parents=True)  # the DSL writes nothing when the directory is missing
    options = f"--gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    if line_info():
        options += " --generate-line-info"
    start = time.perf_counter()
    try:
        compiled = cute.compile(kernel, *args, stream if stream is not None else make_fake_stream(),
                                options=options)
    except Exception as exc:  # the DSL raises many types; a failed compile is an unbuildable setting
        raise failure("cute.compile failed", exc, where) from None
    seconds = time.perf_counter() - start
    ptx = sorted(dump_dir.glob("*.ptx"))
    cubin = sorted(dump_dir.glob("*.cubin"))
    if not ptx or not cubin:
        raise Unbuildable(f"cute.compile wrote no PTX/cubin under {dump_dir}", where)
    return compiled, ptx[0], cubin[0], seconds


def describe(kernel, knobs: GemmKnobs, m: int, n: int, ptx: Path | None, cubin: Path, seconds: float) -> CuteBuild:
    """The CuteBuild of a compiled kernel: the cubin's figures, the kernel object's launch."""
    kernels = read_cubin(Path(cubin).read_bytes())
    if not kernels:
        raise Unbuildable("the cubin holds no kernel", str(cubin))
    main = max(kernels, key=lambda kk: kk.code_bytes)
    cm, cn = (1, 1) if knobs.kernel == "naive" else knobs.cluster_mn
    if knobs.kernel == "naive":
        grid = (m // knobs.block_mn[0]) * (n // knobs.block_mn[1])
    else:
        grid = kernel.max_active_clusters * cm * cn
    return CuteBuild(kernel_name=main.name, ptx=ptx, cubin=Path(cubin), registers=main.registers,
                     static_smem=main.static_smem, dynamic_smem=int(kernel.smem_bytes or 0),
                     threads=kernel.threads, cluster=(cm, cn, 1), grid_ctas=grid, compile_seconds=seconds)


# -- attention ---------------------------------------------------------------------------------------------

def attention_tensors(shape: AttentionShape, dtype: str):
    """Fake tensors over the family's row-major buffers ``q`` (batch, heads, seq, head_dim), ``k``/``v`` (batch,
    kv_heads, seq, head_dim), ``o`` like ``q``: q and o as (seq, head_dim, batch*heads), k as (seq, head_dim,
    batch*kv_heads), v transposed as (head_dim, seq, batch*kv_heads) -- the same bytes, other strides."""
    import cutlass
    from cutlass.cute.runtime import make_fake_tensor

    t = getattr(cutlass, CUTE_DTYPES[dtype])
    s, d = shape.seq, shape.head_dim
    lq, lkv = shape.batch * shape.heads, shape.batch * shape.kv_heads
    q = make_fake_tensor(t, (s, d, lq), (d, 1, s * d), assumed_align=16)
    k = make_fake_tensor(t, (s, d, lkv), (d, 1, s * d), assumed_align=16)
    vt = make_fake_tensor(t, (d, s, lkv), (1, d, s * d), assumed_align=16)
    o = make_fake_tensor(t, (s, d, lq), (d, 1, s * d), assumed_align=16)
    return q, k, vt, o


def make_attention_kernel(knobs: AttentionKnobs, shape: AttentionShape, sm_count: int):
    if knobs.kernel == "naive":
        from mosaic_target_cute.kernels.naive_attention import NaiveAttention

        return NaiveAttention(knobs, shape)
    from mosaic_target_cute.kernels.hopper_attention import HopperAttention

    return HopperAttention(knobs, shape, sm_count)


def compile_attention(knobs: AttentionKnobs, shape: AttentionShape, dtype: str, arch: str, sm_count: int,
                      dump_dir: Path, tensors=None, stream=None):
    """Compile the attention forward; return (compiled callable, CuteBuild). Raises Unbuildable with the
    compiler's message."""
    if dtype not in CUTE_DTYPES:
        raise Unbuildable(f"cute attention supports dtypes {', '.join(CUTE_DTYPES)}, not {dtype}", "dtype")
    kernel = make_attention_kernel(knobs, shape, sm_count)
    args = tensors if tensors is not None else attention_tensors(shape, dtype)
    compiled, ptx, cubin, seconds = _compile(kernel, args, stream, arch, dump_dir, str(knobs))
    kernels = read_cubin(Path(cubin).read_bytes())
    if not kernels:
        raise Unbuildable("the cubin holds no kernel", str(cubin))
    main = max(kernels, key=lambda kk: kk.code_bytes)
    return compiled, CuteBuild(kernel_name=main.name, ptx=ptx, cubin=Path(cubin), registers=main.registers,
                               static_smem=main.static_smem, dynamic_smem=int(kernel.smem_bytes or 0),
                               threads=kernel.threads, cluster=(1, 1, 1), grid_ctas=kernel.grid_ctas,
                               compile_seconds=seconds)


def disassemble(cubin: Path, out: Path) -> Path | None:
    """The cubin's SASS (``nvdisasm -c -g``) written to ``out``; None without nvdisasm or when it fails."""
    try:
        out.write_text(nvdisasm.disassemble(cubin, ("-c", "-g")))
    except BadInput:
        return None
    return out


def ptxas_log(ptx: Path, arch: str, out: Path) -> Path | None:
    """Re-assemble the kept PTX with ptxas -v (the assembler's resource report); None without ptxas."""
    try:
        asm = ptxas.assemble(ptx, arch, None)
    except ToolMissing:
        return None
    out.write_text(f"# {asm.exe} -arch={arch} -v {ptx.name}  ({version_line(asm.exe)})\n" + asm.log)
    return out
