"""One clock/power sample of the GPU between two timing rounds: SM clock, power draw against the enforced
power limit, and the clock event (throttle) reasons active at that moment, as ``nvidia-smi --query-gpu``
reports them.

Why: on the lent H200 at 8192^3 GEMM the SM clock dropped under load (1395-1980 MHz, power near the
700 W cap) and the same kernel read 1397-1531 us across interleaved pairings. A reader of a verdict must
see whether it was taken while the GPU was power-capped. The sample is taken after a round's last kernel
has finished (the device is synchronised) and before the next round starts, so it never enters a
measured kernel time; it costs one ``nvidia-smi`` query. What it can and cannot say: the reasons and the
clock are those of the moment of the query (a few tens of ms after the round's last kernel; ``gpu_idle``
may already be set), ``power.draw`` is the driver's own (averaged) reading. Without ``nvidia-smi`` (CI, a
container without the driver tools) the sample is ``state="unknown"`` with the reason, never a guess.

Drivers >= 535 name the reasons ``clocks_event_reasons.*``; older ones ``clocks_throttle_reasons.*``.
The first query tries the new names and falls back to the old ones when the driver refuses a field; the
prefix that worked is remembered for the process (one query per sample after the first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import attrs

# the NVML clock event reason bits (nvml.h ``nvmlClocksEventReason*``) and nvidia-smi's field suffix for each
REASON_BITS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
# the reasons nvidia-smi has a named ``--query-gpu`` field for (display_clock_setting has none)
NAMED_REASONS: tuple[str, ...] = tuple(n for n, _ in REASON_BITS if n != "display_clock_setting")
# reasons that mean the clock was held down by power (the verdict's "power-capped")
POWER_REASONS: frozenset[str] = frozenset({"sw_power_cap", "hw_power_brake_slowdown"})
# reasons that mean a slowdown of any kind (power, thermal, the HW slowdown line)
SLOWDOWN_REASONS: frozenset[str] = POWER_REASONS | {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"}
PREFIXES: tuple[str, ...] = ("clocks_event_reasons", "clocks_throttle_reasons")
# value fields, in query order, and the record attribute each fills
VALUE_FIELDS: tuple[tuple[str, str], ...] = (
    ("clocks.sm", "sm_mhz"), ("clocks.max.sm", "max_sm_mhz"), ("clocks.mem", "mem_mhz"),
    ("temperature.gpu", "temperature_c"), ("power.draw", "power_w"), ("power.limit", "power_limit_w"),
    ("enforced.power.limit", "enforced_power_limit_w"),
)

_PREFIX: dict = {"chosen": None}


def query_fields(prefix: str) -> list[str]:
    """The ``--query-gpu`` fields of one sample, in the order :func:`parse_row` reads them."""
    return [f for f, _ in VALUE_FIELDS] + [f"{prefix}.active"] + [f"{prefix}.{n}" for n in NAMED_REASONS]


def _number(text: str) -> float | None:
    t = text.strip()
    if not t or t.startswith("[") or t.upper() == "N/A":  # [N/A], [Not Supported], [Unknown Error]
        return None
    t = t.split()[0]  # tolerate units when the caller asked for them ("690.12 W")
    try:
        return float(t)
    except ValueError:
        return None


def _mask(text: str) -> int | None:
    t = text.strip()
    try:
        return int(t, 16) if t.lower().startswith("0x") else int(t)
    except ValueError:
        return None


@attrs.frozen
class PowerSample:
    """The device's clock and power state at one moment (between rounds). ``state``: "known" or "unknown"
    (then ``reason`` says why and every value is None)."""

    state: str
    reason: str = ""
    source: str = ""  # "nvidia-smi clocks_event_reasons" | "nvidia-smi clocks_throttle_reasons"
    device: str = ""
    sm_mhz: float | None = None
    max_sm_mhz: float | None = None
    mem_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    enforced_power_limit_w: float | None = None
    reasons_mask: str | None = None  # the ``.active`` bitmask as nvidia-smi prints it ("0x...04")
    reasons: tuple = attrs.field(default=(), converter=tuple)  # the active reasons' names
    after_round_ms: float | None = None  # host time from the round's end (device synchronised) to the answer

    @property
    def power_capped(self) -> bool | None:
        """True when a power reason was active; None when unknown."""
        return None if self.state != "known" else bool(POWER_REASONS & set(self.reasons))

    @property
    def slowed(self) -> bool | None:
        return None if self.state != "known" else bool(SLOWDOWN_REASONS & set(self.reasons))

    def to_json(self) -> dict:
        d = attrs.asdict(self)
        d["reasons"] = list(self.reasons)
        d["power_capped"], d["slowed"] = self.power_capped, self.slowed
        return d

    @classmethod
    def from_json(cls, d) -> PowerSample:
        """A sample as recorded (unknown keys ignored, missing ones default): old and new records alike. A
        malformed one (:func:`sample_problem`) is an unknown state that says which field was wrong."""
        if not isinstance(d, dict) or "state" not in d:
            return cls("unknown", "no sample recorded")
        problem = sample_problem(d)
        if problem:
            return cls("unknown", f"malformed sample: {problem}")
        names = {a.name for a in attrs.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


_SAMPLE_NUMBERS = ("sm_mhz", "max_sm_mhz", "mem_mhz", "temperature_c", "power_w", "power_limit_w",
                   "enforced_power_limit_w", "after_round_ms")
_SAMPLE_TEXTS = ("state", "reason", "source", "device")


def sample_problem(d) -> str | None:
    """Why a recorded power sample (its JSON) cannot be read, naming the field; None when it can."""
    if not isinstance(d, dict):
        return "a sample must be an object"
    for name in _SAMPLE_TEXTS:
        if name in d and not isinstance(d[name], str):
            return f"{name} must be a string"
    for name in _SAMPLE_NUMBERS:
        v = d.get(name)
        if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool)):
            return f"{name} must be a number or null"
    if d.get("reasons_mask") is not None and not isinstance(d["reasons_mask"], str):
        return "reasons_mask must be a string or null"
    if "reasons" in d and not (isinstance(d["reasons"], list) and all(isinstance(r, str) for r in d["reasons"])):
        return "reasons must be a list of strings"
    return None


def parse_row(line: str, prefix: str, device: str = "") -> PowerSample:
    """One ``--format=csv,noheader,nounits`` row of :func:`query_fields` (``prefix``) -> a sample. The active
    reasons are the named fields that read "Active"; the bitmask is kept as printed and, where a named
    field is not supported, its bit fills in (``display_clock_setting`` only has its bit)."""
    cells = [c.strip() for c in line.strip().split(",")]
    want = len(query_fields(prefix))
    if len(cells) != want:
        return PowerSample("unknown", f"nvidia-smi gave {len(cells)} value(s) for {want} field(s): {line.strip()[:120]}",
                           f"nvidia-smi {prefix}", device)
    values = {attr: _number(c) for (_, attr), c in zip(VALUE_FIELDS, cells, strict=False)}
    mask_text = cells[len(VALUE_FIELDS)]
    mask = _mask(mask_text)
    named = dict(zip(NAMED_REASONS, cells[len(VALUE_FIELDS) + 1:], strict=True))
    active = []
    for name, bit in REASON_BITS:
        cell = named.get(name, "")
        if cell in ("Active", "Not Active"):
            if cell == "Active":
                active.append(name)
        elif mask is not None and mask & bit:
            active.append(name)
    return PowerSample("known", "", f"nvidia-smi {prefix}", device, reasons_mask=mask_text if mask is not None else None,
                       reasons=tuple(active), **values)


def unknown_field_error(text: str) -> bool:
    """Does nvidia-smi's answer say a queried field does not exist in this driver?"""
    return "is not a valid field to query" in text or "Invalid combination of input arguments" in text


def visible_device() -> str:
    """The device nvidia-smi should be asked about: the first of ``CUDA_VISIBLE_DEVICES`` (an index or a
    UUID, both accepted by ``nvidia-smi -i``), else 0 (nvidia-smi does not read that variable itself)."""
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = v.split(",")[0].strip() if v is not None else "0"
    return first or "0"


def sample_power(device: str | None = None, timeout_s: float = 10.0, round_end: float | None = None) -> PowerSample:
    """Ask nvidia-smi once (twice on the first call of a process whose driver has only the old reason names)
    for :func:`query_fields`. ``round_end``: ``time.perf_counter()`` when the round's device work finished
    (recorded as ``after_round_ms``). Never raises: an absent or failing tool gives an unknown sample."""
    device = visible_device() if device is None else device
    exe = shutil.which("nvidia-smi")
    if not exe:
        return PowerSample("unknown", "nvidia-smi not found on PATH", "", device)
    prefixes = [_PREFIX["chosen"]] if _PREFIX["chosen"] else list(PREFIXES)
    why = ""
    for prefix in prefixes:
        try:
            out = subprocess.run([exe, f"--query-gpu={','.join(query_fields(prefix))}",
                                  "--format=csv,noheader,nounits", "-i", device],
                                 capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return PowerSample("unknown", f"nvidia-smi: {exc}"[:200], f"nvidia-smi {prefix}", device)
        text = (out.stdout or "") + (out.stderr or "")
        if out.returncode != 0 or not out.stdout.strip():
            why = f"nvidia-smi exit {out.returncode}: {text.strip()[:200]}"
            if unknown_field_error(text):
                continue
            break
        _PREFIX["chosen"] = prefix
        s = parse_row(out.stdout.strip().splitlines()[0], prefix, device)
        if round_end is not None:
            s = attrs.evolve(s, after_round_ms=round((time.perf_counter() - round_end) * 1e3, 1))
        return s
    return PowerSample("unknown", why or "nvidia-smi answered nothing", "nvidia-smi", device)


def capped_rounds(samples) -> dict:
    """Over a comparison's per-round samples (records or their JSON): how many rounds were power-capped,
    slowed at all, and known. ``{"rounds", "known", "power_capped", "slowed", "min_sm_mhz", "max_sm_mhz"}``."""
    got = [s if isinstance(s, PowerSample) else PowerSample.from_json(s) for s in samples or []]
    known = [s for s in got if s.state == "known"]
    clocks = [s.sm_mhz for s in known if s.sm_mhz is not None]
    return {"rounds": len(got), "known": len(known), "power_capped": sum(bool(s.power_capped) for s in known),
            "slowed": sum(bool(s.slowed) for s in known), "min_sm_mhz": min(clocks) if clocks else None,
            "max_sm_mhz": max(clocks) if clocks else None,
            "unknown_reason": next((s.reason for s in got if s.state != "known"), "")}


def capped_text(samples) -> str:
    """"power-capped in k of n rounds (SM a-b MHz)", or why it is not known; "" when no round was sampled."""
    c = capped_rounds(samples)
    if not c["rounds"]:
        return ""
    if not c["known"]:
        return f"power state unknown in {c['rounds']} round(s): {c['unknown_reason']}"
    text = f"power-capped in {c['power_capped']} of {c['known']} rounds"
    if c["known"] < c["rounds"]:
        text += f" ({c['rounds'] - c['known']} unknown)"
    if c["min_sm_mhz"] is not None:
        text += f", SM {c['min_sm_mhz']:.0f}-{c['max_sm_mhz']:.0f} MHz"
    return text
