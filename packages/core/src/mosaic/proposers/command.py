"""The ``command`` proposer: an external program (an agent) proposes the next edit, JSON on stdin/stdout.

The program named by the campaign's ``command`` runs in a subprocess (no shell), once per request, with
ONE JSON object on stdin — the request of protocol :data:`PROTOCOL` (:func:`request_json`; docs/agents.md
has a complete exchange):

* ``protocol``, ``format``, ``campaign``, ``gpu``; ``parent`` (the kernel to edit) with its ``knobs`` and
  ``parent_source`` — ``{"kind": "source", "name", "sha256", "text"}`` when that kernel is a source
  candidate, ``{"kind": "knobs", "knobs", "knob_fields"}`` otherwise;
* ``rows``: the ranked discrepancy rows of the parent against the reference, each with ``concepts`` — the
  catalog concepts the row points to and how the target and source languages write each
  (:mod:`mosaic.catalog`);
* ``layers`` (per-layer distances), ``incumbent``, ``reference`` (time and noise), ``tried``;
* ``repair``: after a failed gate, the failing candidate and what the gate said — ``{"gate": "numerics",
  "key", "knobs", "edit", "reason"}`` (the oracle's reason) or ``{"gate": "build", ...}`` (the build's);
* ``history``: every built edit of the campaign in step order with its outcome and whether it was accepted;
* ``reply``: the fields a reply may hold and the limits it must keep.

It must print ONE JSON object on stdout and exit 0 within ``command_timeout_s``:

* ``{"knobs": {"stages": 4}, "why": "..."}`` — knob values to change (merged onto the parent's knobs);
* ``{"source": "<full text of the kernel file>", "name": "gemm.py", "why": "..."}`` — a new source file;
* ``{"diff": "<unified diff against the parent's source>", "why": "..."}`` — the same, as a diff
  (:func:`mosaic.unified_diff.apply_unified_diff`, strict);
* ``{"parent": KEY, ...}`` — edit another kernel than ``parent`` (one in ``history``, or the ``repair`` one);
* ``{"done": true}`` — no further edit for this parent.

What comes back is checked (:func:`parse_reply`: size, JSON depth and integer length through
:mod:`mosaic.limits`, UTF-8 text, field types, the limits of :data:`REPLY_LIMITS`) and then gated like any
candidate (built by the target backend in the candidate's child process, numerics-checked, timed, judged by
the one rule). Anything else — a non-zero exit, a timeout, binary or non-JSON output, a value of the wrong
shape, unknown fields, a diff that does not apply — is a recorded rejection whose reason names what was
wrong, never a crash of the loop. The program is never given a shell and nothing it prints is executed,
imported or unpickled by the harness.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
from collections.abc import Mapping

from mosaic import limits
from mosaic.errors import BadInput
from mosaic.limits import Limit
from mosaic.proposers import Proposal, Request

PROTOCOL = 2
#: protocols whose replies this harness reads (a protocol-1 reply is a protocol-2 reply without ``diff``)
READS = (1, 2)
ALLOWED = ("protocol", "knobs", "source", "diff", "name", "why", "parent", "done")

#: what one reply may hold, beyond mosaic.limits' JSON limits (nesting depth, integer digits)
REPLY_LIMITS: dict[str, Limit] = {lim.name: lim for lim in (
    Limit("reply_bytes", 4 * 2**20, "bytes", "one reply of the agent (its whole stdout)"),
    Limit("source_bytes", 2 * 2**20, "bytes", "one kernel source file an agent sends (UTF-8)"),
    Limit("diff_bytes", 2 * 2**20, "bytes", "one unified diff an agent sends"),
    Limit("knobs", 64, "knobs", "the knob values one reply changes"),
    Limit("why_chars", 8000, "characters", "the 'why' of one reply"),
)}
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
#: C0 control characters other than tab, newline, carriage return and form feed: a sign of binary data
BINARY_RE = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
STDERR_KEEP = 64 * 2**10


def _reject(parent: str, reason: str) -> Proposal:
    return Proposal(False, parent, None, None, None, reason)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _over(name: str, actual: int) -> str:
    lim = REPLY_LIMITS[name]
    return f"{actual:,} {lim.unit} is over the limit of {lim.value:,} {lim.unit} for {lim.what}"


# -- what the agent is told ----------------------------------------------------------------------------------
class SourceBook:
    """The source texts a proposer knows, by candidate key and by SHA-256.

    The loop's request carries the parent's source when it has one (``Request.source``: a kernel file or a
    source candidate); sources the agent sent are remembered by SHA-256 and tied to their candidate keys
    through the history (whose source edits name their ``sha256``), so a reply may also diff against an
    earlier source candidate it names as ``parent`` (the ``repair`` one)."""

    def __init__(self) -> None:
        self.by_sha: dict[str, tuple[str, str]] = {}  # sha256 -> (name, text)
        self.by_key: dict[str, tuple[str, str]] = {}

    def remember(self, text: str, name: str = "kernel", key: str | None = None) -> None:
        self.by_sha[_sha(text)] = (name, text)
        if key:
            self.by_key[key] = (name, text)

    def learn(self, request: Request) -> None:
        for h in request.history:
            edit = h.get("edit") if isinstance(h.get("edit"), Mapping) else {}
            if h.get("key") and edit.get("sha256") in self.by_sha:
                self.by_key.setdefault(h["key"], self.by_sha[edit["sha256"]])
        text = request.source  # the loop's own record of the parent's source, when it has one
        if isinstance(text, str):
            self.remember(text, self.by_key.get(request.parent, ("kernel", ""))[0], request.parent)

    def source_of(self, key: str | None) -> tuple[str, str] | None:
        return self.by_key.get(key) if key else None


def parent_source(request: Request, book: SourceBook) -> dict:
    """The parent's source (``kind: source``) or, for a kernel that is a knob set, its knobs (``kind: knobs``)."""
    found = book.source_of(request.parent)
    if found is not None:
        name, text = found
        return {"kind": "source", "name": name, "sha256": _sha(text), "text": text}
    return {"kind": "knobs", "knobs": dict(request.knobs),
            "knob_fields": dict(request.knob_fields) if request.knob_fields is not None else None}


def row_concepts_json(row, catalog, languages: tuple[str, ...]) -> list[dict]:
    """The catalog concepts a discrepancy row points to, each with how ``languages`` write it."""
    from mosaic.proposers.knobs import row_concepts

    out = []
    for name, side in row_concepts(row):
        entry = {"concept": name, "side": side}
        if catalog is not None:
            concept = next((c for c in catalog.concepts if c.name == name), None)
            if concept is not None:
                entry["summary"] = concept.summary
            entry["languages"] = {lang: catalog.entry(name, lang).to_json() for lang in languages
                                  if (name, lang) in catalog.entries}
        out.append(entry)
    return out


def repair_json(request: Request) -> dict | None:
    """What the last failed gate said: the numerics repair, or the last edit's build failure."""
    if request.repair:
        return {"gate": "numerics", **dict(request.repair)}
    last = request.history[-1] if request.history else None
    if last and last.get("outcome") == "unbuildable":
        return {"gate": "build", "key": last.get("key"), "knobs": last.get("knobs"), "edit": last.get("edit"),
                "reason": last.get("reason") or "the target backend could not build it"}
    return None


def reply_schema() -> dict:
    return {"fields": {"protocol": f"optional; one of {list(READS)}",
                       "knobs": "object: knob name -> new value (string, number, boolean or a list of those)",
                       "source": "string: the full text of the new kernel file",
                       "diff": "string: a unified diff against parent_source.text",
                       "name": "string: the kernel file's name (letters, digits, '_', '.', '-')",
                       "why": "string: the reason, for the report",
                       "parent": "string: the key of the kernel to edit (default: parent)",
                       "done": "true: no further edit for this parent"},
            "limits": {lim.name: lim.value for lim in REPLY_LIMITS.values()}
            | {"nesting_depth": limits.limit("nesting_depth"), "int_digits": limits.limit("int_digits")}}


def request_json(request: Request, catalog=None, book: SourceBook | None = None) -> dict:
    """The request of protocol :data:`PROTOCOL`: :meth:`Request.to_json` plus the parent's source, each row's
    catalog concepts, what the last failed gate said and the reply's schema."""
    book = book or SourceBook()
    book.learn(request)
    campaign = dict(request.campaign)
    languages = tuple(dict.fromkeys(x for x in (campaign.get("target"), campaign.get("source")) if x))
    d = request.to_json()
    d.update(protocol=PROTOCOL, gpu=dict(request.gpu) if request.gpu else None,
             parent_source=parent_source(request, book),
             rows=[{**r.to_json(), "concepts": row_concepts_json(r, catalog, languages)} for r in request.rows],
             repair=repair_json(request), reply=reply_schema())
    return d


# -- what the agent answers ------------------------------------------------------------------------------------
def _check_source(text, field: str, limit: str) -> str | None:
    if not isinstance(text, str):
        return f"'{field}' must be a string (the {'full text of the kernel file' if field == 'source' else 'unified diff'}), " \
               f"not a JSON {type(text).__name__}"
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > REPLY_LIMITS[limit].value:
        return f"'{field}': {_over(limit, size)}"
    m = BINARY_RE.search(text)
    if m:
        return f"'{field}' holds binary data (control character {m.group()!r} at offset {m.start()}); " \
               "a kernel source is text"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"'{field}' is not valid Unicode text (a lone surrogate)"
    return None


def _knob_value_ok(v) -> bool:
    scalar = (str, int, float, bool, type(None))
    return isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar) for x in v))


def parse_reply(text: str | bytes, request: Request, allowed_parents: set[str],
                book: SourceBook | None = None) -> Proposal:
    """Turn the agent's reply into a Proposal, or a rejection naming what was wrong (never an exception)."""
    parent = request.parent
    if isinstance(text, bytes | bytearray):
        if len(text) > REPLY_LIMITS["reply_bytes"].value:
            return _reject(parent, f"the reply: {_over('reply_bytes', len(text))}")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            return _reject(parent, f"the reply is not UTF-8 text (binary output at byte {exc.start}); expected one "
                                   "JSON object")
    if len(text) > REPLY_LIMITS["reply_bytes"].value:
        return _reject(parent, f"the reply: {_over('reply_bytes', len(text))}")
    text = text.strip()
    if not text:
        return _reject(parent, "the proposer printed nothing (expected one JSON object)")
    try:  # the limits of every JSON mosaic reads: size, nesting depth, integer length, no NaN
        reply = limits.loads_json(text, "the proposer's output")
    except BadInput as exc:
        what = exc.what.replace("not valid JSON:", "is not JSON:") if exc.what.startswith("not valid JSON") else exc.what
        return _reject(parent, f"the proposer's output {what}" if what.startswith("is not JSON") else exc.line())
    if not isinstance(reply, Mapping):
        kind = {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(reply), "null")
        return _reject(parent, f"the proposer's output is a JSON {kind}, expected an object")
    unknown = sorted(set(reply) - set(ALLOWED))
    if unknown:
        return _reject(parent, f"unknown field(s) {', '.join(u[:40] for u in unknown[:8])}; allowed: "
                               f"{', '.join(ALLOWED)}")
    if "protocol" in reply and (isinstance(reply["protocol"], bool) or reply["protocol"] not in READS):
        return _reject(parent, f"protocol {str(reply['protocol'])[:20]!r} is not one this harness reads "
                               f"({', '.join(map(str, READS))}; it speaks {PROTOCOL})")
    if "done" in reply and not isinstance(reply["done"], bool):
        return _reject(parent, "'done' must be true or false")
    if reply.get("done") is True:
        return Proposal(False, parent, None, None, None, "the proposer has no further edit", done=True)
    base_parent = reply.get("parent", parent)
    if not isinstance(base_parent, str) or base_parent not in allowed_parents:
        return _reject(parent, f"parent {str(base_parent)[:40]!r} is not a kernel the proposer was offered "
                               f"({', '.join(sorted(allowed_parents))})")
    knobs = reply.get("knobs", {})
    if not isinstance(knobs, Mapping) or not all(isinstance(k, str) for k in knobs):
        return _reject(parent, "'knobs' must be an object of knob name to value")
    if len(knobs) > REPLY_LIMITS["knobs"].value:
        return _reject(parent, f"'knobs': {_over('knobs', len(knobs))}")
    for k, v in knobs.items():
        if not _knob_value_ok(v):
            return _reject(parent, f"knob {k[:40]!r} has a value of type {type(v).__name__} (a knob value is a "
                                   "string, number, boolean or a list of those)")
    if "source" in reply and "diff" in reply:
        return _reject(parent, "send either 'source' (the whole file) or 'diff' (against the parent's source), "
                               "not both")
    why = reply.get("why", "")
    if not isinstance(why, str):
        return _reject(parent, "'why' must be a string")
    if len(why) > REPLY_LIMITS["why_chars"].value:
        return _reject(parent, f"'why': {_over('why_chars', len(why))}")
    name = reply.get("name")
    if name is not None and (not isinstance(name, str) or not NAME_RE.match(name)):
        return _reject(parent, "'name' must be a plain file name (letters, digits, '_', '.', '-'; no path), "
                               f"not {str(name)[:40]!r}")
    book = book or SourceBook()
    source, origin = reply.get("source"), "source"
    if source is not None:
        problem = _check_source(source, "source", "source_bytes")
        if problem:
            return _reject(parent, problem)
    if "diff" in reply:
        problem = _check_source(reply["diff"], "diff", "diff_bytes")
        if problem:
            return _reject(parent, problem)
        base = book.source_of(base_parent)
        if base is None:
            return _reject(parent, f"a diff needs the parent's source, and kernel {base_parent} is a knob set (no "
                                   "source); send the whole file as 'source'")
        from mosaic.unified_diff import apply_unified_diff

        try:
            source = apply_unified_diff(base[1], reply["diff"], "the diff")
        except BadInput as exc:
            return _reject(parent, exc.line())
        name, origin = name or base[0], "diff"
        problem = _check_source(source, "source", "source_bytes")
        if problem:
            return _reject(parent, f"the diff's result: {problem}")
    if source is None and not knobs:
        return _reject(parent, "the reply changes nothing (no knobs, no source, no diff)")
    base = dict(request.knobs) if base_parent == parent else dict((request.repair or {}).get("knobs") or {})
    if base_parent != parent and base_parent != (request.repair or {}).get("key"):
        base = dict(next((h.get("knobs") or {} for h in request.history if h.get("key") == base_parent), {}))
    new = {**base, **knobs}
    edit = {"kind": "source" if source is not None else "knob", "knobs": dict(knobs), "why": why}
    if source is not None:
        name = name or (book.source_of(base_parent) or ("kernel",))[0]
        edit.update(name=name, sha256=_sha(source), origin=origin)
        if origin == "diff":
            edit["base_sha256"] = _sha(book.source_of(base_parent)[1])
        book.remember(source, name)
    if len(knobs) == 1 and source is None:
        (edit["knob"], edit["value"]), = knobs.items()
    return Proposal(True, base_parent, edit, new, source)


# -- the program -----------------------------------------------------------------------------------------------
def _run_bounded(argv: list[str], payload: bytes, timeout: float, env: Mapping[str, str]):
    """(returncode or None on timeout, stdout bytes (at most reply_bytes + 1), stderr tail, overflowed)."""
    cap = REPLY_LIMITS["reply_bytes"].value
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(env), start_new_session=True)
    out, err = bytearray(), bytearray()
    overflow = [False]

    def pump(stream, buf, keep, tail):
        while True:
            chunk = stream.read(65536)
            if not chunk:
                return
            if tail:
                buf.extend(chunk)
                del buf[:-keep]
            elif len(buf) <= keep:
                buf.extend(chunk[: keep + 1 - len(buf)])
                if len(buf) > keep:
                    overflow[0] = True  # keep draining so the program is not blocked on a full pipe

    def feed():
        try:
            proc.stdin.write(payload)
        except (BrokenPipeError, OSError):
            pass  # the program need not read its request
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    threads = [threading.Thread(target=pump, args=(proc.stdout, out, cap, False), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err, STDERR_KEEP, True), daemon=True),
               threading.Thread(target=feed, daemon=True)]
    for t in threads:
        t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = None
    for t in threads:
        t.join(timeout=5)
    return rc, bytes(out), bytes(err).decode("utf-8", errors="replace"), overflow[0]


class CommandProposer:
    name = "command"

    def __init__(self, campaign, knob_cls=None, catalog=None) -> None:
        self.command = list(campaign.command)
        self.timeout = float(campaign.command_timeout_s)
        self.catalog = catalog
        self.book = SourceBook()

    def propose(self, request: Request) -> list[Proposal]:
        payload = json.dumps(request_json(request, self.catalog, self.book)).encode()
        allowed = {request.parent, *(h["key"] for h in request.history if h.get("key"))}
        if request.repair:
            allowed.add(request.repair["key"])
        env = {**os.environ, "MOSAIC_PROPOSER": "command", "MOSAIC_PROTOCOL": str(PROTOCOL)}
        try:
            rc, out, err, overflow = _run_bounded(self.command, payload, self.timeout, env)
        except OSError as exc:
            return [_reject(request.parent, f"the proposer could not be started: {exc.strerror or exc} "
                                            f"({self.command[0]})")]
        if rc is None:
            return [_reject(request.parent, f"the proposer did not answer within {self.timeout:g} s (killed)")]
        if rc != 0:
            lines = err.strip().splitlines()
            return [_reject(request.parent, f"the proposer exited with status {rc}"
                                            + (f": {lines[-1][:200]}" if lines else ""))]
        if overflow:
            return [_reject(request.parent, f"the reply: the proposer printed more than "
                                            f"{REPLY_LIMITS['reply_bytes'].value:,} bytes (the limit for "
                                            f"{REPLY_LIMITS['reply_bytes'].what})")]
        return [parse_reply(out, request, allowed, self.book)]


__all__ = ["ALLOWED", "PROTOCOL", "REPLY_LIMITS", "CommandProposer", "SourceBook", "parse_reply", "request_json"]
