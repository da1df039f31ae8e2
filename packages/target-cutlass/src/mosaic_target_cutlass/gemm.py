"""CUTLASS 3.x GEMM for Hopper (sm_90a) through the CollectiveBuilder: the knob class, the rules that
decide whether a knob combination can be built, and the source it renders to.

D[M,N] = A[M,K] . B[K,N], row-major, A/B/D in bf16 or fp16, fp32 accumulation (no source operand C).
The problem shape is a run-time argument: one build serves every shape with M, N, K multiples of 8
(16-byte rows for TMA).
"""

from __future__ import annotations

from importlib import resources

import attrs
from mosaic import budget as fit
from mosaic.errors import Diagnostic
from mosaic.fields import fail, one_of
from mosaic.records import GpuTarget, KernelSpec

ELEMENTS = {"bf16": "cutlass::bfloat16_t", "f16": "cutlass::half_t"}
KERNEL_SCHEDULES = {
    "auto": "cutlass::gemm::collective::KernelScheduleAuto",
    "tma-ws": "cutlass::gemm::KernelTmaWarpSpecialized",  # one consumer warpgroup, not persistent
    "cooperative": "cutlass::gemm::KernelTmaWarpSpecializedCooperative",  # 2 consumer WGs share a tile
    "pingpong": "cutlass::gemm::KernelTmaWarpSpecializedPingpong",  # 2 consumer WGs alternate tiles
    # Blackwell's schedules (blackwell.py renders them for sm_100a); on Hopper rule CUTLASS-SM100-SCHEDULE refuses
    "sm100-1sm": "cutlass::gemm::KernelTmaWarpSpecialized1SmSm100",
    "sm100-2sm": "cutlass::gemm::KernelTmaWarpSpecialized2SmSm100",
}
EPILOGUE_SCHEDULES = {
    "auto": "cutlass::epilogue::collective::EpilogueScheduleAuto",
    "tma": "cutlass::epilogue::TmaWarpSpecialized",
    "tma-cooperative": "cutlass::epilogue::TmaWarpSpecializedCooperative",
    "no-smem": "cutlass::epilogue::NoSmemWarpSpecialized",
}
TILE_SCHEDULERS = {
    "default": "void",  # the kernel's default: persistent for cooperative/ping-pong, none for tma-ws
    "persistent": "cutlass::gemm::PersistentScheduler",
    "stream-k": "cutlass::gemm::StreamKScheduler",
}
ALIGN = 8  # elements: 16 bytes of a 16-bit type


def _int(value):
    """Knobs arrive as strings from the command line (``--knob tile_m=128``)."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


def _stages(value):
    value = _int(value)
    return value


def _in(*allowed: int):
    def check(inst, attribute, value):
        if isinstance(value, bool) or value not in allowed:
            fail(inst, attribute, value, "one of " + ", ".join(map(str, allowed)))

    return check


def _tile_n(inst, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or not (16 <= value <= 256) or value % 16:
        fail(inst, attribute, value, "a multiple of 16 from 16 to 256 (the WGMMA N extent)")


def _stage_count(inst, attribute, value):
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 12):
        fail(inst, attribute, value, "'auto' or an integer from 2 to 12")


#: what the ``knobs`` proposer may try for the knobs it cannot step numerically (field metadata ``values``,
#: nearest first) and the companion settings a value needs to be buildable (``implies``: the epilogue
#: schedule must match the kernel schedule, rule CUTLASS-EPILOGUE)
_SCHEDULE_IMPLIES = {"cooperative": {"epilogue_schedule": "tma-cooperative"}, "pingpong": {"epilogue_schedule": "tma"},
                     "tma-ws": {"epilogue_schedule": "tma"}}


@attrs.frozen
class GemmKnobs:
    """Knobs of the CUTLASS Hopper GEMM. Every field is validated at construction."""

    tile_m: int = attrs.field(default=128, converter=_int, validator=_in(64, 128, 256))
    tile_n: int = attrs.field(default=128, converter=_int, validator=_tile_n)
    tile_k: int = attrs.field(default=64, converter=_int, validator=_in(32, 64, 128))
    cluster_m: int = attrs.field(default=1, converter=_int, validator=_in(1, 2, 4))
    cluster_n: int = attrs.field(default=1, converter=_int, validator=_in(1, 2, 4))
    stages: object = attrs.field(default="auto", converter=_stages, validator=_stage_count,
                                 metadata={"values": (4, 5, 3, 6, 7, "auto")})
    kernel_schedule: str = attrs.field(default="cooperative", validator=one_of(*KERNEL_SCHEDULES),
                                       metadata={"values": ("cooperative", "pingpong", "tma-ws"),
                                                 "implies": _SCHEDULE_IMPLIES})
    epilogue_schedule: str = attrs.field(default="tma-cooperative", validator=one_of(*EPILOGUE_SCHEDULES),
                                         metadata={"values": ("tma-cooperative", "tma", "no-smem")})
    # whether a persistent or stream-K tile loop pays depends on the tiles each SM walks (CTA tile and cluster):
    # one rejected on a tiling is a new edit on another (the knobs proposer's retry rule reads "interacts")
    tile_scheduler: str = attrs.field(default="default", validator=one_of(*TILE_SCHEDULERS),
                                      metadata={"values": ("default", "persistent", "stream-k"),
                                                "interacts": ("tile_m", "tile_n", "cluster_m", "cluster_n")})

    @property
    def label(self) -> str:
        return (f"{self.kernel_schedule}-{self.tile_m}x{self.tile_n}x{self.tile_k}-c{self.cluster_m}x{self.cluster_n}"
                f"-s{self.stages}-{self.epilogue_schedule}-{self.tile_scheduler}")


# -- rules: each a small function with a code; all run, every problem is returned -------------------

def _r_dtype(k: GemmKnobs, spec: KernelSpec, gpu: GpuTarget):
    if spec.dtype not in ELEMENTS:
        yield Diagnostic("CUTLASS-DTYPE", "dtype", sorted(ELEMENTS), spec.dtype, "the GEMM takes 16-bit inputs")


def _r_arch(k, spec, gpu):
    if gpu.arch != "sm_90a":
        yield Diagnostic("CUTLASS-ARCH", "gpu", "sm_90a", gpu.arch, "this template targets Hopper WGMMA/TMA")


def _r_sm100_schedule(k, spec, gpu):
    if k.kernel_schedule.startswith("sm100-"):
        yield Diagnostic("CUTLASS-SM100-SCHEDULE", "kernel_schedule", "a Hopper schedule", k.kernel_schedule,
                         "the sm100 schedules issue tcgen05.mma: build them with a Blackwell GPU (--gpu b200)")


def _r_cooperative_tile(k, spec, gpu):
    if k.kernel_schedule == "cooperative" and k.tile_m % 128:
        yield Diagnostic("CUTLASS-COOP-TILE", "tile_m", "a multiple of 128", k.tile_m,
                         "the cooperative schedule splits tile_m over two 64-row consumer warpgroups")


def _r_epilogue(k, spec, gpu):
    ok = {"auto": {"auto"}, "cooperative": {"tma-cooperative", "no-smem"},
          "pingpong": {"tma", "no-smem"}, "tma-ws": {"tma", "no-smem"}}.get(k.kernel_schedule)
    if ok is not None and k.epilogue_schedule not in ok:
        yield Diagnostic("CUTLASS-EPILOGUE", "epilogue_schedule", sorted(ok), k.epilogue_schedule,
                         f"the epilogue schedule must match the kernel schedule '{k.kernel_schedule}'")


def _r_scheduler(k, spec, gpu):
    if k.tile_scheduler != "default" and k.kernel_schedule in ("tma-ws", "auto"):
        yield Diagnostic("CUTLASS-SCHEDULER", "tile_scheduler", "default", k.tile_scheduler,
                         f"kernel schedule '{k.kernel_schedule}' takes no explicit tile scheduler")
    if k.tile_scheduler == "stream-k" and k.kernel_schedule != "cooperative":
        yield Diagnostic("CUTLASS-STREAMK", "tile_scheduler", "cooperative kernel schedule", k.kernel_schedule,
                         "stream-K is built on the cooperative kernel")


def _r_cluster(k, spec, gpu):
    size = k.cluster_m * k.cluster_n
    for d in fit.diagnose(fit.Footprint(where="cluster", cluster_size=size), gpu, ("cluster-size",)):
        yield attrs.evolve(d, code="CUTLASS-CLUSTER", expected=f"<= {gpu.max_cluster_size} CTAs",
                           message=f"{gpu.name} allows clusters of at most {gpu.max_cluster_size}")


def _r_smem(k, spec, gpu):
    if k.stages == "auto" or spec.dtype not in ELEMENTS:
        return
    need = k.stages * (k.tile_m + k.tile_n) * k.tile_k * 2  # the mainloop's A and B stages alone
    for d in fit.diagnose(fit.Footprint(where="stages", smem_bytes=need), gpu, ("smem-per-block",)):
        yield attrs.evolve(d, code="CUTLASS-SMEM", expected=f"<= {gpu.smem_per_block} bytes of shared memory",
                           message=f"{k.stages} stages of {k.tile_m}x{k.tile_k} + {k.tile_k}x{k.tile_n} tiles do "
                                   f"not fit {gpu.name} ({gpu.smem_per_block} bytes per block)")


def _r_shape(k, spec, gpu):
    for dim in ("m", "n", "k"):
        v = spec.shape.get(dim)
        if v is None:
            yield Diagnostic("CUTLASS-SHAPE", f"shape.{dim}", "present", None, "gemm shape needs m, n, k")
        elif v % ALIGN:
            yield Diagnostic("CUTLASS-ALIGN", f"shape.{dim}", f"a multiple of {ALIGN}", v,
                             "TMA needs 16-byte aligned rows")


RULES = (_r_dtype, _r_arch, _r_sm100_schedule, _r_cooperative_tile, _r_epilogue, _r_scheduler, _r_cluster, _r_smem, _r_shape)


def problems(knobs: GemmKnobs, spec: KernelSpec, gpu: GpuTarget) -> list[Diagnostic]:
    return [d for rule in RULES for d in rule(knobs, spec, gpu)]


def render(knobs: GemmKnobs, dtype: str) -> str:
    """The CUDA C++ translation unit (kernel + host shim) for these knobs."""
    text = resources.files("mosaic_target_cutlass").joinpath("templates/gemm_sm90.cu").read_text()
    stages = ("cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>("
              "sizeof(typename CollectiveEpilogue::SharedStorage))>" if knobs.stages == "auto"
              else f"cutlass::gemm::collective::StageCount<{knobs.stages}>")
    values = {
        "ELEMENT": ELEMENTS[dtype], "TILE_M": knobs.tile_m, "TILE_N": knobs.tile_n, "TILE_K": knobs.tile_k,
        "CLUSTER_M": knobs.cluster_m, "CLUSTER_N": knobs.cluster_n,
        "KERNEL_SCHEDULE": KERNEL_SCHEDULES[knobs.kernel_schedule],
        "EPILOGUE_SCHEDULE": EPILOGUE_SCHEDULES[knobs.epilogue_schedule],
        "TILE_SCHEDULER": TILE_SCHEDULERS[knobs.tile_scheduler], "STAGES": stages,
    }
    for key, val in values.items():
        text = text.replace("{{" + key + "}}", str(val))
    header = "// knobs: " + ", ".join(f"{a.name}={getattr(knobs, a.name)}" for a in attrs.fields(GemmKnobs))
    return f"// dtype: {dtype}\n{header}\n{text}"


# -- knob dependencies (data for the ``knobs`` proposer's compound edits; mosaic.proposers.dependencies) ------

ACCUMULATOR_REGISTERS = 128  # fp32 accumulators one consumer thread holds before the tile spills


def _accumulators_per_thread(k: dict) -> float:
    """A ping-pong consumer warpgroup holds a whole tile; cooperative splits tile_m over two warpgroups."""
    threads = 256 if k.get("kernel_schedule") == "cooperative" else 128
    return k["tile_m"] * k["tile_n"] / threads


def can_implement(knobs: GemmKnobs, spec: KernelSpec, gpu: GpuTarget) -> list[Diagnostic]:
    """The plugin's CPU predicate (no nvcc): every rule of :data:`RULES`."""
    return problems(knobs, spec, gpu)


def _dependencies():
    from mosaic.proposers.dependencies import Dependencies, Dependency

    return Dependencies(check=can_implement, rules=(
        Dependency("CUTLASS-EPILOGUE", ("kernel_schedule", "epilogue_schedule"),
                   {"epilogue_schedule": ("tma-cooperative", "tma", "no-smem"),
                    "kernel_schedule": ("cooperative", "pingpong", "tma-ws")},
                   "the epilogue schedule must match the kernel schedule"),
        Dependency("CUTLASS-STREAMK", ("tile_scheduler", "kernel_schedule"),
                   {"kernel_schedule": ("cooperative",), "tile_scheduler": ("persistent", "default")},
                   "stream-K is built on the cooperative kernel"),
        Dependency("CUTLASS-SCHEDULER", ("tile_scheduler", "kernel_schedule"),
                   {"kernel_schedule": ("cooperative", "pingpong"), "tile_scheduler": ("default",)},
                   "tma-ws takes no explicit tile scheduler"),
        Dependency("CUTLASS-COOP-TILE", ("kernel_schedule", "tile_m"),
                   {"kernel_schedule": ("pingpong",), "tile_m": (128, 256)},
                   "the cooperative schedule splits tile_m over two 64-row consumer warpgroups"),
        Dependency("CUTLASS-SMEM", ("stages", "tile_m", "tile_n", "tile_k"), {"stages": ("auto", 4, 3, 2)},
                   "a bigger tile leaves room for fewer stages"),
        Dependency("CUTLASS-CLUSTER", ("cluster_m", "cluster_n"), {"cluster_m": (1, 2), "cluster_n": (1, 2)},
                   "the cluster must fit the GPU"),
        Dependency("CUTLASS-ACCUMULATORS", ("tile_m", "tile_n", "kernel_schedule"),
                   {"kernel_schedule": ("cooperative",)},
                   f"more than {ACCUMULATOR_REGISTERS} fp32 accumulators per consumer thread spill (tile_n=256 on "
                   "ping-pong, 128x256, ran 3,252 us on the H200); cooperative splits the tile over two warpgroups",
                   needs=lambda k: _accumulators_per_thread(k) > ACCUMULATOR_REGISTERS),
        Dependency("CUTLASS-MULTICAST", ("tile_m", "tile_n", "cluster_m"), {"cluster_m": (2,)},
                   "a tile twice as wide as tall loads twice as much B as A per stage: a 2x1 cluster multicasts B "
                   "to both CTAs (cooperative 128x256 c2x1 measured 185.07 us on the H200; cuBLAS's choice)",
                   needs=lambda k: k["tile_n"] >= 2 * k["tile_m"] and k.get("cluster_m") == 1
                   and k.get("kernel_schedule") == "cooperative"),
    ))


GemmKnobs.DEPENDENCIES = _dependencies()
