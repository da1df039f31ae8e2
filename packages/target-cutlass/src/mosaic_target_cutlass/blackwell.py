"""CUTLASS 4.x GEMM for Blackwell (sm_100a) through the Sm100 CollectiveBuilder: the knob class, the rules
that decide whether a knob combination can be built (data: each rule a code, the knobs it reads and its
reason), and the source it renders to (``templates/gemm_sm100.cu``).

D[M,N] = A[M,K] . B[K,N], row-major, A/B/D in bf16 or fp16, fp32 accumulation in tensor memory (TMEM),
no source operand C. The mainloop is tcgen05.mma (UMMA) from shared memory; ``kernel_schedule="sm100-1sm"``
issues it from one CTA (KernelTmaWarpSpecialized1SmSm100, TmaWarpSpecialized1Sm epilogue), ``"sm100-2sm"`` from
a CTA pair of the cluster (KernelTmaWarpSpecialized2SmSm100, TmaWarpSpecialized2Sm epilogue). ``tile_m`` x ``tile_n`` is the
tile of one MMA instruction: for 2SM it spans the CTA pair (each CTA holds tile_m/2 rows of A and of D).

Sources of the limits (the PTX ISA, "tcgen05.mma" valid shapes; CUTLASS 4.2's sm100_umma_builder.inl
static_asserts): 1-CTA MMA M is 64 or 128, N a multiple of 8 (M=64) or 16 (M=128) up to 256; 2-CTA MMA M is
128 or 256, N a multiple of 32 (M=128) or 16 (M=256) up to 256, and the cluster's M extent must be even;
TMEM holds 512 32-bit columns per SM (128 lanes), the fp32 accumulator of an N-wide tile takes N columns.
"""

from __future__ import annotations

from importlib import resources

import attrs
from mosaic import budget as fit
from mosaic.errors import Diagnostic
from mosaic.fields import fail, one_of
from mosaic.records import GpuTarget, KernelSpec

from mosaic_target_cutlass.gemm import ALIGN, ELEMENTS, _in, _int, _stage_count

ARCHES = ("sm_100a",)  # the Sm100 builder's tcgen05/TMEM kernels: B200 (cc 10.0)
MMA = {  # kernel_schedule -> (mainloop schedule, the epilogue schedule it needs)
    "sm100-1sm": ("cutlass::gemm::KernelTmaWarpSpecialized1SmSm100", "cutlass::epilogue::TmaWarpSpecialized1Sm"),
    "sm100-2sm": ("cutlass::gemm::KernelTmaWarpSpecialized2SmSm100", "cutlass::epilogue::TmaWarpSpecialized2Sm"),
}
TILE_SCHEDULERS = {"default": "void", "stream-k": "cutlass::gemm::StreamKScheduler"}
TMEM_COLUMNS = 512  # 32-bit columns of tensor memory per SM (PTX ISA, "Tensor Memory")
ACCUMULATOR_STAGES = 2  # the builder double-buffers the accumulator in TMEM (MMA of tile i+1 under epilogue i)


def _tile_n(inst, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or not (8 <= value <= 256) or value % 8:
        fail(inst, attribute, value, "a multiple of 8 from 8 to 256 (the UMMA N extent)")


@attrs.frozen
class BlackwellGemmKnobs:
    """Knobs of the CUTLASS Blackwell GEMM; each field is validated at construction, the combinations by RULES."""

    kernel_schedule: str = attrs.field(default="sm100-1sm", validator=one_of(*MMA),
                                       metadata={"values": ("sm100-1sm", "sm100-2sm")})
    tile_m: int = attrs.field(default=128, converter=_int, validator=_in(64, 128, 256))
    tile_n: int = attrs.field(default=128, converter=_int, validator=_tile_n)
    tile_k: int = attrs.field(default=64, converter=_int, validator=_in(64, 128))
    cluster_m: int = attrs.field(default=1, converter=_int, validator=_in(1, 2, 4))
    cluster_n: int = attrs.field(default=1, converter=_int, validator=_in(1, 2, 4))
    stages: object = attrs.field(default="auto", converter=_int, validator=_stage_count,
                                 metadata={"values": ("auto", 4, 5, 3, 6)})
    tile_scheduler: str = attrs.field(default="default", validator=one_of(*TILE_SCHEDULERS))

    @property
    def label(self) -> str:
        return (f"{self.kernel_schedule}-{self.tile_m}x{self.tile_n}x{self.tile_k}-c{self.cluster_m}x{self.cluster_n}"
                f"-s{self.stages}-{self.tile_scheduler}")

    def cta_tile(self) -> tuple[int, int]:
        """(rows of A, columns of B) one CTA stages per k-block: 2SM splits M and N over the CTA pair."""
        return (self.tile_m // 2, self.tile_n // 2) if self.kernel_schedule == "sm100-2sm" else (self.tile_m, self.tile_n)


# -- rules as data: (code, the knobs it reads, its reason, the predicate that finds the problem) -------------

@attrs.frozen
class Rule:
    code: str
    fields: tuple
    reason: str
    check: object  # (knobs, spec, gpu) -> iterable of Diagnostic


def _arch(k, spec, gpu):
    if gpu.arch not in ARCHES:
        yield Diagnostic("CUTLASS-SM100-ARCH", "gpu", " or ".join(ARCHES), gpu.arch,
                         "the Sm100 template issues tcgen05.mma from TMEM: Blackwell datacenter (sm_100a) only")


def _dtype(k, spec, gpu):
    if spec.dtype not in ELEMENTS:
        yield Diagnostic("CUTLASS-DTYPE", "dtype", sorted(ELEMENTS), spec.dtype, "the GEMM takes 16-bit inputs")


_MMA_M = {"sm100-1sm": (64, 128), "sm100-2sm": (128, 256)}
_MMA_N_STEP = {("sm100-1sm", 64): 8, ("sm100-1sm", 128): 16, ("sm100-2sm", 128): 32, ("sm100-2sm", 256): 16}


def _mma_shape(k, spec, gpu):
    if k.tile_m not in _MMA_M[k.kernel_schedule]:
        allowed = " or ".join(map(str, _MMA_M[k.kernel_schedule]))
        yield Diagnostic("CUTLASS-SM100-MMA-M", "tile_m", allowed, k.tile_m,
                         f"a {k.kernel_schedule[6:].upper()} tcgen05.mma has M {allowed}")
        return
    step = _MMA_N_STEP[(k.kernel_schedule, k.tile_m)]
    if k.tile_n % step:
        yield Diagnostic("CUTLASS-SM100-MMA-N", "tile_n", f"a multiple of {step}", k.tile_n,
                         f"a {k.kernel_schedule[6:].upper()} M={k.tile_m} tcgen05.mma takes N in steps of {step}")


def _pair(k, spec, gpu):
    if k.kernel_schedule == "sm100-2sm" and k.cluster_m % 2:
        yield Diagnostic("CUTLASS-SM100-2SM-CLUSTER", "cluster_m", "even (2 or 4)", k.cluster_m,
                         "a 2SM MMA runs on a CTA pair: the cluster's M extent must be a multiple of 2")


def _tmem(k, spec, gpu):
    need = ACCUMULATOR_STAGES * k.tile_n
    if need > TMEM_COLUMNS:
        yield Diagnostic("CUTLASS-SM100-TMEM", "tile_n", f"<= {TMEM_COLUMNS // ACCUMULATOR_STAGES}", k.tile_n,
                         f"{ACCUMULATOR_STAGES} fp32 accumulators of {k.tile_n} columns exceed TMEM's "
                         f"{TMEM_COLUMNS} columns")


def _cluster(k, spec, gpu):
    size = k.cluster_m * k.cluster_n
    for d in fit.diagnose(fit.Footprint(where="cluster", cluster_size=size), gpu, ("cluster-size",)):
        yield attrs.evolve(d, code="CUTLASS-CLUSTER", expected=f"<= {gpu.max_cluster_size} CTAs",
                           message=f"{gpu.name} allows clusters of at most {gpu.max_cluster_size}")


def _smem(k, spec, gpu):
    if k.stages == "auto" or spec.dtype not in ELEMENTS:
        return
    tm, tn = k.cta_tile()
    need = k.stages * (tm + tn) * k.tile_k * 2  # one CTA's A and B stages alone
    for d in fit.diagnose(fit.Footprint(where="stages", smem_bytes=need), gpu, ("smem-per-block",)):
        yield attrs.evolve(d, code="CUTLASS-SMEM", expected=f"<= {gpu.smem_per_block} bytes of shared memory",
                           message=f"{k.stages} stages of {tm}x{k.tile_k} + {k.tile_k}x{tn} tiles per CTA do not "
                                   f"fit {gpu.name} ({gpu.smem_per_block} bytes per block)")


def _streamk(k, spec, gpu):
    if k.tile_scheduler == "stream-k" and k.kernel_schedule == "sm100-2sm" and k.cluster_n > 1:
        yield Diagnostic("CUTLASS-SM100-STREAMK", "tile_scheduler", "default", k.tile_scheduler,
                         "this template offers stream-K on 1SM or 2SM clusters with cluster_n = 1 only")


def _shape(k, spec, gpu):
    for dim in ("m", "n", "k"):
        v = spec.shape.get(dim)
        if v is None:
            yield Diagnostic("CUTLASS-SHAPE", f"shape.{dim}", "present", None, "gemm shape needs m, n, k")
        elif v % ALIGN:
            yield Diagnostic("CUTLASS-ALIGN", f"shape.{dim}", f"a multiple of {ALIGN}", v,
                             "TMA needs 16-byte aligned rows")


RULES = (
    Rule("CUTLASS-SM100-ARCH", ("gpu",), "tcgen05/TMEM kernels are sm_100a only", _arch),
    Rule("CUTLASS-DTYPE", ("dtype",), "16-bit inputs", _dtype),
    Rule("CUTLASS-SM100-MMA-M", ("kernel_schedule", "tile_m"), "1SM M in {64,128}; 2SM M in {128,256}", _mma_shape),
    Rule("CUTLASS-SM100-2SM-CLUSTER", ("kernel_schedule", "cluster_m"), "a 2SM MMA needs a CTA pair along M", _pair),
    Rule("CUTLASS-SM100-TMEM", ("tile_n",), "double-buffered fp32 accumulators fit 512 TMEM columns", _tmem),
    Rule("CUTLASS-CLUSTER", ("cluster_m", "cluster_n"), "the cluster fits the GPU record", _cluster),
    Rule("CUTLASS-SMEM", ("stages", "tile_m", "tile_n", "tile_k", "kernel_schedule"), "stages fit shared memory", _smem),
    Rule("CUTLASS-SM100-STREAMK", ("tile_scheduler", "kernel_schedule", "cluster_n"), "stream-K support", _streamk),
    Rule("CUTLASS-ALIGN", ("shape",), "16-byte aligned rows", _shape),
)


def problems(knobs: BlackwellGemmKnobs, spec: KernelSpec, gpu: GpuTarget) -> list[Diagnostic]:
    return [d for rule in RULES for d in rule.check(knobs, spec, gpu)]


def can_implement(knobs: BlackwellGemmKnobs, spec: KernelSpec, gpu: GpuTarget) -> list[Diagnostic]:
    """The CPU predicate (no nvcc): every rule of :data:`RULES`."""
    return problems(knobs, spec, gpu)


def render(knobs: BlackwellGemmKnobs, dtype: str) -> str:
    """The CUDA C++ translation unit (kernel + host shim) for these knobs."""
    text = resources.files("mosaic_target_cutlass").joinpath("templates/gemm_sm100.cu").read_text()
    stages = ("cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>("
              "sizeof(typename CollectiveEpilogue::SharedStorage))>" if knobs.stages == "auto"
              else f"cutlass::gemm::collective::StageCount<{knobs.stages}>")
    mainloop, epilogue = MMA[knobs.kernel_schedule]
    values = {
        "ELEMENT": ELEMENTS[dtype], "TILE_M": knobs.tile_m, "TILE_N": knobs.tile_n, "TILE_K": knobs.tile_k,
        "CLUSTER_M": knobs.cluster_m, "CLUSTER_N": knobs.cluster_n, "SM_COUNT": knobs.kernel_schedule[6],
        "KERNEL_SCHEDULE": mainloop, "EPILOGUE_SCHEDULE": epilogue,
        "TILE_SCHEDULER": TILE_SCHEDULERS[knobs.tile_scheduler], "STAGES": stages,
    }
    for key, val in values.items():
        text = text.replace("{{" + key + "}}", str(val))
    header = "// knobs: " + ", ".join(f"{a.name}={getattr(knobs, a.name)}" for a in attrs.fields(BlackwellGemmKnobs))
    return f"// dtype: {dtype}\n{header}\n{text}"


def is_blackwell(gpu: GpuTarget) -> bool:
    return gpu.arch in ARCHES
