"""The command proposer's protocol 2: what the agent is told (parent source, rows with catalog concepts, the
repair reason, history) and what it may answer (knobs, a source file, a unified diff), checked through
mosaic.limits; a scripted agent drives an offline campaign whose accepted steps are source edits, and
``mosaic run --offline`` re-decides it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mosaic.catalog import catalog_from_host
from mosaic.plugins import host
from mosaic.proposers import Request
from mosaic.proposers.command import (
    PROTOCOL,
    REPLY_LIMITS,
    CommandProposer,
    SourceBook,
    parse_reply,
    request_json,
)
from mosaic.records import Discrepancy, KernelSpec
from mosaic.run.loop import full_knobs
from mosaic.run.workbench import candidate_key, save_kernel_bundle
from mosaic.unified_diff import apply_unified_diff, make_unified_diff

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402
import test_proposers as tp  # noqa: E402

MOSAIC = str(Path(sys.executable).parent / "mosaic")

# Three versions of an agent's kernel file (test data: the offline workbench finds each by its candidate key
# among the recorded bundles; nothing is built). BAD swaps the operands' roles, V1 makes the tile loop
# persistent, V2 deepens the pipeline.
SOURCE_V1 = '''"""bf16 GEMM in CuTe DSL, sm_90a: TMA loads, a wgmma mainloop, a persistent tile loop."""
import cutlass
import cutlass.cute as cute

STAGES = 4


@cute.kernel
def gemm_kernel(tma_a: cute.CopyAtom, tma_b: cute.CopyAtom, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor):
    tile = cute.arch.block_idx()[0]
    while tile < num_tiles(mC):  # persistent: one CTA per SM walks the tiles
        mainloop(tma_a, tma_b, mA, mB, tile, STAGES)
        epilogue(mC, tile)
        tile += cute.arch.grid_dim()[0]
'''
SOURCE_BAD = SOURCE_V1.replace("mainloop(tma_a, tma_b, mA, mB,", "mainloop(tma_b, tma_a, mB, mA,")
SOURCE_V2 = SOURCE_V1.replace("STAGES = 4", "STAGES = 5")
NAME = "gemm_cute.py"


def knob_cls():
    return host().get("languages", "cute").backend.knobs("gemm")


def source_key(source: str) -> str:
    spec = KernelSpec("gemm", rf.SHAPE, "bf16", "cute", full_knobs(knob_cls(), rf.HOPPER))
    return candidate_key(spec, source)


def source_campaign(root: Path) -> Path:
    """The recorded agent campaign of test_proposers plus bundles of the three source candidates (edits of the
    hopper kernel): BAD fails the numerics gate, V1 runs at 190 us, V2 at 172.4 us (the reference: 172.8 us); and
    the hopper kernel with 8 stages, unbuildable (shared memory)."""
    src = tp.agent_campaign(root)
    inputs, outputs = rf.small_problem()
    bad = {"c": outputs["c"] + (np.arange(outputs["c"].size).reshape(outputs["c"].shape) % 5 == 1) * 4.0}
    knobs = full_knobs(knob_cls(), rf.HOPPER)
    _, lau, _, _, _, _ = rf.model(rf.HOPPER)
    for text, us, out in ((SOURCE_BAD, 190.0, bad), (SOURCE_V1, 190.0, outputs), (SOURCE_V2, 172.4, outputs)):
        key = source_key(text)
        spec = KernelSpec("gemm", rf.SHAPE, "bf16", "cute", knobs)
        files = {**rf._sass("tma", lau), f"source/{NAME}": ("source", text)}
        save_kernel_bundle(src / "bundles" / f"cand-{key}.bundle", spec=spec, key=key, role="candidate",
                           files=files, blocks=None if out is bad else rf.blocks(us, 0.002, 5, 20, int(key[:8], 16)),
                           outputs=out, cost_s=6.0, gpu="h200")
    unbuildable = {**rf.HOPPER, "stages": 8}  # 8 stages of 128x128x64 bf16 tiles exceed the shared memory
    spec = KernelSpec("gemm", rf.SHAPE, "bf16", "cute", full_knobs(knob_cls(), unbuildable))
    _, _, _, _, _, reason = rf.model(unbuildable)
    save_kernel_bundle(src / "bundles" / f"cand-{candidate_key(spec)}.bundle", spec=spec, key=candidate_key(spec),
                       role="candidate", files={"build.log": ("log", reason)}, build_ok=False, build_reason=reason,
                       cost_s=6.0, gpu="h200")
    return src


def request(knobs=rf.HOPPER, rows=(), **kw):
    base = {"campaign": {}, "parent": "p", "knobs": knobs, "rows": list(rows), "layers": (), "incumbent": {},
            "reference": {}, "tried": frozenset()}
    return Request(**{**base, **kw})


# -- what the agent is told --------------------------------------------------------------------------------------
def test_the_request_names_its_protocol_rows_with_catalog_concepts_and_the_parent_knob_set():
    cat = catalog_from_host(host())
    rows = [Discrepancy("control", "pipeline.stages", 5, 4, 1, "knob")]
    req = request(rows=rows, knob_fields={"stages": 4}, campaign={"source": "pallas", "target": "cute"})
    d = request_json(req, cat)
    assert d["protocol"] == PROTOCOL == 2 and d["format"] == "mosaic-proposal-request"
    assert d["parent_source"] == {"kind": "knobs", "knobs": rf.HOPPER, "knob_fields": {"stages": 4}}
    concepts = d["rows"][0]["concepts"]
    assert [c["concept"] for c in concepts] == ["pipeline-stage"]
    cute = concepts[0]["languages"]["cute"]
    assert "stages" in cute["expression"] and set(concepts[0]["languages"]) == {"cute", "pallas"}
    assert d["reply"]["limits"]["source_bytes"] == REPLY_LIMITS["source_bytes"].value
    assert d["reply"]["limits"]["nesting_depth"] == 64
    json.dumps(d)  # plain JSON


def test_repair_says_what_the_failed_gate_said():
    numerics = request(repair={"key": "k1", "knobs": {}, "edit": {}, "reason": "max |err| 8 > 0.06"})
    assert request_json(numerics)["repair"] == {"gate": "numerics", "key": "k1", "knobs": {}, "edit": {},
                                                "reason": "max |err| 8 > 0.06"}
    built = request(history=({"step": 1, "key": "k2", "parent": "p", "edit": {"kind": "knob"}, "knobs": {"stages": 8},
                              "outcome": "unbuildable", "accepted": False,
                              "reason": "[smem-per-block] 266240 B exceed 232448 B"},))
    rep = request_json(built)["repair"]
    assert rep["gate"] == "build" and rep["key"] == "k2" and "smem-per-block" in rep["reason"]
    assert request_json(request())["repair"] is None


def test_a_source_reply_is_remembered_and_offered_as_the_parent_source_of_its_candidate():
    book = SourceBook()
    p = parse_reply(json.dumps({"source": SOURCE_V1, "name": NAME, "why": "persistent"}), request(), {"p"}, book)
    assert p.ok and p.source == SOURCE_V1 and p.edit["origin"] == "source" and p.edit["name"] == NAME
    later = request(parent="kv1", history=({"step": 2, "key": "kv1", "parent": "p", "edit": p.edit,
                                            "knobs": p.knobs, "outcome": "faster", "accepted": True},))
    ps = request_json(later, None, book)["parent_source"]
    assert ps["kind"] == "source" and ps["text"] == SOURCE_V1 and ps["name"] == NAME


def test_a_diff_reply_is_applied_to_the_parent_source():
    book = SourceBook()
    book.remember(SOURCE_V1, NAME, "p")
    diff = make_unified_diff(SOURCE_V1, SOURCE_V2, NAME)
    p = parse_reply(json.dumps({"diff": diff, "why": "5 stages"}), request(), {"p"}, book)
    assert p.ok and p.source == SOURCE_V2 and p.edit["origin"] == "diff" and p.edit["name"] == NAME
    stale = make_unified_diff(SOURCE_V1.replace("STAGES = 4", "STAGES = 3"), SOURCE_V2, NAME)
    bad = parse_reply(json.dumps({"diff": stale}), request(), {"p"}, book)
    assert not bad.ok and "hunk 1" in bad.reason and "does not apply" in bad.reason
    nobase = parse_reply(json.dumps({"diff": diff}), request(), {"p"}, SourceBook())
    assert not nobase.ok and "knob set (no source)" in nobase.reason


def test_unified_diff_round_trips_and_refuses_what_does_not_apply():
    a = "".join(f"line {i}\n" for i in range(30))
    b = a.replace("line 3\n", "line three\n").replace("line 20\n", "") + "tail\n"
    assert apply_unified_diff(a, make_unified_diff(a, b)) == b
    # a file whose last line has no newline, both ways
    assert apply_unified_diff(a, make_unified_diff(a, b.rstrip("\n"))) == b.rstrip("\n")
    assert apply_unified_diff(b.rstrip("\n"), make_unified_diff(b.rstrip("\n"), a)) == a
    # shifted: the hunk's context is found at its one other place
    shifted = "header\n" + a
    assert apply_unified_diff(shifted, make_unified_diff(a, b)) == "header\n" + b
    from mosaic.errors import BadInput

    for diff, needle in (("no hunks here\n", "no hunk"),
                         ("@@ -1,2 +1,2 @@\n-line 0\n+x\n", "header says"),
                         ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-line 0\n+x\n--- a/y\n+++ b/y\n", "more than one file"),
                         ("@@ -1 +1 @@\n-nope\n+x\n", "does not apply"),
                         ("@@ -1," + "9" * 5000 + " +1 @@\n-line 0\n", "no hunk")):
        with pytest.raises(BadInput, match=needle):
            apply_unified_diff(a, diff)


@pytest.mark.parametrize("reply, needle", [
    (b"\xff\xfe{\x00\x01", "not UTF-8 text"),
    ('{"source": "x\\u0000y"}', "binary data"),
    ('{"knobs": {"stages": 5}, "protocol": 9}', "protocol '9'"),
    ('{"source": "a", "diff": "b"}', "either 'source'"),
    ('{"source": "a", "name": "../../etc/passwd"}', "plain file name"),
    ('{"knobs": {"stages": 5}, "done": "yes"}', "'done' must be true or false"),
    ('{"knobs": {"stages": [[1]]}}', "type list"),
    ('"just a string"', "JSON string"),
    ('{"why": 5, "knobs": {"stages": 5}}', "'why' must be a string"),
    ('{"diff": 5}', "'diff' must be a string"),
])
def test_hostile_replies_are_refused_with_a_reason(reply, needle):
    p = parse_reply(reply, request(), {"p"})
    assert not p.ok and needle in p.reason, p.reason


def test_reply_limits_hold():
    big = json.dumps({"source": "x" * (REPLY_LIMITS["source_bytes"].value + 1)})
    assert "over the limit" in parse_reply(big, request(), {"p"}).reason
    many = json.dumps({"knobs": {f"k{i}": i for i in range(REPLY_LIMITS["knobs"].value + 1)}})
    assert "knobs is over the limit" in parse_reply(many, request(), {"p"}).reason
    deep = '{"knobs": {"stages": ' + "[" * 100 + "]" * 100 + "}}"
    assert "levels is over the limit" in parse_reply(deep, request(), {"p"}).reason
    huge = b"{" + b" " * (REPLY_LIMITS["reply_bytes"].value + 1) + b"}"
    assert "over the limit" in parse_reply(huge, request(), {"p"}).reason


def test_a_program_that_floods_stdout_or_prints_binary_is_refused_not_buffered(tmp_path):
    flood = tp.campaign(proposer="command", command=[sys.executable, "-c",
                                                     "import sys\nfor _ in range(200): sys.stdout.write('x' * 65536)"])
    out = CommandProposer(flood).propose(request())
    assert not out[0].ok and "printed more than" in out[0].reason
    binary = tp.campaign(proposer="command", command=[sys.executable, "-c",
                                                      "import sys; sys.stdout.buffer.write(b'\\x80\\x81\\x00')"])
    assert "not UTF-8" in CommandProposer(binary).propose(request())[0].reason
    deaf = tp.campaign(proposer="command", command=[sys.executable, "-c", 'print(\'{"knobs": {"stages": 5}}\')'])
    assert CommandProposer(deaf).propose(request())[0].ok  # a program that never reads its request


# -- a scripted agent drives an offline campaign with source edits -------------------------------------------------
AGENT = r'''
import difflib, json, os, sys
req = json.load(sys.stdin)
log = open(os.environ["AGENT_LOG"], "a")
log.write(json.dumps({"protocol": req["protocol"], "parent": req["parent"], "source": req["parent_source"],
                      "repair": req["repair"], "concepts": [c["concept"] for r in req["rows"] for c in r["concepts"]],
                      "history": [[h["step"], h["outcome"], h["accepted"]] for h in req["history"]]}) + "\n")
v1, bad, v2 = (open(os.environ["AGENT_" + k]).read() for k in ("V1", "BAD", "V2"))
n = len(req["history"])
def diff(a, b):
    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), "a/gemm_cute.py", "b/gemm_cute.py"))
if n == 0:
    print(json.dumps({"knobs": {"kernel": "hopper"}, "why": "the reference uses TMA and wgmma"}))
elif n == 1:
    print(json.dumps({"source": bad, "name": "gemm_cute.py", "why": "persistent tile loop"}))
elif n == 2 and req["repair"]:
    print(json.dumps({"parent": req["repair"]["key"], "diff": diff(bad, v1), "why": "operands were swapped"}))
elif n == 3:
    src = req["parent_source"]
    print(json.dumps({"diff": diff(src["text"], v2), "why": "five stages, as the reference"}))
else:
    print(json.dumps({"done": True}))
'''


def run_source_agent(tmp_path: Path):
    src = source_campaign(tmp_path / "c")
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {"PATH": "/usr/bin:/bin", "AGENT_LOG": str(tmp_path / "agent.log"),
           **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "MOSAIC_"))}}
    for k, text in (("V1", SOURCE_V1), ("BAD", SOURCE_BAD), ("V2", SOURCE_V2)):
        (tmp_path / k).write_text(text)
        env[f"AGENT_{k}"] = str(tmp_path / k)
    done = subprocess.run([MOSAIC, "run", "--offline", str(src), "--quiet", "--command",
                           f"{sys.executable} {script}"], capture_output=True, text=True, env=env, timeout=300)
    return src, done


def test_a_scripted_agent_converges_by_source_edits_and_offline_reproduces_it(tmp_path):
    src, done = run_source_agent(tmp_path)
    assert done.returncode == 0, done.stderr
    ev = [json.loads(x) for x in (src / "offline" / "journal.jsonl").read_text().splitlines()]
    verdicts = [(e["step"], e["key"], e["reason_code"]) for e in ev if e["event"] == "verdict"]
    assert [(s, c) for s, _, c in verdicts] == [(0, "naive"), (1, "faster"), (2, "numerics"), (3, "faster"),
                                                (4, "faster")]
    assert verdicts[2][1] == source_key(SOURCE_BAD) and verdicts[3][1] == source_key(SOURCE_V1)
    assert verdicts[4][1] == source_key(SOURCE_V2) and ev[-1]["stop"] == "converged"
    edits = {e["step"]: e["edit"] for e in ev if e["event"] == "proposal" and e["step"] > 0}
    assert edits[3]["origin"] == "diff" and edits[4]["origin"] == "diff" and edits[2]["origin"] == "source"
    seen = [json.loads(x) for x in (tmp_path / "agent.log").read_text().splitlines()]
    assert all(s["protocol"] == 2 for s in seen)
    assert seen[0]["source"]["kind"] == "knobs" and seen[0]["concepts"]
    assert seen[2]["repair"]["gate"] == "numerics" and seen[2]["repair"]["key"] == source_key(SOURCE_BAD)
    assert "differ" in seen[2]["repair"]["reason"] or "err" in seen[2]["repair"]["reason"]
    # the parent of step 4 is the accepted V1 source candidate: the agent was offered its text
    assert seen[3]["parent"] == source_key(SOURCE_V1)
    assert seen[3]["source"]["kind"] == "source" and seen[3]["source"]["text"] == SOURCE_V1
    assert seen[3]["history"] == [[1, "faster", True], [2, "numerics", False], [3, "faster", True]]
    rep = json.loads((src / "offline" / "report.json").read_text())
    assert [e["edit"]["kind"] for e in rep["accepted"]] == ["naive", "knob", "source", "source"]
    # offline re-decision of the finished campaign: its bundles and its journal, the agent not run
    again = tmp_path / "again"
    shutil.copytree(src / "bundles", again / "bundles")
    shutil.copy(src / "offline" / "journal.jsonl", again / "journal.jsonl")
    re = subprocess.run([MOSAIC, "run", "--offline", str(again), "--quiet"], capture_output=True, text=True,
                        timeout=300)
    assert re.returncode == 0, re.stdout + re.stderr
    assert "all 5 recorded verdicts and the stop reproduced" in re.stdout


# -- any reply at all: a Proposal, never an exception ---------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
FIELDS = st.dictionaries(st.sampled_from(["protocol", "knobs", "source", "diff", "name", "why", "parent", "done"]),
                         JSON | st.text(max_size=200), max_size=6)


def _book():
    book = SourceBook()
    book.remember(SOURCE_V1, NAME, "p")
    return book


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_any_bytes_are_a_proposal_or_a_reasoned_rejection(raw):
    p = parse_reply(raw, request(), {"p"}, _book())
    assert p.ok or p.done or p.reason


@settings(max_examples=300, deadline=None)
@given(FIELDS)
def test_any_reply_object_is_a_proposal_or_a_reasoned_rejection(reply):
    p = parse_reply(json.dumps(reply), request(), {"p"}, _book())
    assert p.ok or p.done or p.reason
    if p.ok:  # what is accepted is well-formed: a knob set of plain values, a text source, an edit record
        assert isinstance(p.knobs, dict) and (p.source is None or isinstance(p.source, str))
        assert p.edit["kind"] == ("source" if p.source is not None else "knob")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="@-+ \n,0123456789abc\\", max_size=200))
def test_any_diff_text_applies_or_is_refused_with_one_line(diff):
    from mosaic.errors import BadInput

    try:
        out = apply_unified_diff(SOURCE_V1, diff)
    except BadInput as exc:
        assert "\n" not in exc.line()
    else:
        assert isinstance(out, str)
