"""The campaign report, built from the journal alone (so it can be rebuilt at any time, on any machine).

``DIR/report.json`` — every edit accepted or rejected with its reason, null results, candidates that got
structurally closer but slower, the final differences by name, every yardstick of the family (each alone and
paired with the final incumbent, or why it measured nothing) and the TFLOP/s of every time it gives;
``DIR/report.md`` — the same as tables; ``DIR/report.html`` — self-contained (no scripts, no external files)
with two inline SVG plots: incumbent and candidate time per step with the reference's noise band, and the
fingerprint distance per step. Each is written to a fresh temporary file and renamed into place
(:func:`mosaic.safe_paths.write_atomic`), so a link planted at a report's name is replaced, never written through.
"""

from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path

from mosaic import safe_paths
from mosaic.run.journal import read_campaign_journal
from mosaic.run.workbench import is_primary_yardstick, is_yardstick
from mosaic.timing.throttle import capped_text

FILES = ("report.json", "report.md", "report.html")
#: report.json's format version: 2 added every yardstick (``yardsticks``) and the TFLOP/s table (``throughput``)
VERSION = 2
#: the prefix of the figures of the TFLOP/s table (``throughput``), and the report format that first printed them
THROUGHPUT = "throughput: "
FIGURES_SINCE = ((THROUGHPUT, 2),)


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1e3:.2f}"


def problem_text(family: str | None, shape) -> str:
    """The shape as the user types it: the family's dimension order (gemm m x n x k), then any optional
    dimension by name; a family nobody registered here keeps its recorded order, each dimension named."""
    from mosaic.families import dims

    shape = dict(shape or {})
    order = dims(family) if family else None
    if not order or not set(order) <= set(shape):
        return ",".join(f"{k}={v}" for k, v in shape.items())
    rest = [f"{k}={v}" for k, v in shape.items() if k not in order]
    return "x".join(str(shape[k]) for k in order) + (f" ({', '.join(rest)})" if rest else "")


def beam_lineage(events: list[dict]) -> list[dict]:
    """Each beam the loop recorded, with every member's lineage: the chain of steps it descends from, from the
    naive translation (step 0) to itself, each link marked ``accepted`` (became the incumbent), ``held`` (a
    rejected closer-but-slower candidate the beam kept), ``kept`` (rejected, kept by the beam's ranking) or
    ``naive``. A member's ``role`` is ``incumbent``, ``held`` (still expanded for ``hold`` more steps) or
    ``kept``. Built from the journal alone (proposal parents, verdicts, incumbents)."""
    proposal_of: dict[str, dict] = {}
    verdict_of: dict[str, dict] = {}
    out: list[dict] = []
    step, incumbent = 0, None
    for e in events:
        kind = e.get("event")
        if kind == "proposal" and isinstance(e.get("step"), int):
            step = e["step"]
            if e.get("ok") and e.get("key"):
                proposal_of.setdefault(e["key"], e)
        elif kind == "verdict" and e.get("key"):
            verdict_of[e["key"]] = e
        elif kind == "incumbent":
            incumbent = e.get("key")
        elif kind == "beam":
            members = []
            for m in e.get("members") or []:
                key = m.get("key")
                v = verdict_of.get(key) or {}
                if key == incumbent:
                    role = "incumbent"
                elif m.get("hold", 1 if v.get("closer_but_slower") else 0) > 0:
                    role = "held"
                else:
                    role = "kept"
                members.append({"key": key, "role": role, "hold": m.get("hold"), "knobs": m.get("knobs"),
                                "time_ns": m.get("time_ns"), "lineage": _chain(key, proposal_of, verdict_of)})
            out.append({"step": step, "members": members})
    return out


def _chain(key, proposal_of: dict, verdict_of: dict) -> list[dict]:
    chain, seen = [], set()
    while key is not None and key not in seen and key in proposal_of:
        seen.add(key)
        p, v = proposal_of[key], verdict_of.get(key) or {}
        if p.get("step") == 0 or v.get("reason_code") == "naive":
            link = "naive"
        elif v.get("decision") == "accepted":
            link = "accepted"
        elif v.get("closer_but_slower"):
            link = "held"
        else:
            link = "kept"
        chain.append({"step": p.get("step"), "key": key, "link": link, "edit": p.get("edit")})
        key = p.get("parent") if p.get("step") != 0 else None
    return chain[::-1]


#: a built edit's outcome -> why the row it was aimed at is still there (the first that applies, in this order)
UNFIXED = (("accepted", "edit accepted, the row remains"), ("faster", "edit accepted, the row remains"),
           ("slower", "edit slower"), ("null", "edit null (within the noise)"),
           ("numerics", "edit failed the numerics gate"), ("below-floor", "edit timed below the physical floor"),
           ("unbuildable", "edit unbuildable"), ("proposal", "edit refused before the build"),
           ("unfinished", "edit not judged before the stop"))


def why_unfixed(row: dict, edits: list[dict]) -> dict:
    """Why a remaining row was not fixed: the edits aimed at its key (or, for a symptom, at its cause) and what
    each came to; ``no edit`` when the campaign proposed none (no knob or catalog rewrite of the target reaches
    it, or the budget ended first) -- the next step for a user or an agent."""
    key = row.get("key")
    cause = row.get("cause") or ""
    aimed = [e for e in edits if ((e.get("edit") or {}).get("row") or {}).get("key") == key]
    via = ""
    if not aimed and cause:
        aimed = [e for e in edits if ((e.get("edit") or {}).get("row") or {}).get("key") == cause]
        via = cause
    if not aimed:
        text = "no edit: no knob or catalog rewrite of the target was proposed for it"
        if cause:
            text = f"a consequence of {cause}, which no edit was proposed for"
        return {"code": "no-edit", "text": text, "steps": []}
    codes = [e.get("reason_code") if e.get("outcome") != "accepted" else "accepted" for e in aimed]
    for code, text in UNFIXED:
        if code in codes:
            steps = [e["step"] for e, c in zip(aimed, codes, strict=True) if c == code]
            prefix = f"a consequence of {via}: " if via else ""
            return {"code": code, "text": prefix + text + f" (step{'s' if len(steps) > 1 else ''} "
                    + ", ".join(map(str, steps)) + ")", "steps": [e["step"] for e in aimed]}
    return {"code": codes[0] or "other", "text": f"edit {codes[0]}", "steps": [e["step"] for e in aimed]}


def build_report(events: list[dict]) -> dict:
    head = events[0]
    by = lambda kind: [e for e in events if e["event"] == kind]  # noqa: E731
    ref = next(iter(by("reference")), None)
    yard = next((e for e in by("yardstick") if is_primary_yardstick(e["key"])), None)  # the campaign's first
    stop = next(iter(by("stop")), None)
    proposals = {e["step"]: e for e in by("proposal")}
    builds = {e["key"]: e for e in by("build")}
    verdicts = {e["key"]: e for e in by("verdict")}
    numerics = {e["key"]: e for e in by("numerics")}
    timed = {e["key"]: e for e in by("timed")  # the comparison each verdict was taken on (its last; the final
             if not is_yardstick(e["key"])}            # pairing of the yardstick is not a verdict's)
    edits, series = [], []
    incumbent_t = None
    for inc in by("incumbent")[:1]:
        incumbent_t = inc["time_ns"]
    accepted_times = {}
    for e in by("incumbent"):
        accepted_times[e["key"]] = e["time_ns"]
    inc_time = incumbent_t
    for step in sorted(proposals):
        p = proposals[step]
        key = p.get("key")
        row = {"step": step, "key": key, "parent": p.get("parent"), "edit": p.get("edit"), "knobs": p.get("knobs")}
        v = verdicts.get(key) if key else None
        b = builds.get(key) if key else None
        if not p["ok"]:
            row.update(outcome="rejected", reason_code="proposal", reason=p.get("reason"))
        elif b is not None and not b["ok"]:
            row.update(outcome="rejected", reason_code=b["reason_code"], reason=b["reason"])
        elif v is not None:
            row.update(outcome=v["decision"], reason_code=v["reason_code"], reason=v["reason"],
                       t_candidate_ns=v.get("t_candidate"), t_incumbent_ns=v.get("t_incumbent"),
                       d_candidate=v.get("d_candidate"), d_incumbent=v.get("d_incumbent"),
                       closer_but_slower=bool(v.get("closer_but_slower")))
            gpu = (timed.get(key) or {}).get("gpu")  # checked by the journal's schema (journal.check_events)
            power = capped_text(gpu.get("power_rounds")) if isinstance(gpu, dict) else ""
            if power:  # per-round clock/power samples (journals from before them have none)
                row["power"] = power
        elif key in numerics and not numerics[key]["passed"]:
            row.update(outcome="rejected", reason_code="numerics", reason=numerics[key]["reason"])
        else:
            row.update(outcome="unfinished", reason_code="unfinished", reason="the run stopped before a verdict")
        edits.append(row)
        if row.get("outcome") == "accepted" and key in accepted_times:
            inc_time = accepted_times[key]
        series.append({"step": step, "incumbent_ns": inc_time, "candidate_ns": row.get("t_candidate_ns"),
                       "distance": (b or {}).get("distance"), "outcome": row["outcome"]})
    noise = ref["noise"] if ref else None
    final = None
    if stop is not None:
        t_inc, t_ref = stop.get("t_incumbent_ns"), stop.get("t_reference_ns")
        final = {"incumbent": stop.get("incumbent"), "knobs": stop.get("incumbent_knobs"), "t_incumbent_ns": t_inc,
                 "t_reference_ns": t_ref, "noise_ns": stop.get("noise_ns"),
                 "within_noise_or_faster": (t_inc is not None and t_ref is not None
                                            and t_inc <= t_ref + stop["noise_ns"]),
                 "timed_candidates": stop.get("timed"), "steps": stop.get("steps"),
                 "device_minutes": round(stop.get("cost_s", 0.0) / 60, 3)}
        if yard is not None and t_inc:
            final["fraction_of_yardstick"] = yard["time_ns"] / t_inc
        pair = stop.get("yardstick_paired")
        if pair:  # the same two kernels in one thermal/power state (see Loop.pair_yardstick)
            final["yardstick_paired"] = {**pair, "fraction": pair["t_yardstick_ns"] / pair["t_incumbent_ns"]}
    yardsticks = yardstick_rows(events, yard, stop)
    return {
        "format": "mosaic-run-report", "version": VERSION,
        "campaign": head.get("campaign"), "gpu": (head.get("gpu") or {}).get("name"),
        "gpu_provenance": head.get("gpu_provenance"),  # why that record (mosaic.gpus.resolve_gpu); None: older journals
        "workbench": head.get("workbench"), "proposer": head.get("proposer"),
        "executor": head.get("executor"), "gpus": _gpus_of(events),
        "reference": None if ref is None else {"time_ns": ref["time_ns"], "noise": noise, "floor_ns": ref["floor_ns"]},
        "yardstick": None if yard is None else {"name": yard["name"], "time_ns": yard["time_ns"],
                                                 "note": "timed in the same run"},
        "yardsticks": yardsticks,
        "throughput": throughput(head.get("campaign") or {}, ref, final, yardsticks),
        "stop": None if stop is None else {"code": stop["stop"], "reason": stop["reason"]},
        "final": final,
        "edits": edits,
        "accepted": [e for e in edits if e["outcome"] == "accepted"],
        "null_results": [e for e in edits if e.get("reason_code") == "null"],
        "closer_but_slower": [e for e in edits if e.get("closer_but_slower")],
        "remaining_differences": [{**r, "unfixed": why_unfixed(r, edits)} for r in (stop or {}).get("remaining", [])],
        "series": series,
        "beams": beam_lineage(events),
    }


def _cell(text) -> str:
    """Text as one cell of a markdown table row: one line, no column separator."""
    return " ".join(str(text).replace("|", "/").split())


def yardstick_rows(events: list[dict], yard: dict | None, stop: dict | None) -> list[dict]:
    """Every yardstick the campaign captured at the start, in its order: measured (its time alone and, when the
    stop paired it with the final incumbent, both times of that pairing and the fraction) or not (why). A journal
    from before every yardstick was captured holds only the first, and its pairing as ``yardstick_paired``."""
    pairs = {p["key"]: p for p in (stop or {}).get("yardsticks_paired") or []}
    if not pairs and (stop or {}).get("yardstick_paired") and yard is not None:
        pairs[yard["key"]] = stop["yardstick_paired"]
    out = []
    for e in events:
        if e["event"] not in ("yardstick", "yardstick-unmeasured"):
            continue
        row = {"key": e["key"], "yardstick": e.get("yardstick"), "name": e["name"],
               "measured": e["event"] == "yardstick", "time_ns": e.get("time_ns"), "paired": None}
        if row["measured"]:
            pair = pairs.get(e["key"])
            if pair:
                row["paired"] = {"t_yardstick_ns": pair["t_yardstick_ns"], "t_incumbent_ns": pair["t_incumbent_ns"],
                                 "fraction": pair["t_yardstick_ns"] / pair["t_incumbent_ns"]}
        else:
            row.update(reason_code=e["reason_code"], reason=e["reason"])
        out.append(row)
    return out


def tflops(flops: float | None, time_ns) -> float | None:
    """TFLOP/s of ``flops`` done in ``time_ns`` (None when either is unknown)."""
    if not flops or not isinstance(time_ns, int | float) or isinstance(time_ns, bool) or time_ns <= 0:
        return None
    return flops / time_ns / 1e3


def throughput(campaign: dict, ref: dict | None, final: dict | None, yardsticks: list[dict]) -> dict:
    """The TFLOP/s table: the problem's FLOPs (the family's ``work``; None for a family not installed here) over
    each time the report gives -- the reference alone, the final incumbent and the reference interleaved, every
    yardstick alone and paired with the final incumbent (and the incumbent's side of that pairing) -- one row
    each, and a row for each yardstick that measured nothing, saying why. Every row is a figure the offline
    re-decision recomputes from the bundles."""
    from mosaic.families import flops as family_flops

    try:
        work = family_flops(campaign.get("family"), campaign.get("shape") or {}, campaign.get("dtype") or "")
    except (KeyError, TypeError, ValueError, AttributeError):
        work = None
    rows: list[dict] = []

    def row(kernel: str, timing: str, t) -> None:
        rows.append({"kernel": kernel, "timing": timing, "time_ns": t, "tflops": tflops(work, t)})

    if ref is not None:
        row("reference", "alone (its noise blocks)", ref["time_ns"])
    if final is not None and final.get("t_incumbent_ns") is not None:
        row("final incumbent", "interleaved with the reference", final["t_incumbent_ns"])
        row("reference", "interleaved with the final incumbent", final["t_reference_ns"])
    seen: set[str] = set()
    for y in yardsticks:
        name = _cell(y["name"]) if _cell(y["name"]) not in seen else _cell(f"{y['name']} ({y['key']})")
        seen.add(name)
        if not y["measured"]:
            rows.append({"kernel": name, "timing": _cell(f"not measured ({y['reason_code']}): {y['reason']}"),
                         "time_ns": None, "tflops": None})
            continue
        row(name, "alone", y["time_ns"])
        if y["paired"]:
            row(name, "paired with the final incumbent", y["paired"]["t_yardstick_ns"])
            row("final incumbent", f"paired with {name}", y["paired"]["t_incumbent_ns"])
    return {"flops": work, "rows": rows}


def _gpus_of(events: list[dict]) -> list[dict]:
    """The GPUs that timed this campaign's comparisons (by UUID, in order of first use) and how many each made."""
    seen: dict[str, dict] = {}
    for e in events:
        g = e.get("gpu") if e.get("event") == "timed" else None
        if isinstance(g, dict) and g.get("uuid"):
            row = seen.setdefault(g["uuid"], {"uuid": g["uuid"], "index": g.get("index"), "name": g.get("name"),
                                               "timed": 0})
            row["timed"] += 1
    return list(seen.values())


def _edit_text(e: dict) -> str:
    ed = e.get("edit") or {}
    if ed.get("kind") == "knob" and ed.get("parts"):  # one compound edit: its parts, the edit's own first
        return "compound: " + " + ".join(f"{p['knob']}={json.dumps(p.get('value'))}" for p in ed["parts"])
    if ed.get("kind") == "knob" and "knob" in ed:
        return f"{ed['knob']}={json.dumps(ed.get('value'))}"
    if ed.get("kind") == "source" and ed.get("rewrite"):
        return f"catalog rewrite {ed['rewrite']} of {ed.get('name')} ({str(ed.get('sha256', ''))[:12]})"
    if ed.get("kind") == "source":
        return f"source {ed.get('name')} ({str(ed.get('sha256', ''))[:12]})"
    if ed.get("kind") == "naive":
        return "naive translation"
    if ed.get("knobs"):
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in ed["knobs"].items())
    return "-"


def _row_text(e: dict) -> str:
    r = (e.get("edit") or {}).get("row")
    return f"{r['layer']}:{r['key']} (#{r['rank']})" if r else (e.get("edit") or {}).get("why", "") or "-"


def to_markdown(rep: dict) -> str:
    c = rep["campaign"] or {}
    lines = [f"# mosaic run: {c.get('source')} -> {c.get('target')}, {c.get('family')} "
             f"{problem_text(c.get('family'), c.get('shape'))} {c.get('dtype')} on {rep['gpu']}", ""]
    iso = c.get("isolation") if rep["workbench"] == "live" else None  # live: which processes measured
    lines.append(f"Workbench: {rep['workbench']}{f' (isolation: {iso})' if iso else ''}; proposer: {rep['proposer']}"
                 + (f"; executor: {rep['executor']}" if rep.get("executor") else "") + ".")
    if rep.get("gpus"):
        lines.append("Timed on: " + "; ".join(f"GPU {g['index']} {g['uuid']} ({g['timed']} comparisons)"
                                              for g in rep["gpus"]) + ".")
    ref = rep["reference"]
    if ref:
        n = ref["noise"]
        lines.append(f"Reference: {_us(ref['time_ns'])} us; noise {_us(n['value_ns'])} us ({n['relative']:.2%}, "
                     f"{n['statistic']} over {n['blocks']} blocks); physical floor {_us(ref['floor_ns'])} us.")
    f = rep["final"]
    if rep["yardstick"]:
        lines.append(f"Yardstick: {rep['yardstick']['name']} {_us(rep['yardstick']['time_ns'])} us (timed in the "
                     "same run, alone, after the reference).")
        pair = (f or {}).get("yardstick_paired")
        if pair:
            lines.append(f"Yardstick paired with the final incumbent (interleaved rounds): "
                         f"{rep['yardstick']['name']} {_us(pair['t_yardstick_ns'])} us vs incumbent "
                         f"{_us(pair['t_incumbent_ns'])} us: {pair['fraction']:.1%} of {rep['yardstick']['name']}.")
    if f:
        lines.append(f"Final: {f['incumbent']} {_us(f['t_incumbent_ns'])} us vs reference {_us(f['t_reference_ns'])} "
                     f"us (interleaved) — {'within the noise or faster' if f['within_noise_or_faster'] else 'NOT within the noise'}"
                     + (f"; {f['fraction_of_yardstick']:.1%} of {rep['yardstick']['name']} timed alone"
                        if "fraction_of_yardstick" in f and rep["yardstick"] else "")
                     + (f", {f['yardstick_paired']['fraction']:.1%} paired" if f.get("yardstick_paired") else "")
                     + f". {f['timed_candidates']} timed candidates, {f['steps']} steps, "
                       f"{f['device_minutes']:.2f} device minutes.")
    if rep["stop"]:
        lines.append(f"Stopped: {rep['stop']['reason']}.")
    lines += throughput_lines(rep.get("throughput"))
    lines += ["", "## Edits", "", "| step | edit | row | outcome | why | t cand (us) | t inc (us) | D cand | D inc |",
              "|---|---|---|---|---|---|---|---|---|"]
    for e in rep["edits"]:
        d = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(f"| {e['step']} | {_edit_text(e)} | {_row_text(e)} | {e['outcome']} ({e['reason_code']}) | "
                     f"{(e.get('reason') or '').replace('|', '/')}{f' [{p}]' if (p := e.get('power')) else ''} | {_us(e.get('t_candidate_ns'))} | "
                     f"{_us(e.get('t_incumbent_ns'))} | {d(e.get('d_candidate'))} | {d(e.get('d_incumbent'))} |")
    for title, key in (("Null results", "null_results"), ("Structurally closer but slower", "closer_but_slower")):
        lines += ["", f"## {title}", ""]
        lines += [f"- step {e['step']}: {_edit_text(e)} — {e['reason']}" for e in rep[key]] or ["- none"]
    lines += ["", "## Beam lineage", "",
              "Each beam after each step; a member's lineage is the steps it descends from (naive first), "
              "marked accepted (became the incumbent), held (closer but slower, kept and expanded) or kept.", ""]
    beams = rep.get("beams") or []
    for b in beams:
        parts = []
        for m in b["members"]:
            chain = " -> ".join(f"{x['step']} {x['link']}" for x in m["lineage"]) or "-"
            hold = f", {m['hold']} more step(s)" if m["role"] == "held" and m.get("hold") else ""
            parts.append(f"{m['role']} {m['key']} {_us(m.get('time_ns'))} us{hold} [{chain}]")
        lines.append(f"- after step {b['step']}: " + "; ".join(parts))
    if not beams:
        lines.append("- none")
    lines += ["", "## Remaining differences", ""]
    lines += [f"- {'  <- ' if r.get('cause') else ''}{r['layer']}:{r['key']} ({r['edit']}) reference "
              f"{json.dumps(r['reference'])[:80]}, candidate {json.dumps(r['candidate'])[:80]} — {r['why']}"
              + (f". Not fixed: {r['unfixed']['text']}" if r.get("unfixed") else "")
              for r in rep["remaining_differences"]] or ["- none"]
    return "\n".join(lines) + "\n"


def _tf(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _flop_text(v) -> str:
    return "-" if v is None else f"{v:.6g}"


def throughput_lines(tp: dict | None) -> list[str]:
    """The report.md section of the TFLOP/s table (nothing for a report without one)."""
    if not tp or not tp.get("rows"):
        return []
    lines = ["", "## Yardsticks and throughput", "",
             f"Work: {_flop_text(tp['flops'])} FLOP (the family's work); TFLOP/s = FLOP / time. Every yardstick of "
             "the family is captured alone at the start, each in its own process; at the stop each one measured is "
             "timed against the final incumbent in interleaved rounds (the rows of that pairing, where it was "
             "measured).", "",
             "| kernel | timing | us | TFLOP/s |", "|---|---|---|---|"]
    for r in tp["rows"]:
        lines.append(f"| {r['kernel']} | {r['timing']} | {_us(r['time_ns'])} | {_tf(r['tflops'])} |")
    return lines


#: the edits table's columns counted from its end (an edit's text or an agent's "why" may hold a '|')
_OUTCOME, _WHY, _T_CAND, _T_INC = -6, -5, -4, -3
_TIMES_US = re.compile(r"(\d+(?:\.\d+)?) us\b")


def _pct(v) -> str:
    return f"{v:.1%}"


def reason_times(reason) -> str | None:
    """The times (us, as printed) a timed verdict's reason names: "203.06 us, 210.43 us, 1.15 us"; None if none."""
    found = _TIMES_US.findall(reason or "") if isinstance(reason, str) else []
    return ", ".join(f"{t} us" for t in found) or None


def report_figures(rep: dict) -> dict[str, tuple]:
    """Every figure the report prints, by name: ``(value, printed, precise)`` where ``value`` is the report.json
    value, ``printed`` the text report.md prints for it (None: a figure only report.json holds) and ``precise`` the
    value in the same unit with every digit that matters (shown when two values print alike). What
    :func:`mosaic.run.offline.compare_figures` recomputes from the bundles and compares with every claim."""
    out: dict[str, tuple] = {}

    def put(name, value, printed=...):
        if printed is ... or not isinstance(value, int | float) or isinstance(value, bool):
            precise = str(value)
        elif name.endswith("(us)"):
            precise = f"{value / 1e3:.6f}"
        elif printed and printed.endswith("%"):
            precise = f"{value:.6%}"
        else:
            precise = repr(value)
        out[name] = (value, str(value) if printed is ... else printed, precise)

    ref = rep.get("reference")
    if ref:
        n = ref["noise"]
        put("reference time (us)", ref["time_ns"], _us(ref["time_ns"]))
        put("reference noise (us)", n["value_ns"], _us(n["value_ns"]))
        put("reference noise (relative)", n["relative"], f"{n['relative']:.2%}")
        put("reference noise blocks", n["blocks"])
        put("physical floor (us)", ref["floor_ns"], _us(ref["floor_ns"]))
    yard, f = rep.get("yardstick"), rep.get("final")
    if yard:
        put("yardstick", yard["name"])
        put("yardstick timed alone (us)", yard["time_ns"], _us(yard["time_ns"]))
        pair = (f or {}).get("yardstick_paired")
        if pair:
            put("yardstick paired: the yardstick (us)", pair["t_yardstick_ns"], _us(pair["t_yardstick_ns"]))
            put("yardstick paired: the incumbent (us)", pair["t_incumbent_ns"], _us(pair["t_incumbent_ns"]))
            put("fraction of the yardstick, paired", pair["fraction"], _pct(pair["fraction"]))
    if f:
        put("final incumbent", f["incumbent"])
        put("final incumbent time (us)", f["t_incumbent_ns"], _us(f["t_incumbent_ns"]))
        put("final reference time (us)", f["t_reference_ns"], _us(f["t_reference_ns"]))
        put("final noise (us)", f["noise_ns"], None)  # printed as the reference's noise
        put("final: within the noise or faster", f["within_noise_or_faster"],
            "within the noise or faster" if f["within_noise_or_faster"] else "NOT within the noise")
        if "fraction_of_yardstick" in f and yard:
            put("fraction of the yardstick timed alone", f["fraction_of_yardstick"], _pct(f["fraction_of_yardstick"]))
        put("timed candidates", f["timed_candidates"])
        put("steps", f["steps"])
        put("device minutes", f["device_minutes"], f"{f['device_minutes']:.2f}")
    tp = rep.get("throughput")
    if tp and tp.get("rows"):
        put(f"{THROUGHPUT}work (FLOP)", tp["flops"], _flop_text(tp["flops"]))
        for r in tp["rows"]:
            name = f"{THROUGHPUT}{r['kernel']}, {r['timing']}"
            if r["time_ns"] is None and r["timing"].startswith("not measured"):
                put(f"{THROUGHPUT}{r['kernel']}, not measured", r["timing"])
                continue
            put(f"{name} (us)", r["time_ns"], _us(r["time_ns"]))
            put(f"{name} (TFLOP/s)", r["tflops"], _tf(r["tflops"]))
    if rep.get("stop"):
        put("stop", rep["stop"]["code"], None)
        put("stop reason", rep["stop"]["reason"])
    for e in rep.get("edits") or []:
        s = e["step"]
        put(f"step {s} outcome", f"{e['outcome']} ({e['reason_code']})")
        put(f"step {s} t cand (us)", e.get("t_candidate_ns"), _us(e.get("t_candidate_ns")))
        put(f"step {s} t inc (us)", e.get("t_incumbent_ns"), _us(e.get("t_incumbent_ns")))
        if e.get("t_candidate_ns") is not None and (times := reason_times(e.get("reason"))):
            put(f"step {s} times in its why", times)
    for i, b in enumerate(rep.get("beams") or [], 1):
        for m in b["members"]:
            put(f"beam {i} (after step {b['step']}): {m['key']} (us)", m.get("time_ns"), _us(m.get("time_ns")))
            put(f"beam {i} (after step {b['step']}): {m['key']} role", m["role"])
    return out


_LINES = (
    (re.compile(r"Reference: (\S+) us; noise (\S+) us \(([^,]+), .* over (\d+) blocks\); physical floor (\S+) us\.$"),
     ("reference time (us)", "reference noise (us)", "reference noise (relative)", "reference noise blocks",
      "physical floor (us)")),
    (re.compile(r"Yardstick: (.+) (\S+) us \(timed in the same run, alone, after the reference\)\.$"),
     ("yardstick", "yardstick timed alone (us)")),
    (re.compile(r"Yardstick paired with the final incumbent \(interleaved rounds\): .+ (\S+) us vs incumbent "
                r"(\S+) us: (\S+) of .+\.$"),
     ("yardstick paired: the yardstick (us)", "yardstick paired: the incumbent (us)",
      "fraction of the yardstick, paired")),
    (re.compile(r"Final: (\S+) (\S+) us vs reference (\S+) us \(interleaved\) — (within the noise or faster|NOT within "
                r"the noise)(?:; (\S+) of .+ timed alone)?(?:, (\S+) paired)?\. (\d+) timed candidates, (\d+) steps, "
                r"(\S+) device minutes\.$"),
     ("final incumbent", "final incumbent time (us)", "final reference time (us)",
      "final: within the noise or faster", "fraction of the yardstick timed alone", None, "timed candidates",
      "steps", "device minutes")),
    (re.compile(r"Stopped: (.*)\.$"), ("stop reason",)),
)
_WORK = re.compile(r"Work: (\S+) FLOP \(the family's work\)")
_BEAM_MEMBER = re.compile(r"(incumbent|held|kept) (\S+) (\S+) us(?:, \d+ more step\(s\))? \[[^\]]*\]")


def markdown_figures(text: str) -> dict[str, str]:
    """The figures a report.md prints (or :func:`markdown_of_html` of a report.html), by the names of
    :func:`report_figures`, as printed. Lines it does not know are passed over."""
    out: dict[str, str] = {}
    section, beam = None, 0
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        if section is None:
            for pattern, names in _LINES:
                m = pattern.match(line)
                if m:
                    out.update({n: v for n, v in zip(names, m.groups(), strict=True) if n and v is not None})
        elif section == "Edits" and line.startswith("| ") and not line.startswith("| step"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 9 or not cells[0].isdigit():
                continue
            s = int(cells[0])
            out[f"step {s} outcome"] = cells[_OUTCOME]
            out[f"step {s} t cand (us)"], out[f"step {s} t inc (us)"] = cells[_T_CAND], cells[_T_INC]
            if cells[_T_CAND] != "-" and (times := reason_times(re.sub(r" \[[^\]]*\]$", "", cells[_WHY]))):
                out[f"step {s} times in its why"] = times
        elif section == "Yardsticks and throughput" and (m := _WORK.match(line)):
            out[f"{THROUGHPUT}work (FLOP)"] = m.group(1)
        elif section == "Yardsticks and throughput" and line.startswith("| ") and not line.startswith("| kernel"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 4:
                continue
            kernel, timing, us, tf = cells
            if timing.startswith("not measured"):
                out[f"{THROUGHPUT}{kernel}, not measured"] = timing
            else:
                out[f"{THROUGHPUT}{kernel}, {timing} (us)"], out[f"{THROUGHPUT}{kernel}, {timing} (TFLOP/s)"] = us, tf
        elif section == "Beam lineage" and (m := re.match(r"- after step (\d+): (.*)$", line)):
            beam += 1
            for role, key, t in _BEAM_MEMBER.findall(m.group(2)):
                out[f"beam {beam} (after step {m.group(1)}): {key} (us)"] = t
                out[f"beam {beam} (after step {m.group(1)}): {key} role"] = role
    return out


def markdown_of_html(text: str) -> str:
    """The report.md lines a report.html was rendered from (:func:`to_html`: headings, paragraphs, list items and
    the edits table's rows), for :func:`markdown_figures`; the plots are passed over."""
    lines = []
    for m in re.finditer(r"<(h1|h2|p|li|tr)>(.*?)</\1>", text, re.S):
        tag, body = m.groups()
        if tag == "tr":
            cells = re.findall(r"<t[dh]>(.*?)</t[dh]>", body, re.S)
            lines.append("| " + " | ".join(html.unescape(c) for c in cells) + " |")
        else:
            prefix = {"h1": "# ", "h2": "## ", "li": "- "}.get(tag, "")
            lines.append(prefix + html.unescape(body))
    return "\n".join(lines) + "\n"


def _svg_plot(points: list[tuple], title: str, ylabel: str, band: tuple | None = None, step_line: bool = False,
              width: int = 720, height: int = 260) -> str:
    """points: (x, y, kind) with kind in {'incumbent', 'accepted', 'rejected', 'distance'}."""
    xs = [p[0] for p in points] or [0, 1]
    ys = [p[1] for p in points if p[1] is not None]
    if band:
        ys += list(band)
    if not ys:
        return f"<p>{html.escape(title)}: no data</p>"
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.08 or abs(y1) * 0.05 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    L, R, T, B = 70, 15, 30, 40
    sx = lambda x: L + (x - x0) / (x1 - x0) * (width - L - R)  # noqa: E731
    sy = lambda y: T + (y1 - y) / (y1 - y0) * (height - T - B)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
           f'<line x1="{L}" y1="{height - B}" x2="{width - R}" y2="{height - B}" stroke="#333"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{height - B}" stroke="#333"/>',
           f'<text x="14" y="{height / 2}" font-size="11" transform="rotate(-90 14 {height / 2})">'
           f'{html.escape(ylabel)}</text>',
           f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle" font-size="11">step</text>']
    for v in (y0 + pad, (y0 + y1) / 2, y1 - pad):
        out.append(f'<text x="{L - 5}" y="{sy(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.4g}</text>')
    if band:
        lo, hi = band
        out.append(f'<rect x="{L}" y="{sy(hi):.1f}" width="{width - L - R}" height="{max(sy(lo) - sy(hi), 1):.1f}" '
                   'fill="#9ecae1" fill-opacity="0.5"><title>reference ± noise</title></rect>')
    line = [(sx(x), sy(y)) for x, y, k in points if k in ("incumbent", "distance") and y is not None]
    if line:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(line))
        out.append(f'<path d="{path}" fill="none" stroke="#08519c" stroke-width="2"/>')
    colours = {"accepted": "#31a354", "rejected": "#de2d26", "distance": "#08519c", "incumbent": "#08519c"}
    for x, y, k in points:
        if y is None or (k == "incumbent" and not step_line):
            continue
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{colours.get(k, "#555")}">'
                   f'<title>step {x}: {y:.4g} ({k})</title></circle>')
    out.append("</svg>")
    return "\n".join(out)


def to_html(rep: dict) -> str:
    md = to_markdown(rep)
    ref = rep["reference"]
    pts = []
    for s in rep["series"]:
        pts.append((s["step"], s["incumbent_ns"] / 1e3 if s["incumbent_ns"] else None, "incumbent"))
        if s["candidate_ns"] is not None:
            pts.append((s["step"], s["candidate_ns"] / 1e3, "accepted" if s["outcome"] == "accepted" else "rejected"))
    band = None
    if ref:
        band = ((ref["time_ns"] - ref["noise"]["value_ns"]) / 1e3, (ref["time_ns"] + ref["noise"]["value_ns"]) / 1e3)
    t_svg = _svg_plot(pts, "time per step: incumbent (line), candidates (green accepted, red rejected), "
                      "reference ± noise (band)", "device time (us)", band)
    d_svg = _svg_plot([(s["step"], s["distance"], "distance") for s in rep["series"] if s["distance"] is not None],
                      "fingerprint distance D to the reference per step (a tiebreaker, not a score)", "D")
    body = []
    md_lines = md.splitlines()
    for i, line in enumerate(md_lines):
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("|---"):
            continue
        elif line.startswith("| ") and i + 1 < len(md_lines) and md_lines[i + 1].startswith("|---"):  # a header
            if body and body[-1].endswith("</tr>"):
                body.append("</table>")
            body.append("<table><tr>" + "".join(f"<th>{html.escape(c.strip())}</th>"
                                                  for c in line.strip("|").split("|")) + "</tr>")
        elif line.startswith("| "):
            body.append("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in line.strip("|").split("|"))
                        + "</tr>")
        else:
            if body and body[-1].endswith("</tr>"):
                body.append("</table>")
            if line.startswith("- "):
                body.append(f"<li>{html.escape(line[2:])}</li>")
            elif line:
                body.append(f"<p>{html.escape(line)}</p>")
    if body and body[-1].endswith("</tr>"):
        body.append("</table>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>mosaic run report</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body[:3]) + "\n" + t_svg + "\n" + d_svg + "\n"
            + "\n".join(body[3:]) + "\n</body></html>\n")


def foreign_reports(directory: str | os.PathLike) -> list[str]:
    """The report files already in ``directory`` (before a new campaign starts there: another campaign's)."""
    directory = Path(directory)
    return [name for name in FILES if (directory / name).exists() or (directory / name).is_symlink()]


def write_report(directory: str | os.PathLike) -> dict:
    directory = Path(directory)
    events, _ = read_campaign_journal(directory / "journal.jsonl")
    rep = build_report(events)
    for name, text in zip(FILES, (json.dumps(rep, indent=2) + "\n", to_markdown(rep), to_html(rep)), strict=True):
        safe_paths.write_atomic(directory, name, text)  # replaces a planted link, never writes through it
    return rep
