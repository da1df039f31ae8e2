"""Where the convergence loop gets its measurements: a small protocol with two implementations.

The loop's decisions are a pure function of recorded measurements (:mod:`mosaic.run.decide`). What
produces them is a :class:`Workbench`:

* the **live** workbench (:mod:`mosaic.run.live`) captures and times kernels on a GPU and writes one bundle
  per kernel into ``DIR/bundles``;
* the **offline** workbench (:class:`mosaic.run.offline.OfflineWorkbench`) reads those bundles back — on any
  machine, with no GPU — so ``mosaic run --offline DIR`` re-decides a finished campaign and must reproduce
  every verdict.

Bundle layout for the loop (everything else in a bundle is the capture's own): the manifest's extra key
``mosaic_run`` = ``{"key", "role": "reference"|"candidate"|"yardstick", "build": {"ok", "reason"},
"cost_s"}`` (a yardstick's adds ``yardstick``, its name, and when it measured nothing ``unmeasured``:
``{"reason_code", "reason"}``; the first yardstick's key is ``yardstick``, every other's ``yardstick-<name>``); ``timings`` (``timings.json``) = ``{"unit": "ns", "blocks": [[per-run ns, ...], ...],
"sessions": [{"against": KEY, "order": "ABAB", "incumbent_blocks": [...], "candidate_blocks": [...]}]}``;
the reference holds ``inputs`` (``.npz``) and every kernel its ``outputs``. A kernel's time in a comparison
is the median of its block medians (``mosaic.timing.measurement`` per block).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from mosaic.records import KernelSpec
from mosaic.timing import measurement

REFERENCE = "reference"
#: the journal key and bundle name (``yardstick.bundle``) of a campaign's yardstick, whatever the family's is
#: (cuBLAS for GEMM, torch for rmsnorm); the report names it by the family's title
YARDSTICK = "yardstick"
#: the key campaigns recorded before it was renamed (``cublas``, for every family): still read
LEGACY_YARDSTICK_KEYS = ("cublas",)


#: the key (and bundle name, ``yardstick-<name>.bundle``) of each of the family's other yardsticks
EXTRA_YARDSTICK_PREFIX = "yardstick-"


def is_primary_yardstick(key: str) -> bool:
    """``key`` names the campaign's first yardstick (the current key or a journal's older one)."""
    return key == YARDSTICK or key in LEGACY_YARDSTICK_KEYS


def is_yardstick(key: str) -> bool:
    """``key`` names one of the campaign's yardsticks (a candidate key is a hex digest: never one of these)."""
    return is_primary_yardstick(key) or key.startswith(EXTRA_YARDSTICK_PREFIX)


def yardstick_key(name: str, first: bool) -> str:
    """The journal key of the family's yardstick ``name``: ``yardstick`` for the first (the campaign's primary,
    the key campaigns have always recorded), ``yardstick-<name>`` for every other."""
    return YARDSTICK if first else f"{EXTRA_YARDSTICK_PREFIX}{name}"


@attrs.frozen
class YardstickRun:
    """One yardstick's capture at the start of a campaign: measured (``blocks``: its per-run times, ns) or not
    (``reason_code`` and ``reason`` say why: ``dtype`` a format it does not take, ``unavailable`` its library does
    not import, ``numerics`` it failed the float64 oracle, ``timeout``, ``failed``)."""

    key: str
    name: str  # the family's yardstick name (its KernelSpec's language): torch-sdpa, cudnn, flash-attn-4
    title: str  # how reports name it: torch SDPA, cuDNN SDPA, FlashAttention-4
    blocks: tuple | None = attrs.field(
        default=None, converter=lambda v: None if v is None else tuple(tuple(float(x) for x in b) for b in v))
    reason_code: str = ""
    reason: str = ""

    @property
    def measured(self) -> bool:
        return bool(self.blocks)

    def event(self) -> tuple[str, dict]:
        """The journal event that records it: ``yardstick`` (measured) or ``yardstick-unmeasured``."""
        if self.measured:
            return "yardstick", {"key": self.key, "yardstick": self.name, "name": self.title,
                                 "blocks": [list(b) for b in self.blocks], "time_ns": time_of(self.blocks)}
        return "yardstick-unmeasured", {"key": self.key, "yardstick": self.name, "name": self.title,
                                        "reason_code": self.reason_code, "reason": self.reason}

    @classmethod
    def from_event(cls, e: Mapping) -> YardstickRun:
        """From a journal's ``yardstick`` or ``yardstick-unmeasured`` event (a journal from before the field
        ``yardstick`` names it by its key)."""
        if e["event"] == "yardstick":
            return cls(e["key"], e.get("yardstick") or e["key"], e["name"], e["blocks"])
        return cls(e["key"], e["yardstick"], e["name"], None, e["reason_code"], e["reason"])
#: manifest keys that are the bundle's own (everything else is an extra the loop or capture wrote)
RESERVED = ("format", "schema_version", "created", "kernel", "language", "gpu", "toolchain", "files")


def _plain(v: Any) -> Any:
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in sorted(v.items())}
    return v


def candidate_key(spec: KernelSpec, source: str | None = None) -> str:
    """Identity of a candidate: language, family, shape, dtype, knobs and (for source edits) the text's hash."""
    ident = {"language": spec.language, "family": spec.family, "shape": _plain(spec.shape), "dtype": spec.dtype,
             "knobs": _plain(spec.knobs),
             "source": hashlib.sha256(source.encode()).hexdigest() if source is not None else None}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


@attrs.frozen
class Kernel:
    """A kernel the loop knows: the reference or a candidate."""

    key: str
    spec: KernelSpec
    source: str | None = None  # edited source text (command proposer), None for knob-only candidates
    bundle: str | None = None


@attrs.frozen
class Built:
    key: str
    ok: bool
    reason: str = ""
    reason_code: str = ""  # "" | "unbuildable" | "unrecorded"
    bundle: str | None = None
    cost_s: float = 0.0

    def to_json(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen
class Checked:
    key: str
    passed: bool
    reason: str = ""
    cost_s: float = 0.0
    #: False when the gate never reached a verdict (killed because the device-minute budget ran out): the kernel
    #: is neither passed nor failed, and the proposer may offer it again on a resumed campaign
    judged: bool = True

    def to_json(self) -> dict:
        return attrs.asdict(self)


def time_of(blocks: Sequence[Sequence[float]]) -> float:
    """A kernel's time in one comparison: the median of its block medians (ns)."""
    return float(np.median([measurement(b) for b in blocks]))


@attrs.frozen
class Timed:
    """One interleaved comparison: blocks of ``against`` (A) and of ``key`` (B), run A B A B ..."""

    key: str
    against: str
    incumbent_blocks: tuple = attrs.field(converter=lambda v: tuple(tuple(float(x) for x in b) for b in v))
    candidate_blocks: tuple = attrs.field(converter=lambda v: tuple(tuple(float(x) for x in b) for b in v))
    order: str = "ABAB"
    source: str = "same-session"  # or "recorded-blocks" (offline: each kernel's own recorded blocks)
    cost_s: float = 0.0
    gpu: Any = attrs.field(default=None, eq=False)  # the device that timed it: {index, uuid, name, clocks} (live)
    #: the float64 oracle's verdict on the outputs of one timed run ({round, run, passed, reason, sha256}); None
    #: where none was made (offline from recorded blocks, sessions recorded before the spot-check)
    spot_check: Any = attrs.field(default=None, eq=False)

    @property
    def t_incumbent(self) -> float:
        return time_of(self.incumbent_blocks)

    @property
    def t_candidate(self) -> float:
        return time_of(self.candidate_blocks)

    def to_json(self) -> dict:
        d = attrs.asdict(self)
        d["t_incumbent_ns"], d["t_candidate_ns"] = self.t_incumbent, self.t_candidate
        if d["gpu"] is None:  # recorded only where a device was asked (journals of old runs stay as they were)
            del d["gpu"]
        if d["spot_check"] is None:
            del d["spot_check"]
        return d

    @property
    def spot_failed(self) -> bool:
        """True when the spot-check of a timed run's outputs was made and failed."""
        return isinstance(self.spot_check, Mapping) and self.spot_check.get("passed") is False

    @classmethod
    def from_json(cls, d: Mapping) -> Timed:
        return cls(**{k: d[k] for k in ("key", "against", "incumbent_blocks", "candidate_blocks", "order", "source",
                                          "cost_s")}, gpu=d.get("gpu"), spot_check=d.get("spot_check"))


@attrs.frozen
class ReferenceCapture:
    kernel: Kernel
    noise_blocks: tuple = attrs.field(converter=lambda v: tuple(tuple(float(x) for x in b) for b in v))
    cost_s: float = 0.0


class Workbench(Protocol):
    """What the loop asks of the world. Every answer is a recorded measurement (and goes to the journal)."""

    kind: str  # "live" | "offline"

    def capture_reference(self, spec: KernelSpec) -> ReferenceCapture: ...

    def build(self, kernel: Kernel) -> Built: ...

    def check(self, kernel: Kernel, built: Built, reference: Kernel) -> Checked: ...

    def time(self, incumbent: Kernel, kernel: Kernel, rounds: int) -> Timed: ...

    def yardstick(self, spec: KernelSpec, rounds: int) -> tuple | None: ...  # blocks of the first, or None

    # optional: ``yardsticks(spec, rounds) -> list[YardstickRun]``, every yardstick of the family, measured or not
    # (a workbench without it has at most the first, from ``yardstick``); ``pair_yardstick(kernel, rounds,
    # key=YARDSTICK) -> Timed | None``, the yardstick ``key`` (the Timed's key) timed against the final incumbent
    # ``kernel`` in interleaved rounds (a workbench without it has no pairing; one whose pair_yardstick takes no
    # ``key`` pairs only the first)

    def bundle_path(self, key: str) -> str | None: ...


# -- bundles for the loop ---------------------------------------------------------------------------------------
def save_kernel_bundle(root: str | os.PathLike, *, spec: KernelSpec, key: str, role: str,
                       files: Mapping[str, tuple[str, Any]] | None = None, blocks: Sequence | None = None,
                       sessions: Sequence[Mapping] | None = None, build_ok: bool = True, build_reason: str = "",
                       cost_s: float = 0.0, inputs: Mapping[str, np.ndarray] | None = None,
                       outputs: Mapping[str, np.ndarray] | None = None, gpu: str | None = None,
                       toolchain: Mapping[str, str] | None = None):
    """Write one kernel's bundle in the layout the offline workbench reads (through ``save_bundle``)."""
    import io

    from mosaic.bundle import save_bundle

    all_files = dict(files or {})
    if blocks is not None or sessions:
        timings = {"unit": "ns", "blocks": [list(b) for b in (blocks or [])], "sessions": list(sessions or [])}
        all_files["timings.json"] = ("timings", json.dumps(timings))
    for name, arrays in (("inputs", inputs), ("outputs", outputs)):
        if arrays is not None:
            buf = io.BytesIO()
            np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
            all_files[f"{name}.npz"] = (name, buf.getvalue())
    extra = {"mosaic_run": {"key": key, "role": role, "build": {"ok": build_ok, "reason": build_reason},
                            "cost_s": float(cost_s)}}
    return save_bundle(root, kernel=spec, language=spec.language, files=all_files, gpu=gpu, toolchain=toolchain,
                       extra=extra, overwrite=True)


def blocks_of(blocks) -> list:
    """Blocks as lists of per-run ns: plain lists, or the capture's TimedRuns objects (``times_ns``)."""
    out = []
    for b in blocks or []:
        out.append(list(b["times_ns"]) if isinstance(b, Mapping) else list(b))
    return out


# -- bookkeeping the live workbench writes and the offline one reads ----------------------------------------------
def update_bundle(root: str | os.PathLike, *, files: Mapping[str, tuple[str, Any]] | None = None,
                  drop: Iterable[str] = (), extra: Mapping[str, Any] | None = None):
    """Rewrite a bundle with files added/replaced/dropped and manifest extras updated (SHA-256s recomputed)."""
    from mosaic.bundle import load_bundle, save_bundle

    b = load_bundle(root)
    keep = {f.path: (f.role, b.member(f.path)) for f in b.files if f.path not in set(drop)}
    keep.update(dict(files or {}))
    extras = {k: v for k, v in b.manifest.items() if k not in RESERVED}
    extras.update(dict(extra or {}))
    return save_bundle(root, kernel=b.kernel, language=b.language, files=keep, gpu=b.gpu,
                       toolchain=b.manifest.get("toolchain") or {}, extra=extras, overwrite=True)


def run_meta(key: str, role: str, ok: bool = True, reason: str = "", cost_s: float = 0.0, **more) -> dict:
    """The manifest's ``mosaic_run`` entry the offline workbench reads."""
    return {"mosaic_run": {"key": key, "role": role, "build": {"ok": bool(ok), "reason": reason},
                           "cost_s": round(float(cost_s), 3), **more}}


def yardstick_meta(key: str, name: str, cost_s: float = 0.0, unmeasured: tuple[str, str] | None = None) -> dict:
    """A yardstick bundle's ``mosaic_run`` entry: its key, its name and, when it measured nothing, why
    (``unmeasured``: reason code, reason)."""
    more = {"unmeasured": {"reason_code": unmeasured[0], "reason": unmeasured[1]}} if unmeasured else {}
    return run_meta(key, "yardstick", cost_s=cost_s, yardstick=name, **more)


def add_session(root: str | os.PathLike, session: Mapping[str, Any], cost_s: float):
    """Append one interleaved session to the bundle's ``timings.json`` (replacing one against the same key)
    and add its cost to ``mosaic_run.cost_s``."""
    from mosaic.bundle import load_bundle

    b = load_bundle(root)
    timings = b.read_json("timings") or {"unit": "ns", "blocks": []}
    sessions = [s for s in timings.get("sessions") or [] if s.get("against") != session["against"]]
    timings["sessions"] = [*sessions, dict(session)]
    meta = dict(b.manifest["mosaic_run"])
    meta["cost_s"] = round(float(meta.get("cost_s", 0.0)) + cost_s, 3)
    old = b.one_file("timings")
    drop = [old.path] if old is not None else []
    return update_bundle(root, files={"timings.json": ("timings", json.dumps(timings, indent=1))}, drop=drop,
                         extra={"mosaic_run": meta})
