"""What the live workbench's three processes agree on: the request format and a child's answer.

A request is a JSON object ``{"format": "mosaic-live-request", "mode": "check" | "time" | "cases", ...}``; the answer
is ``{"status": "ok" | "failed", ...}``. The parent (:mod:`mosaic.run.live.parent`) sends it to a one-request
child (:mod:`mosaic.run.live.child`) or to the persistent worker (:mod:`mosaic.run.live.worker`) and gets a
:class:`ChildResult` back either way.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from mosaic.records import KernelSpec

REQUEST_FORMAT = "mosaic-live-request"


@attrs.frozen
class ChildResult:
    status: str  # ok | failed | crashed | timeout
    data: dict
    message: str
    output: str
    wall_s: float
    isolation: dict = attrs.field(factory=dict)  # {mode: step | worker, pid, request, ...}


def result_problem(data: Any) -> str:
    """Why a child's answer is not a result (empty when it is one)."""
    if not isinstance(data, dict) or data.get("status") not in ("ok", "failed"):
        return "the child's result has no status ok|failed"
    return ""


def read_inputs(path: str | os.PathLike) -> dict:
    """The arrays of an inputs file the campaign's process wrote for a request (``.npz``, no pickles): a gate's
    and a timing session's requests name such a file instead of a seed."""
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def knob_label(spec: KernelSpec) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(spec.knobs.items())) or "defaults"


def tail(text: str, n: int = 600) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return " | ".join(lines[-4:])[-n:]
