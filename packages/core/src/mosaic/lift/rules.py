"""The diff rules, as data: for each feature key, its layer, its importance, its edit class and why it matters.

Rank is decided by one documented rule (``diff.rank_key``): layers in dependency order (launch, instruction,
control, sequence, numerics, machine: coarse structure before fine detail), then the rule's position in
this table (its importance within the layer), then the size of the difference, then where and the key.
The edit class says what kind of change closes the gap: ``knob`` (a parameter of the existing kernel: a
tile, stage count, launch bound, compiler flag) or ``rewrite`` (a structural change to the code).

``tolerance`` (numeric and map features only; absolute, in the feature's unit, per map entry) is the
difference below which two values are the same for the diff: no row, distance 0 (docs/lifting.md says why
each key has the threshold it has). Most keys have none: any difference is a discrepancy.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Rule:
    code: str
    layer: str
    key: str
    edit: str
    why: str
    tolerance: float = 0.0


#: shared-memory differences under 1 KiB are barriers, scalars and alignment padding: one stage of a 64x64
#: bf16 operand tile is 8 KiB, a 64x16 bf16 epilogue sub-tile 2 KiB (docs/lifting.md, Tolerances)
SMEM_TOLERANCE_BYTES = 1024
#: kernels whose machine code differs by fewer instructions than this differ in bounds checks, epilogue variants
#: and scheduling, not in unrolling or inline math expansions (a chosen threshold, not a measured spread)
CODE_TOLERANCE_INSTRUCTIONS = 256
#: Nsight Compute utilisation metrics, in percent of peak: a chosen threshold, not a measured spread
METRIC_TOLERANCE_POINTS = 2.0


RULES: tuple[Rule, ...] = (
    # launch: the shape of the launch decides everything below it
    Rule("L01", "launch", "cluster", "knob", "cluster shape decides which CTAs share distributed shared memory and TMA multicast"),
    Rule("L02", "launch", "roles", "rewrite", "warp-specialised kernels split producer and consumer work across warpgroups; counts and timing are not comparable until the roles match"),
    Rule("L03", "launch", "block", "knob", "threads per block set the warps per CTA and so the tile each warp owns"),
    Rule("L04", "launch", "block.max_threads", "knob", "the launch bound caps threads per block and steers register allocation"),
    Rule("L05", "launch", "warpgroups", "knob", "the number of warpgroups bounds how many wgmma streams and roles a CTA runs"),
    Rule("L06", "launch", "grid", "knob", "grid size decides waves and whether CTAs are persistent over tiles"),
    Rule("L07", "launch", "smem.static", "knob", "static shared memory reflects tile size times pipeline stages and limits resident CTAs", SMEM_TOLERANCE_BYTES),
    Rule("L08", "launch", "smem.dynamic", "knob", "dynamic shared memory reflects tile size times pipeline stages and limits resident CTAs", SMEM_TOLERANCE_BYTES),
    Rule("L09", "launch", "registers", "knob", "registers per thread limit occupancy and, when capped, force spills"),
    Rule("L10", "launch", "roles.registers", "knob", "setmaxnreg moves registers from producer to consumer warpgroups"),
    Rule("L10b", "launch", "roles.warpgroups", "rewrite", "how many warpgroups each role runs (one producer feeding two consumers, or one each) sets the MMA streams per CTA"),
    Rule("L11", "launch", "occupancy.warps_per_sm", "knob", "resident warps per SM decide how much latency the scheduler can hide"),
    # instruction: what the hot operations are
    Rule("I01", "instruction", "mma.form", "rewrite", "warpgroup wgmma (async, operands from shared memory) and warp mma.sync reach very different tensor-core throughput"),
    Rule("I02", "instruction", "mma.shape", "knob", "the MMA shape sets work per instruction and the tile decomposition"),
    Rule("I03", "instruction", "mma.types", "knob", "operand and accumulator types set tensor-core rate and precision"),
    Rule("I03b", "instruction", "mma.accumulator", "rewrite", "tcgen05 (sm_100) accumulates in tensor memory and the epilogue reads it out (tcgen05.ld); mma.sync and wgmma accumulate in registers, which caps the tile a warpgroup holds"),
    Rule("I03c", "instruction", "mma.cta_group", "knob", "a tcgen05 MMA issued for a CTA pair (cta_group::2) doubles the tile M per instruction and halves each CTA's B operand in shared memory"),
    Rule("I03d", "instruction", "tmem.ops", "rewrite", "the tensor-memory protocol (alloc/dealloc, tcgen05.ld/st/cp, commit to mbarriers) differs, so the accumulator's lifetime and the epilogue's reads differ"),
    Rule("I04", "instruction", "transfer.form", "rewrite", "how tiles reach shared memory (TMA, bulk copy, cp.async, plain loads) decides issue cost and overlap with math"),
    Rule("I05", "instruction", "transfer.store_form", "rewrite", "how results leave the SM (TMA store, plain stores, atomics) sets epilogue cost"),
    Rule("I06", "instruction", "barrier.ops", "rewrite", "the synchronisation protocol (CTA barriers vs mbarriers, async fences) decides what can overlap"),
    Rule("I07", "instruction", "access.global.load_width", "knob", "wider global loads move the same bytes with fewer instructions and transactions"),
    Rule("I08", "instruction", "access.global.store_width", "knob", "wider global stores move the same bytes with fewer instructions and transactions"),
    Rule("I08b", "instruction", "access.generic.load_width", "knob", "loads through generic addresses (the space resolved at run time): wider ones move the same bytes with fewer instructions"),
    Rule("I08c", "instruction", "access.generic.store_width", "knob", "stores through generic addresses (the space resolved at run time): wider ones move the same bytes with fewer instructions"),
    Rule("I09", "instruction", "access.async_copy_width", "knob", "cp.async width sets copy instructions per tile"),
    Rule("I10", "instruction", "access.shared.load_width", "knob", "shared-memory access width sets instructions per fragment and bank-conflict exposure"),
    Rule("I11", "instruction", "access.shared.store_width", "knob", "shared-memory access width sets instructions per fragment and bank-conflict exposure"),
    Rule("I13", "instruction", "mma.operands", "knob", "where the MMA reads its A operand (shared memory by descriptor, or registers: attention's P kept in registers for the second MMA) decides a shared-memory round trip and a barrier per step"),
    Rule("I12", "instruction", "hot_loop.mix", "knob", "per-iteration counts of the critical operations in the steady-state loop differ"),
    # control: the loop structure around the hot operations
    Rule("C01", "control", "persistent", "rewrite", "a persistent tile loop keeps CTAs resident across tiles and overlaps one tile's epilogue with the next tile's loads"),
    Rule("C02", "control", "warp_role_branches", "rewrite", "branches on the warp or warpgroup index give warps different jobs"),
    Rule("C03", "control", "pipeline.stages", "knob", "pipeline depth sets how many loads are in flight to hide memory latency"),
    Rule("C04", "control", "pipeline.wait_depth", "knob", "the wait depth sets how many copy groups stay in flight while computing"),
    Rule("C05", "control", "loops.depth", "rewrite", "the loop nest differs, so the iteration space is traversed differently"),
    Rule("C06", "control", "loop.unroll", "knob", "the unroll factor trades loop overhead and latency hiding against registers and code size"),
    Rule("C07", "control", "epilogue.form", "rewrite", "the epilogue writes results in a different form"),
    # sequence: order of the critical operations in the steady state
    Rule("S01", "sequence", "hot_loop.order", "rewrite", "the steady-state body issues its critical operations in a different order, which changes overlap"),
    # numerics: rounding and approximation
    Rule("N01", "numerics", "fma.contraction", "knob", "fused multiply-add rounds once; separate multiply and add round twice and cost two instructions"),
    Rule("N02", "numerics", "exp.form", "knob", "approximate exp (one MUFU.EX2) is faster and less accurate than the range-reduced precise expf"),
    Rule("N03", "numerics", "div.form", "knob", "IEEE division runs a checked Newton sequence; approximate reciprocal-multiply is faster and less accurate"),
    Rule("N04", "numerics", "conversion.modes", "rewrite", "conversion and rounding modes differ, so results round differently"),
    Rule("N05", "numerics", "denormal.flush", "knob", "flushing denormals to zero changes results near zero and can change speed"),
    # machine: what the hardware actually runs
    Rule("M01", "machine", "spills", "knob", "spills turn register traffic into local-memory loads and stores in the hot path"),
    Rule("M02", "machine", "hot_loop.length", "knob", "the steady-state loop runs a different number of machine instructions per trip"),
    Rule("M09", "machine", "code.length", "knob", "the kernel's machine code differs in length (unrolling, inline math expansions): "
         "instruction-cache pressure and issue slots", CODE_TOLERANCE_INSTRUCTIONS),
    Rule("M03", "machine", "stack_frame", "knob", "a stack frame means local memory traffic (spills or local arrays)"),
    Rule("M04", "machine", "stalls.top", "rewrite", "the dominant warp stall reasons differ, so a different bottleneck limits the kernel"),
    Rule("M05", "machine", "tensor_pipe", "rewrite", "tensor-pipe utilisation differs, so the math units are fed differently",
         METRIC_TOLERANCE_POINTS),
    Rule("M06", "machine", "memory_throughput", "rewrite", "achieved memory throughput differs", METRIC_TOLERANCE_POINTS),
    Rule("M07", "machine", "occupancy.achieved", "knob", "achieved occupancy (active warps per SM) differs: "
         "registers, shared memory or the grid leave the SMs differently full", METRIC_TOLERANCE_POINTS),
    Rule("M08", "machine", "l2.hit_rate", "rewrite", "the L2 hit rate differs, so operand reuse across CTAs "
         "(tile order, rasterisation, swizzle) differs", METRIC_TOLERANCE_POINTS),
)

BY_KEY = {r.key: r for r in RULES}
ORDER = {r.key: n for n, r in enumerate(RULES)}
