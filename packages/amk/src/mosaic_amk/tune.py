"""``mosaic amk tune``: the self-improvement loop over ScheduleConfig and the GEMV build defines (the seed's "propose -> lower -> validate ->
ReferenceVM correctness gate -> CUDA-event measurement -> keep/revert", with a physical roofline guard).

Every trial changes one knob of the incumbent (the knob table, :data:`KNOBS`, is data: which fields, their values
in the order they are tried, and what each needs; the last two are the GEMV micro-kernel's build defines,
:data:`GEMV_DEFINES`, which the CudaVM takes as extra_defines), then:

1. **screen**: the config is built (ScheduleConfig's own validation), checked against the GPU record
   (``ScheduleConfig.check``), lowered at position 0 and at the last position the gate or the timing reaches
   (with the CUDA VM's own KV capacity and RoPE-order fallback, ``cuda_vm.cuda_config`` / ``staged_rope_order``;
   the CudaVM checks at launch that the structure is the same at every position) and statically validated
   (``mosaic_amk.validate``): an unsafe schedule is rejected before anything launches;
2. **gate**: parity criterion (2) (``bench/gate.py``): teacher-forced over HF's greedy tokens for the gate prompts,
   every argmax disagreement a near-tie within the envelope of HF's own variants, measured once per run; zero
   decisive disagreements. ``--vm cuda`` gates the CUDA VM that will be timed (HF bf16 on the GPU);
   ``--vm reference`` gates the ReferenceVM, which executes the lowered schedule task by task (HF float32 on the
   CPU), and times nothing; there a candidate whose lowered schedules equal the incumbent's (a launch flag or a
   build variant of the CUDA VM, or a change that does nothing on this model; ``Screen.digest``) keeps the
   incumbent's verdict instead of running the same schedules again;
3. **timing** (``--vm cuda``): candidate and incumbent interleaved sample by sample (A B, B A, ...; each sample
   CUDA events around ``steps`` decode steps in one launch, ``CudaVM.time_decode``), medians compared;
4. **keep/revert**: ``mosaic.run.decide.decide``, the core loop's rule: kept only when faster than the incumbent by
   more than the noise (``mosaic.timing.measure_noise``: interleaved self-pairs of the incumbent, measured at the
   start and again after every keep); a time below the weight-traffic floor (``bench.floor_bytes`` at the GPU
   record's HBM bandwidth) is refused as a measurement error. The loop stops when the incumbent is within
   ``stop_within`` of that floor, when a whole pass over the table keeps nothing, at ``max_trials`` or at the
   time budget.

The journal (``DIR/journal.jsonl``, one JSON object a line, appended and flushed per trial) is what ``--resume``
reads back: the start record (model, GPU, VM, the starting config), every trial (knob, value, config, the stage
that decided it, the gate's verdict, the samples, the decision) and the stop records. The incumbent is the start
config with every kept trial applied in order; a config already tried is never proposed again. ``DIR/report.md``
is the final table; ``DIR/best.toml`` the incumbent, a ScheduleConfig TOML (``--config`` reads it).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import click
from mosaic.errors import BadInput, CheckFailed, Diagnostic

from mosaic_amk.config import DEFAULT_FUSIONS, VM_FUSIONS, ScheduleConfig

# ------------------------------------------------------------------------------------------------ the knob table


@attrs.frozen
class Knob:
    """One ScheduleConfig field the loop may change: the values in the order they are tried; ``needs``: (field,
    value) pairs the incumbent must have for the knob to matter (a tuple field must contain the value)."""

    field: str
    values: tuple
    why: str
    needs: tuple = ()
    build: bool = False  # a build variant of the VM (a new nvcc build the first time): tried after the rest
    define: bool = False  # ``field`` is a GEMV micro-kernel build define (GEMV_DEFINES), not a ScheduleConfig field


# The GEMV micro-kernel's build defines the loop may set (cuda/build.py allows them; kernels/gemv_rows.cuh: body 1,
# the default, or body 2, the cp.async streaming ring of AMK_GEMV_DEPTH 16-byte loads in flight per lane) and their
# values when unset. A candidate carries the ones that differ (``defines``: sorted "NAME=V" strings), passed to the
# CudaVM as extra_defines; the ReferenceVM has no build, so they never change its schedules.
GEMV_DEFINES = {"AMK_GEMV_IMPL": 1, "AMK_GEMV_DEPTH": 8}


def define_map(defines: Sequence[str]) -> dict:
    out = {}
    for d in defines:
        name, _, value = str(d).partition("=")
        if name not in GEMV_DEFINES or not value.isdigit():
            raise BadInput(f"not a tune build define: {d!r} (known: {', '.join(GEMV_DEFINES)})")
        out[name] = int(value)
    return out


def define_tuple(values: dict) -> tuple:
    return tuple(sorted(f"{k}={int(v)}" for k, v in values.items() if v != GEMV_DEFINES[k]))


SPLIT_ARGMAX = VM_FUSIONS + ("split_argmax",)
KNOBS: tuple[Knob, ...] = (
    # launch flags and schedule structure first (no new build)
    Knob("wait_mode", ("relaxed", "acquire"), "poll with ld.relaxed + one fence, or ld.acquire every poll"),
    Knob("signal_mode", ("inline", "merged", "side"), "who signals a finished task, and how many block barriers"),
    Knob("prefetch_mode", ("inline", "side"), "who issues the L2 prefetches"),
    Knob("prefetch_depth", (0, 1, 2), "tasks ahead whose weights are L2-prefetched"),
    Knob("gemv_split", ("balanced", "rows"), "one GEMV task per SM, or fixed row counts"),
    Knob("gemv_rows_per_task", (16, 32, 64, 128), "rows per GEMV task", needs=(("gemv_split", "rows"),)),
    Knob("attention_placement", ("auto", "round_robin", "apart", "apart_qkv"), "where the attention tasks go",
         needs=(("sm_policy", "round_robin"),)),
    Knob("attention_q_heads_per_task", (1, 0), "query heads per attention task (0: the whole KV group)",
         needs=(("attention_kv_heads_per_task", 1),)),
    Knob("fusion", (SPLIT_ARGMAX, VM_FUSIONS, DEFAULT_FUSIONS), "which ops are fused (5 or 8 stages per layer)"),
    Knob("argmax_rows_per_task", (512, 1024, 2048, 4096), "logits per argmax_partial task",
         needs=(("fusion", "split_argmax"),)),
    Knob("rope_order", ("blocked", "standard"), "q and the K cache in 8-row RoPE blocks or whole heads",
         needs=(("fusion", "gemv_rope_append"),)),
    Knob("num_sms", (0, 128, 120), "SMs used (0: all)"),
    # build variants of the VM
    Knob("weight_preload", (8, 6, 2, 0), "16-byte weight chunks per lane loaded before a GEMV task's wait",
         needs=(("weight_stream", 0), ("AMK_GEMV_IMPL", 1)), build=True),
    Knob("weight_stream", (0, 2, 4), "TMA ring slots per warp", needs=(("weight_preload", 0), ("AMK_GEMV_IMPL", 1)),
         build=True),
    Knob("gemv_pingpong", (False, True), "the double-buffered GEMV row loop", build=True),
    Knob("attention_stage", (True, False), "KV rows staged in shared memory before the wait", build=True),
    Knob("threads_per_block", (512, 256, 1024), "the persistent block's threads", build=True),
    # the GEMV micro-kernel's own build defines (body 2 issues its own first loads: no preload, no stream)
    Knob("AMK_GEMV_IMPL", (1, 2), "GEMV body: 1 (bursts of 8) or 2 (the cp.async streaming ring)",
         needs=(("weight_preload", 0), ("weight_stream", 0)), build=True, define=True),
    Knob("AMK_GEMV_DEPTH", (8, 4, 12, 16), "body 2's 16-byte loads in flight per lane",
         needs=(("AMK_GEMV_IMPL", 2),), build=True, define=True),
)


def knob_table(names: Sequence[str] | None = None) -> tuple[Knob, ...]:
    """KNOBS, or the named ones in table order (BadInput naming an unknown one)."""
    if not names:
        return KNOBS
    known = {k.field: k for k in KNOBS}
    bad = [n for n in names if n not in known]
    if bad:
        raise BadInput(f"unknown tune knob(s) {', '.join(bad)}; known: {', '.join(known)}")
    return tuple(k for k in KNOBS if k.field in set(names))


def current(cfg: ScheduleConfig, defines: Sequence[str], field: str):
    """The value of a knob's field in a candidate (a config field, or a build define with its default)."""
    if field in GEMV_DEFINES:
        return define_map(defines).get(field, GEMV_DEFINES[field])
    return getattr(cfg, field)


def _has(cfg: ScheduleConfig, defines: Sequence[str], field: str, value) -> bool:
    v = current(cfg, defines, field)
    return value in v if isinstance(v, tuple) else v == value


def applies(knob: Knob, cfg: ScheduleConfig, defines: Sequence[str] = ()) -> bool:
    return all(_has(cfg, defines, f, v) for f, v in knob.needs)


def config_key(cfg: ScheduleConfig, defines: Sequence[str] = ()) -> str:
    if defines:
        return json.dumps({"config": cfg.to_json(), "defines": sorted(defines)}, sort_keys=True)
    return json.dumps(cfg.to_json(), sort_keys=True)


@attrs.frozen
class Proposal:
    knob: str
    value: Any
    was: Any
    config: ScheduleConfig | None  # None: ScheduleConfig refused the value combination
    error: str | None = None
    defines: tuple = ()  # the candidate's build defines (define_tuple)

    def to_json(self) -> dict:
        return {"knob": self.knob, "value": _plain(self.value), "was": _plain(self.was)}


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def refused_key(incumbent: ScheduleConfig, field: str, value, defines: Sequence[str] = ()) -> str:
    """The ``tried`` key of a change ScheduleConfig refused (there is no config to key it by)."""
    return f"refused {config_key(incumbent, defines)} {field}={json.dumps(_plain(value))}"


def proposals(incumbent: ScheduleConfig, knobs: Sequence[Knob], tried: set[str], defines: Sequence[str] = ()
              ) -> Iterator[Proposal]:
    """Single-knob changes of ``incumbent`` (with build ``defines``) in table order, skipping knobs whose needs it
    lacks, its own values and candidates already tried (``tried``: config_key strings, and refused_key strings of
    refused changes; updated by the caller)."""
    defines = tuple(defines)
    for knob in knobs:
        if not applies(knob, incumbent, defines):
            continue
        was = current(incumbent, defines, knob.field)
        for value in knob.values:
            if value == was:
                continue
            if knob.define:
                new = define_tuple({**define_map(defines), knob.field: value})
                if config_key(incumbent, new) not in tried:
                    yield Proposal(knob.field, value, was, incumbent, defines=new)
                continue
            try:
                cfg = attrs.evolve(incumbent, **{knob.field: value})
            except (ValueError, TypeError) as exc:
                if refused_key(incumbent, knob.field, value, defines) in tried:
                    continue
                yield Proposal(knob.field, value, was, None, str(exc).splitlines()[0][:300], defines)
                continue
            if config_key(cfg, defines) in tried:
                continue
            yield Proposal(knob.field, value, was, cfg, defines=defines)


# ------------------------------------------------------------------------------------------------ the screen


@attrs.frozen
class Screen:
    ok: bool
    stage: str  # "screen" passed, or "invalid" | "does-not-fit" | "lowering" | "unsafe"
    reason: str
    config: ScheduleConfig | None = None  # the config the VM runs (KV capacity set, RoPE-order fallback)
    tasks: int = 0
    note: str | None = None
    digest: str | None = None  # SHA-256 of the lowered schedules at every screened position (meta left out)


def screen(spec, cfg: ScheduleConfig, gpu, positions: Sequence[int], max_positions: int) -> Screen:
    """Check, lower and statically validate ``cfg`` at every position (nothing launches)."""
    from mosaic_amk.cuda.cuda_vm import cuda_config, staged_rope_order
    from mosaic_amk.lowering import lower
    from mosaic_amk.validate import validate

    problems = cfg.check(gpu)
    if problems:
        return Screen(False, "does-not-fit", "; ".join(problems))
    run, note = staged_rope_order(spec, cuda_config(cfg, max_positions))
    tasks, h = 0, hashlib.sha256()
    for pos in sorted(set(positions)):
        try:
            schedule = lower(spec, run, gpu, pos)
        except Exception as exc:  # noqa: BLE001 - the lowering refuses the combination: recorded, not fatal
            return Screen(False, "lowering", f"position {pos}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        result = validate(schedule)
        if not result.ok:
            codes = ", ".join(sorted(result.codes()))
            first = result.lines()[0][:200] if result.lines() else ""
            return Screen(False, "unsafe", f"position {pos}: the validator rejects it ({codes}): {first}")
        tasks = len(schedule.tasks)
        body = {k: v for k, v in schedule.to_json().items() if k != "meta"}  # meta names the config itself
        h.update(json.dumps(body, sort_keys=True, default=str).encode())
    return Screen(True, "screen", f"safe at positions {sorted(set(positions))} ({tasks} tasks)", run, tasks, note,
                  h.hexdigest())


# ------------------------------------------------------------------------------------------------ decisions


def decide_times(t_cand_ms: float, t_inc_ms: float, noise_ms: float, floor_ms: float):
    """The core loop's rule (mosaic.run.decide.decide; equal distances, so only "faster" keeps)."""
    from mosaic.run.decide import decide

    return decide(t_cand_ms * 1e6, t_inc_ms * 1e6, 0.0, 0.0, noise_ms * 1e6, floor_ms * 1e6)


REASONS = {  # the rule's verdict code -> what the journal says (times in ms)
    "faster": "faster than the incumbent by more than the noise",
    "null": "within the noise of the incumbent: a null result",
    "slower": "slower than the incumbent by more than the noise",
    "below-floor": "below the weight-traffic floor: a measurement error, not a speed-up",
}


def reason_text(code: str, t_cand_ms: float, t_inc_ms: float, noise_ms: float, floor_ms: float) -> str:
    return (f"{REASONS.get(code, code)}: {t_cand_ms:.4f} vs {t_inc_ms:.4f} ms/token (noise {noise_ms:.4f} ms, "
            f"floor {floor_ms:.4f} ms)")


def near_floor(t_inc_ms: float, floor_ms: float, within: float) -> bool:
    """The roofline stop: the incumbent is within ``within`` (a fraction) of the weight-traffic floor."""
    return floor_ms > 0 and t_inc_ms <= floor_ms * (1.0 + within)


def interleave(inc: Callable[[], float], cand: Callable[[], float], rounds: int) -> tuple[list, list]:
    """``rounds`` samples of each, interleaved A B / B A so drift hits both alike."""
    a, b = [], []
    for r in range(rounds):
        if r % 2 == 0:
            a.append(float(inc()))
            b.append(float(cand()))
        else:
            b.append(float(cand()))
            a.append(float(inc()))
    return a, b


def noise_of(run: Callable[[], float], pairs: int = 5, runs: int = 3):
    """mosaic.timing.measure_noise over ``pairs`` interleaved self-pairs of blocks of ``runs`` samples (ms)."""
    from mosaic.timing import measure_noise

    return measure_noise([[float(run()) for _ in range(runs)] for _ in range(2 * pairs)])


# ------------------------------------------------------------------------------------------------ the journal


class Journal:
    """JSON lines, appended and flushed one record at a time."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        out = []
        for i, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise BadInput(f"journal line {i} is not JSON", str(self.path)) from None
            if not isinstance(rec, dict) or "kind" not in rec:
                raise BadInput(f"journal line {i} is not a tune record", str(self.path))
            out.append(rec)
        return out

    def append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=_plain) + "\n")
            f.flush()


@attrs.define
class State:
    """What the journal says: the start config, the incumbent, every config tried, the trial count."""

    start: ScheduleConfig
    incumbent: ScheduleConfig
    tried: set = attrs.field(factory=set)
    trials: int = 0
    kept: int = 0
    defines: tuple = ()  # the incumbent's build defines


def replay(records: Sequence[dict], where: str = "journal") -> State:
    """The loop's state after the journal's records (the start record first)."""
    if not records or records[0].get("kind") != "start":
        raise BadInput("the journal does not begin with a start record", where)
    start = ScheduleConfig.from_mapping(records[0].get("config"), where)
    st = State(start, start, {config_key(start)})
    for rec in records[1:]:
        if rec.get("kind") != "trial":
            continue
        st.trials = max(st.trials, int(rec.get("trial", 0)))
        if isinstance(rec.get("key"), str):
            st.tried.add(rec["key"])
        if rec.get("config") is not None:
            cfg = ScheduleConfig.from_mapping(rec["config"], where)
            raw = rec.get("defines") or []
            if not isinstance(raw, list):
                raise BadInput(f"journal trial {rec.get('trial')}: defines must be a list", where)
            defines = define_tuple(define_map(raw))
            st.tried.add(config_key(cfg, defines))
            if rec.get("decision") == "kept":
                st.incumbent, st.defines, st.kept = cfg, defines, st.kept + 1
    return st


# ------------------------------------------------------------------------------------------------ the backends


class ReferenceBackend:
    """Gate on the ReferenceVM (CPU, HF float32 reference); no timing."""

    timed = False
    name = "reference"

    def __init__(self, spec, gpu, envelope):
        self.spec, self.gpu, self.envelope = spec, gpu, envelope

    def gate(self, cfg: ScheduleConfig, run: ScheduleConfig | None = None, defines: Sequence[str] = ()):
        """``run``: the screened config (the KV capacity the CUDA VM would give it): the schedules validated.
        Build ``defines`` do not reach the ReferenceVM (it has no build)."""
        from mosaic_amk.bench.gate import judge, reference_vm_candidate
        from mosaic_amk.reference_vm import ReferenceVM

        vm = ReferenceVM(self.spec, run or cfg, self.gpu)
        return judge(self.envelope, reference_vm_candidate(vm)), None


class CudaBackend:
    """Gate on the CUDA VM (HF bf16 on the GPU) and time it against the incumbent with CUDA events."""

    timed = True
    name = "cuda"

    def __init__(self, spec, gpu, envelope, weights, max_positions: int, steps: int):
        self.spec, self.gpu, self.envelope, self.weights = spec, gpu, envelope, weights
        self.max_positions, self.steps = max_positions, steps

    def vm(self, cfg: ScheduleConfig, defines: Sequence[str] = ()):
        from mosaic_amk.cuda.cuda_vm import CudaVM

        return CudaVM(self.spec, cfg, self.gpu, weights=self.weights, max_positions=self.max_positions,
                      extra_defines=tuple(defines))

    def gate(self, cfg: ScheduleConfig, run: ScheduleConfig | None = None, defines: Sequence[str] = ()):
        """The CudaVM applies the screen's config transforms itself (cuda_config, staged_rope_order)."""
        from mosaic_amk.bench.gate import judge

        vm = self.vm(cfg, defines)
        return judge(self.envelope, vm.forced), vm

    def sampler(self, vm) -> Callable[[], float]:
        return lambda: vm.time_decode(self.steps)

    def floor_ms(self, vm) -> float:
        from mosaic_amk.bench.bench import floor_bytes

        return floor_bytes(vm.enc) / (self.gpu.hbm_bandwidth_gbs * 1e9) * 1e3


# ------------------------------------------------------------------------------------------------ the loop


@attrs.frozen
class Settings:
    budget_s: float = 300.0
    max_trials: int = 0  # 0: no limit
    rounds: int = 7  # interleaved samples of each per trial
    stop_within: float = 0.10  # stop when the incumbent is within this fraction of the floor
    positions: tuple = (0,)  # where the screen lowers and validates
    max_positions: int = 128


def run_loop(backend, spec, gpu, journal: Journal, state: State, knobs: Sequence[Knob], settings: Settings,
             log=print) -> State:
    """Trials until a stop rule holds; every trial and stop appended to ``journal``."""
    from mosaic_amk.bench.gate import verdict_json, verdict_line

    t0 = time.monotonic()
    inc_vm = inc_ms = noise = floor_ms = inc_digest = None

    def gate_incumbent() -> None:
        nonlocal inc_vm, inc_digest
        scr = screen(spec, state.incumbent, gpu, settings.positions, settings.max_positions)
        if not scr.ok:
            raise CheckFailed("the incumbent config is rejected before launch",
                              [Diagnostic(scr.stage, "incumbent", message=scr.reason)])
        verdict, inc_vm = backend.gate(state.incumbent, scr.config, state.defines)
        inc_digest = scr.digest
        journal.append({"kind": "incumbent", "config": state.incumbent.to_json(), "defines": list(state.defines),
                        "screen": scr.reason,
                        "gate": verdict_json(verdict)})
        log(f"incumbent: {scr.reason}; {verdict_line(verdict)}")
        if not verdict.ok:
            raise CheckFailed("the incumbent config fails criterion (2)",
                              [Diagnostic("decisive", "incumbent", message=verdict_line(verdict))])

    def measure_incumbent(why: str):
        nonlocal noise, inc_ms, floor_ms
        noise = noise_of(backend.sampler(inc_vm))
        inc_ms, floor_ms = noise.reference_time, backend.floor_ms(inc_vm)
        journal.append({"kind": "noise", "why": why, "incumbent_ms": inc_ms, "noise_ms": noise.value,
                        "floor_ms": floor_ms, "noise": noise.to_json()})
        log(f"incumbent {inc_ms:.4f} ms/token, noise {noise.value:.4f} ms ({noise.relative:.2%}), "
            f"weight-traffic floor {floor_ms:.4f} ms ({gpu.name}: {gpu.hbm_bandwidth_gbs / 1000:g} TB/s datasheet; "
            f"{why})")

    gate_incumbent()
    if backend.timed:
        measure_incumbent("start" if state.trials == 0 else "resume")

    def stop(reason: str) -> State:
        journal.append({"kind": "stop", "reason": reason, "trials": state.trials, "kept": state.kept,
                        "incumbent": state.incumbent.to_json(), "defines": list(state.defines),
                        "incumbent_ms": inc_ms, "floor_ms": floor_ms})
        log(f"stop: {reason}")
        return state

    while True:
        for prop in proposals(state.incumbent, knobs, state.tried, state.defines):
            if backend.timed and near_floor(inc_ms, floor_ms, settings.stop_within):
                return stop(f"the incumbent {inc_ms:.4f} ms is within {settings.stop_within:.0%} of the "
                            f"weight-traffic floor {floor_ms:.4f} ms")
            if settings.max_trials and state.trials >= settings.max_trials:
                return stop(f"{settings.max_trials} trials")
            if time.monotonic() - t0 > settings.budget_s:
                return stop(f"time budget ({settings.budget_s / 60:.1f} min)")
            state.trials += 1
            ts = time.monotonic()
            rec: dict[str, Any] = {"kind": "trial", "trial": state.trials, **prop.to_json(),
                                   "config": prop.config.to_json() if prop.config else None,
                                   "defines": list(prop.defines)}
            if prop.config is None:
                rec["key"] = refused_key(state.incumbent, prop.knob, prop.value, state.defines)
                state.tried.add(rec["key"])
                rec.update(stage="invalid", decision="rejected", reason=prop.error)
            else:
                state.tried.add(config_key(prop.config, prop.defines))
                rec.update(_trial(backend, spec, gpu, prop.config, settings, inc_vm, inc_ms, noise, floor_ms,
                                  verdict_json, verdict_line, inc_digest, prop.defines))
            cand_vm = rec.pop("_vm", None)
            rec["seconds"] = round(time.monotonic() - ts, 2)
            journal.append(rec)
            log(f"trial {state.trials}: {prop.knob}={_plain(prop.value)!r} (was {_plain(prop.was)!r}): "
                f"{rec['decision']}: {rec['reason']}")
            if rec["decision"] == "kept":
                state.incumbent, state.defines, state.kept = prop.config, prop.defines, state.kept + 1
                inc_vm, inc_digest = cand_vm, rec.get("digest")
                measure_incumbent(f"after trial {state.trials}")
                break  # proposals restart from the new incumbent
        else:  # no break: a whole pass kept nothing
            return stop("a whole pass over the knob table kept nothing" if backend.timed else
                        "every single-knob change of the incumbent screened and gated (--vm reference times nothing)")


def _trial(backend, spec, gpu, cfg, settings, inc_vm, inc_ms, noise, floor_ms, verdict_json, verdict_line,
           inc_digest=None, defines: Sequence[str] = ()) -> dict:
    scr = screen(spec, cfg, gpu, settings.positions, settings.max_positions)
    if not scr.ok:
        return {"stage": scr.stage, "decision": "rejected", "reason": scr.reason}
    same = scr.digest == inc_digest
    out: dict[str, Any] = {"screen": scr.reason, "digest": scr.digest, "same_schedules": same,
                           **({"note": scr.note} if scr.note else {})}
    if same and not backend.timed:  # the ReferenceVM runs the schedules alone: its verdict would be the incumbent's
        return {**out, "stage": "screen", "decision": "screened",
                "reason": "the same lowered schedules as the incumbent's (the change reaches only the CUDA VM's "
                          "launch or build, or nothing on this model): the ReferenceVM gate is the incumbent's; "
                          "not timed"}
    try:
        verdict, vm = backend.gate(cfg, scr.config, defines)
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is rejected, the loop goes on
        return {**out, "stage": "gate", "decision": "rejected",
                "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    out["gate"] = verdict_json(verdict)
    if not verdict.ok:
        return {**out, "stage": "gate", "decision": "rejected", "reason": verdict_line(verdict)}
    if not backend.timed:
        return {**out, "stage": "gate", "decision": "screened", "reason": verdict_line(verdict) + "; not timed"}
    try:
        inc_s, cand_s = interleave(backend.sampler(inc_vm), backend.sampler(vm), settings.rounds)
    except Exception as exc:  # noqa: BLE001 - e.g. the VM's watchdog: the candidate is rejected, the loop goes on
        return {**out, "stage": "timing", "decision": "rejected",
                "reason": f"timing failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    t_c, t_i = statistics.median(cand_s), statistics.median(inc_s)
    dec = decide_times(t_c, t_i, noise.value, floor_ms)
    out.update(stage="timed" if dec.reason_code != "below-floor" else "below-floor",
               timing={"candidate_ms": t_c, "incumbent_ms": t_i, "noise_ms": noise.value, "floor_ms": floor_ms,
                       "candidate_samples": cand_s, "incumbent_samples": inc_s, "rule": dec.reason_code},
               decision="kept" if dec.accepted else "reverted",
               reason=reason_text(dec.reason_code, t_c, t_i, noise.value, floor_ms))
    if dec.accepted:
        out["_vm"] = vm
    return out


# ------------------------------------------------------------------------------------------------ the report


def report(records: Sequence[dict]) -> str:
    """The final table: one row per trial, then the start and final incumbents and what was kept."""
    start = records[0] if records else {}
    lines = [f"# amk tune: {start.get('model', '?')} on {start.get('gpu', '?')} (--vm {start.get('vm', '?')})", "",
             "| # | knob | value | was | stage | decision | candidate ms | incumbent ms | reason |",
             "|---|------|-------|-----|-------|----------|--------------|--------------|--------|"]
    for r in records:
        if r.get("kind") != "trial":
            continue
        t = r.get("timing") or {}
        c = f"{t['candidate_ms']:.4f}" if "candidate_ms" in t else "-"
        i = f"{t['incumbent_ms']:.4f}" if "incumbent_ms" in t else "-"
        reason = str(r.get("reason", "")).replace("|", "/")[:160]
        lines.append(f"| {r.get('trial')} | {r.get('knob')} | {r.get('value')} | {r.get('was')} | {r.get('stage')} | "
                     f"{r.get('decision')} | {c} | {i} | {reason} |")
    noises = [r for r in records if r.get("kind") == "noise"]
    stops = [r for r in records if r.get("kind") == "stop"]
    trials = [r for r in records if r.get("kind") == "trial"]
    counts: dict[str, int] = {}
    for r in trials:
        counts[r.get("decision", "?")] = counts.get(r.get("decision", "?"), 0) + 1
    lines += ["", f"trials: {len(trials)} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})"]
    if noises:
        first, last = noises[0], noises[-1]
        lines.append(f"incumbent: {first['incumbent_ms']:.4f} -> {last['incumbent_ms']:.4f} ms/token "
                     f"({first['incumbent_ms'] / last['incumbent_ms']:.3f}x); noise {last['noise_ms']:.4f} ms; "
                     f"weight-traffic floor {last['floor_ms']:.4f} ms ({last['incumbent_ms'] / last['floor_ms']:.2f}x "
                     "floor)")
    kept = [f"{r['knob']}={r['value']}" for r in trials if r.get("decision") == "kept"]
    lines.append(f"kept: {', '.join(kept) if kept else 'nothing'}")
    if stops:
        if stops[-1].get("defines"):
            lines.append(f"incumbent's GEMV build defines: {' '.join(stops[-1]['defines'])}")
        lines.append(f"stopped: {stops[-1]['reason']}")
    return "\n".join(lines)


def config_toml(cfg: ScheduleConfig, defines: Sequence[str] = ()) -> str:
    """A ScheduleConfig TOML of the fields that differ from ScheduleConfig()'s defaults (``--config`` reads it); the
    GEMV build defines, which are no ScheduleConfig fields, in a comment."""
    base = ScheduleConfig().to_json()
    out = ["# written by `mosaic amk tune`: the incumbent (fields that differ from ScheduleConfig's defaults)"]
    if defines:
        out.append(f"# GEMV build defines (CudaVM extra_defines, not config fields): {' '.join(defines)}")
    for k, v in cfg.to_json().items():
        if v == base[k]:
            continue
        if isinstance(v, bool):
            text = "true" if v else "false"
        elif isinstance(v, str):
            text = json.dumps(v)
        elif isinstance(v, list):
            text = "[" + ", ".join(json.dumps(x) for x in v) + "]"
        else:
            text = str(v)
        out.append(f"{k} = {text}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ the command


def tune(model_dir: str, gpu_name: str | None, out_dir: str, *, vm: str = "cuda", config_path: str | None = None,
         resume: bool = False, settings: Settings = Settings(), knobs: Sequence[Knob] = KNOBS,
         n_prompts: int = 8, n_tokens: int = 32, steps: int = 64, log=print) -> list[dict]:
    """The loop end to end; returns the journal's records (report() makes the table). ``gpu_name`` None: the
    journal's record on ``resume``, else the detected device's (:func:`mosaic.gpus.resolve_gpu`; h200 without one);
    with ``vm="cuda"`` a named record must be the device's."""
    from mosaic.gpus import resolve_gpu
    from mosaic.plugins import host

    from mosaic_amk.bench.gate import gate_prompts, measure_envelope
    from mosaic_amk.config import CUDA_DEFAULT, load_config

    if not Path(model_dir).is_dir():
        raise BadInput("not a checkpoint directory", model_dir)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput("-o must be a directory", out_dir)
    journal = Journal(out / "journal.jsonl")
    records = journal.read()
    if records and not resume:
        raise BadInput("a tune journal exists here; pass --resume to continue it, or choose another -o", str(out))
    if resume and not records:
        raise BadInput("--resume: no tune journal here", str(journal.path))
    recorded = records[0].get("gpu") if records and gpu_name is None else None
    recorded = recorded if isinstance(recorded, str) else None  # else the journal check below names it
    choice = resolve_gpu(gpu_name or recorded, on_device=vm == "cuda",
                         where="--gpu" if recorded is None else f"gpu of {journal.path}")
    gpu = host().get("gpus", choice.name)
    if records:
        head = records[0]
        if (head.get("model"), head.get("gpu"), head.get("vm")) != (str(Path(model_dir).resolve()), gpu.name, vm):
            raise BadInput(f"--resume: the journal is of {head.get('model')} on {head.get('gpu')} (--vm "
                           f"{head.get('vm')}), not this run's", str(journal.path))
        if config_path:
            raise BadInput("--resume continues the journal's incumbent; drop --config")
        state = replay(records, str(journal.path))
    else:
        start = load_config(config_path, CUDA_DEFAULT).for_gpu(gpu)
        state = State(start, start, {config_key(start)})
    if vm == "cuda":
        from mosaic_amk.cuda.launcher import _cupy

        _cupy()  # one clear line without a GPU, before loading anything
    log(f"gpu: {choice.line()}")
    out.mkdir(parents=True, exist_ok=True)
    if vm == "cuda":
        from mosaic_amk.bench import hf_gpu
        from mosaic_amk.cuda.cuda_vm import weights_from_torch

        model = hf_gpu.load_bf16(model_dir)
        spec = hf_gpu.spec_of(model)
    else:
        from mosaic_amk.importer import import_checkpoint, load_hf

        spec = import_checkpoint(model_dir)
        model, _ = load_hf(model_dir, eager=True)
    prompts = gate_prompts(model_dir, spec.vocab_size, n_prompts)
    envelope = measure_envelope(model, prompts, n_tokens)
    log(envelope.line())
    gate_last = max(map(len, prompts)) + n_tokens - 2
    time_last = 4 + steps  # CudaVM.time_decode: warmup 4, then ``steps`` positions
    max_positions = max(gate_last, time_last) + 2
    positions = (0, max(gate_last, time_last)) if vm == "cuda" else (0, gate_last)
    settings = attrs.evolve(settings, positions=positions, max_positions=max_positions)
    if vm == "cuda":
        backend = CudaBackend(spec, gpu, envelope, weights_from_torch(model, spec), max_positions, steps)
    else:
        backend = ReferenceBackend(spec, gpu, envelope)
    if not records:
        journal.append({"kind": "start", "model": str(Path(model_dir).resolve()), "gpu": gpu.name,
                        "gpu_provenance": choice.provenance, "vm": vm,
                        "config": state.start.to_json(), "knobs": [k.field for k in knobs],
                        "settings": {"budget_s": settings.budget_s, "max_trials": settings.max_trials,
                                     "rounds": settings.rounds, "stop_within": settings.stop_within,
                                     "steps": steps}})
    journal.append({"kind": "envelope", **envelope.to_json()})
    run_loop(backend, spec, gpu, journal, state, knobs, settings, log=log)
    records = journal.read()
    (out / "report.md").write_text(report(records) + "\n")
    (out / "best.toml").write_text(config_toml(state.incumbent, state.defines))
    return records


@click.command("tune")
@click.option("--model", "model_dir", required=True, type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("--gpu", "gpu_name", default=None,
              help="GPU record (mosaic gpus); default: the journal's on --resume, else the detected device's record, "
                   "h200 without a GPU.")
@click.option("-o", "--output", "out_dir", default="amk-tune", show_default=True, type=click.Path(path_type=str),
              help="Directory of the journal (journal.jsonl), report.md and best.toml.")
@click.option("--vm", type=click.Choice(["cuda", "reference"]), default="cuda", show_default=True,
              help="cuda: gate and time the CUDA VM (GPU); reference: screen and gate on the ReferenceVM, no timing.")
@click.option("--config", "config_path", type=click.Path(path_type=str),
              help="Starting ScheduleConfig TOML (default: config.CUDA_DEFAULT).")
@click.option("--budget-min", default=5.0, show_default=True, type=click.FloatRange(min=0.1, max=24 * 60),
              help="Stop proposing after this many minutes.")
@click.option("--max-trials", default=0, show_default=True, type=click.IntRange(min=0), help="0: no limit.")
@click.option("--rounds", default=7, show_default=True, type=click.IntRange(min=3, max=100),
              help="Interleaved samples of candidate and incumbent per trial.")
@click.option("--steps", default=64, show_default=True, type=click.IntRange(min=1, max=1024),
              help="Decode steps per timing sample.")
@click.option("--stop-within", default=10.0, show_default=True, type=click.FloatRange(min=0, max=1000),
              help="Stop when the incumbent is within this many percent of the weight-traffic floor.")
@click.option("--prompts", "n_prompts", default=8, show_default=True, type=click.IntRange(1, 8),
              help="Gate prompts (the parity prompts through the tokenizer, or seeded ids).")
@click.option("--tokens", "n_tokens", default=32, show_default=True, type=click.IntRange(1, 256),
              help="Teacher-forced tokens per gate prompt.")
@click.option("--knobs", default="", help="Only these knobs (comma-separated ScheduleConfig fields of the table).")
@click.option("--resume", is_flag=True, help="Continue the journal in -o.")
def tune_cmd(model_dir: str, gpu_name: str, out_dir: str, vm: str, config_path: str | None, budget_min: float,
             max_trials: int, rounds: int, steps: int, stop_within: float, n_prompts: int, n_tokens: int, knobs: str,
             resume: bool) -> None:
    """The self-improvement loop over ScheduleConfig: propose one knob change -> lower -> validate -> criterion (2)
    gate -> interleaved timing against the incumbent -> keep (faster by more than the noise) or revert; a
    roofline guard; a resumable journal and a final table."""
    table = knob_table([k.strip() for k in knobs.split(",") if k.strip()])
    settings = Settings(budget_s=budget_min * 60, max_trials=max_trials, rounds=rounds, stop_within=stop_within / 100)
    records = tune(model_dir, gpu_name, out_dir, vm=vm, config_path=config_path, resume=resume, settings=settings,
                   knobs=table, n_prompts=n_prompts, n_tokens=n_tokens, steps=steps,
                   log=lambda m: click.echo(m, err=True))
    click.echo(report(records))
    click.echo(f"wrote {Path(out_dir) / 'journal.jsonl'}, {Path(out_dir) / 'report.md'}, {Path(out_dir) / 'best.toml'}")
