"""The ``command`` proposer: an external program (an agent) proposes the next edit.

The program named by the campaign's ``command`` runs in a subprocess (no shell) with the discrepancy report
on stdin — :meth:`mosaic.proposers.Request.to_json`: the campaign, the kernel to edit (``parent`` and its
``knobs``), its ranked rows and per-layer distances, the incumbent and the reference, the keys already tried
and, after a numerics failure, ``repair`` (the failing candidate and the oracle's reason). It must print
ONE JSON object on stdout and exit 0 within ``command_timeout_s``:

* ``{"knobs": {"stages": 4}, "why": "..."}`` — knob values to change (merged onto the parent's knobs);
* ``{"source": "<full text of the kernel file>", "name": "gemm.py", "knobs": {...}, "why": "..."}`` — an
  edited source file (built by the target backend when it can build sources);
* ``{"parent": KEY, ...}`` — edit another kernel than ``parent`` (a beam member, or the ``repair`` one);
* ``{"done": true}`` — no further edit for this parent.

What comes back is gated like any candidate (built, numerics-checked, timed, judged by the one rule).
Anything else — a non-zero exit, a timeout, no JSON, a JSON value of the wrong shape, unknown fields — is a
recorded rejection with its reason, never a crash of the loop. The program is never given a shell and
nothing it prints is executed or unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping

from mosaic import limits
from mosaic.errors import BadInput
from mosaic.proposers import Proposal, Request

MAX_OUTPUT = 4 * 2**20
ALLOWED = {"knobs", "source", "name", "why", "parent", "done"}


def _reject(parent: str, reason: str) -> Proposal:
    return Proposal(False, parent, None, None, None, reason)


def parse_reply(text: str, request: Request, allowed_parents: set[str]) -> Proposal:
    """Turn the program's stdout into a Proposal (or a rejection naming what was wrong)."""
    parent = request.parent
    text = text.strip()
    if not text:
        return _reject(parent, "the proposer printed nothing (expected one JSON object)")
    try:
        reply = json.loads(text, parse_int=lambda s: 0, parse_constant=lambda s: 0)  # well-formed? (cheap)
    except json.JSONDecodeError as exc:
        return _reject(parent, f"the proposer's output is not JSON ({exc.msg} at line {exc.lineno})")
    except RecursionError:
        pass  # loads_json names the depth limit
    try:  # the limits of every JSON mosaic reads: nesting depth, integer length, no NaN
        reply = limits.loads_json(text, "the proposer's output")
    except BadInput as exc:
        return _reject(parent, exc.line())
    if not isinstance(reply, Mapping):
        return _reject(parent, f"the proposer's output is a JSON {type(reply).__name__}, expected an object")
    unknown = sorted(set(reply) - ALLOWED)
    if unknown:
        return _reject(parent, f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ALLOWED))}")
    if reply.get("done") is True:
        return Proposal(False, parent, None, None, None, "the proposer has no further edit", done=True)
    base_parent = reply.get("parent", parent)
    if not isinstance(base_parent, str) or base_parent not in allowed_parents:
        return _reject(parent, f"parent {base_parent!r} is not a kernel the proposer was offered "
                               f"({', '.join(sorted(allowed_parents))})")
    knobs = reply.get("knobs", {})
    if not isinstance(knobs, Mapping) or not all(isinstance(k, str) for k in knobs):
        return _reject(parent, "'knobs' must be an object of knob name to value")
    for k, v in knobs.items():
        if not isinstance(v, str | int | float | bool | list | type(None)):
            return _reject(parent, f"knob {k!r} has a value of type {type(v).__name__}")
    source = reply.get("source")
    if source is not None and not isinstance(source, str):
        return _reject(parent, "'source' must be the full text of the kernel file")
    if source is None and not knobs:
        return _reject(parent, "the reply changes nothing (no knobs, no source)")
    why = reply.get("why", "")
    if not isinstance(why, str):
        return _reject(parent, "'why' must be a string")
    base = dict(request.knobs) if base_parent == parent else dict((request.repair or {}).get("knobs") or {})
    if base_parent != parent and base_parent != (request.repair or {}).get("key"):
        base = dict(next((h.get("knobs") or {} for h in request.history if h.get("key") == base_parent), {}))
    new = {**base, **knobs}
    edit = {"kind": "source" if source is not None else "knob", "knobs": dict(knobs), "why": why}
    if source is not None:
        edit["name"] = str(reply.get("name") or "kernel")
        edit["sha256"] = hashlib.sha256(source.encode()).hexdigest()
    if len(knobs) == 1 and source is None:
        (edit["knob"], edit["value"]), = knobs.items()
    return Proposal(True, base_parent, edit, new, source)


class CommandProposer:
    name = "command"

    def __init__(self, campaign, knob_cls=None, catalog=None) -> None:
        self.command = list(campaign.command)
        self.timeout = float(campaign.command_timeout_s)

    def propose(self, request: Request) -> list[Proposal]:
        payload = json.dumps(request.to_json())
        allowed = {request.parent, *(h["key"] for h in request.history if h.get("key"))}
        if request.repair:
            allowed.add(request.repair["key"])
        try:
            done = subprocess.run(self.command, input=payload, capture_output=True, text=True,
                                  timeout=self.timeout, env={**os.environ, "MOSAIC_PROPOSER": "command"},
                                  check=False)
        except subprocess.TimeoutExpired:
            return [_reject(request.parent, f"the proposer did not answer within {self.timeout:g} s (killed)")]
        except OSError as exc:
            return [_reject(request.parent, f"the proposer could not be started: {exc.strerror or exc} "
                                            f"({self.command[0]})")]
        if done.returncode != 0:
            err = (done.stderr or "").strip().splitlines()
            return [_reject(request.parent, f"the proposer exited with status {done.returncode}"
                                            + (f": {err[-1][:200]}" if err else ""))]
        if len(done.stdout) > MAX_OUTPUT:
            return [_reject(request.parent, f"the proposer printed more than {MAX_OUTPUT} bytes")]
        return [parse_reply(done.stdout, request, allowed)]
