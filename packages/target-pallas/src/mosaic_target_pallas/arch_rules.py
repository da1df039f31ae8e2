"""Which architecture a lowered Mosaic GPU kernel targets, read from the module itself, and whether jax can take
it to PTX on this machine. Rules as data.

jax lowers a Pallas Mosaic GPU kernel (``lowering_platforms=("cuda",)``) to StableHLO holding the Mosaic GPU
module; the module carries the tensor-core instructions the kernel issues as PTX strings (inline asm) and NVVM
ops: Hopper's ``wgmma.mma_async`` or Blackwell's ``tcgen05.mma``/``tcgen05.alloc``. ``wgmma`` exists on sm_90a
only (sm_100a replaced it with tcgen05), ``tcgen05`` on the sm_100a family only: a kernel whose module holds
one is lowerable for those architectures and no other, whatever the StableHLO and shared-memory checks said.

The PTX step: jax compiles the Mosaic GPU module to PTX in the mosaic_gpu custom call of jax's CUDA plugin at
XLA compile time (a CUDA client, i.e. a GPU). jaxlib's CPU wheel registers the Mosaic GPU dialect only: its
``_mosaic_gpu_ext`` has no compile entry and the lowering passes to NVVM/LLVM are not registered, so on a
machine without jax[cuda] and a GPU there is no PTX to assemble (:func:`ptx_step_missing` says exactly why).
"""

from __future__ import annotations

import re

import attrs


@attrs.frozen
class ArchMarker:
    """Instructions in a Mosaic GPU module that tie the kernel to ``arches``."""

    code: str
    pattern: str  # a regex over the lowered module's text
    arches: tuple
    reason: str


MARKERS = (
    ArchMarker("PALLAS-ARCH-WGMMA", r"\bwgmma\.mma_async\b", ("sm_90a",),
               "it issues Hopper's wgmma.mma_async (sm_90a only; Blackwell's tensor core is tcgen05)"),
    ArchMarker("PALLAS-ARCH-TCGEN05", r"\btcgen05\.(?:mma|alloc|ld|st|cp)\b", ("sm_100a", "sm_103a"),
               "it issues Blackwell's tcgen05 MMA and TMEM instructions (sm_100a family only)"),
)

#: what a jaxlib that can produce PTX registers (the custom call's pipeline); probed by :func:`ptx_step_missing`
PTX_PASSES = ("convert-gpu-to-nvvm", "gpu-launch-lowering", "mosaic-convert-gpu-to-llvm")


def markers_in(text: str) -> list[ArchMarker]:
    return [m for m in MARKERS if re.search(m.pattern, text)]


def refusal(text: str, arch: str, name: str) -> str | None:
    """One line when the lowered module ``text`` targets architectures other than ``arch``, else None."""
    for m in markers_in(text):
        if arch not in m.arches:
            return (f"[{m.code}] {name} cannot lower for {arch}: {m.reason}; it lowers for "
                    f"{', '.join(m.arches)} only")
    return None


#: refused marker -> (the marker whose arches the other GEMM kernel targets, its ``kernel`` knob, what it is)
GEMM_KERNEL_FOR = {"PALLAS-ARCH-WGMMA": ("PALLAS-ARCH-TCGEN05", "jax-blackwell", "jax's blackwell_matmul_mgpu, tcgen05"),
                   "PALLAS-ARCH-TCGEN05": ("PALLAS-ARCH-WGMMA", "jax-hopper", "jax's hopper_matmul_mgpu, wgmma")}


def gemm_pointer(line: str, arch: str) -> str:
    """``line`` (a :func:`refusal` of a GEMM) followed by the GEMM kernel that does target ``arch`` and whether it
    goes to PTX here; unchanged when no marker refused it or the other kernel does not target ``arch`` either."""
    code = line[1:line.index("]")] if line.startswith("[") and "]" in line else ""
    if code not in GEMM_KERNEL_FOR:
        return line
    other, kernel, what = GEMM_KERNEL_FOR[code]
    if arch not in next(m.arches for m in MARKERS if m.code == other):
        return line
    status = ""
    if other == "PALLAS-ARCH-TCGEN05":  # whether jax's Blackwell matmul goes to PTX on this machine
        missing = ptx_step_missing()
        status = f": it cannot lower to PTX here: {missing}" if missing else ": it lowers here"
    return f"{line}; for {arch} the GEMM kernel={kernel} is {what}{status}"


def target_arches(text: str) -> tuple:
    """The architectures every marker of the module admits (empty: no tensor-core marker found)."""
    found = markers_in(text)
    if not found:
        return ()
    out = set(found[0].arches)
    for m in found[1:]:
        out &= set(m.arches)
    return tuple(sorted(out))


def _registered(name: str) -> bool:
    from jaxlib.mlir import ir, passmanager

    try:
        with ir.Context():
            passmanager.PassManager.parse(f"builtin.module({name})")
        return True
    except Exception:  # noqa: BLE001 -- MLIR raises a plain exception for an unregistered pass
        return False


def ptx_step_missing() -> str | None:
    """Why jax cannot take a Mosaic GPU module to PTX on this machine (None when it can: a CUDA device)."""
    import jax
    import jaxlib
    from jax._src.lib import cuda_versions

    try:
        has_gpu = any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        has_gpu = False
    if has_gpu:
        return None
    missing = [p for p in PTX_PASSES if not _registered(p)]
    plugin = "jax's CUDA plugin is not installed" if cuda_versions is None else "jax's CUDA plugin has no GPU"
    passes = f"; jaxlib {jaxlib.__version__} registers none of {', '.join(missing)}" if missing else ""
    return (f"jax {jax.__version__} lowers Mosaic GPU to PTX only in the CUDA plugin's mosaic_gpu custom call at "
            f"XLA compile time, which needs a CUDA device: {plugin}{passes}")
