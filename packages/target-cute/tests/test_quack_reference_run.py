"""`mosaic run --reference FILE --target LANG [--start FILE]` (and `reference = ...` / `start = ...` in a campaign
TOML) on the CPU: the reference is quack-kernels' CuTe DSL rmsnorm through our adapter kernel file, its
language read from the file; the first candidate is our own CuTe rmsnorm file, its knob class the file's.
Without a GPU the preview lowers both here and shows the plan (the reference file, the start file, the
ranked rows); a broken or mismatched file is one error line, exit 2, before anything is built. The loop
itself, driven by a scripted workbench (the device parts), builds the start file's text as its first
candidate and keeps that text through knob edits."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest

pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl")

ROOT = Path(__file__).resolve().parents[3]
QUACK = ROOT / "examples" / "kernels" / "cute" / "quack_rmsnorm.py"
START = ROOT / "examples" / "kernels" / "cute" / "rmsnorm.py"
GEMM_CU = ROOT / "examples" / "kernels" / "cuda" / "gemm.cu"
PROBLEM = ["--family", "rmsnorm", "--shape", "16384x8192", "--dtype", "bf16"]


def mosaic(*args, cwd, timeout=900):
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def no_gpu():
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: mosaic run would run the live campaign, not the preview")


def one_line(p):
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "Traceback" not in p.stderr
    return lines[0]


def test_preview_of_a_file_reference_and_a_start_file(tmp_path):
    pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (and torch): the .venv has them")
    no_gpu()
    p = mosaic("run", "--reference", str(QUACK), "--target", "cute", "--start", str(START), *PROBLEM,
               "--quiet", "--out", "camp", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    prev = json.loads((tmp_path / "camp" / "preview.json").read_text())
    c = prev["campaign"]
    assert c["source"] == "cute" and c["target"] == "cute"  # the reference's language read from the file
    assert c["reference"] == str(QUACK) and c["start"] == str(START)
    ref = prev["reference"]
    assert ref["file"] == "quack_rmsnorm.py" and ref["recorded_time_ns"] is None
    from mosaic.bundle import load_bundle

    rb = load_bundle(tmp_path / "camp" / "bundles" / "reference.bundle")
    assert rb.one("source").read_bytes() == QUACK.read_bytes() and "quackrmsnormRMSNorm" in rb.read_text("ptx")
    naive = prev["naive"]
    assert naive["status"] == "lowered" and naive["file"] == "rmsnorm.py"
    assert naive["knobs"] == {"threads": 256, "eps": 1e-6}  # the start file's knob class, not a template's
    nb = load_bundle(naive["bundle"])
    assert nb.one("source").read_bytes() == START.read_bytes() and ".reqntid 256, 1, 1" in nb.read_text("ptx")
    assert prev["rows"], "the reference and the start kernel differ (quack: 128 threads, cp.async)"
    blocks = {r["key"]: (r["reference"], r["candidate"]) for r in prev["rows"]}
    assert blocks["block"] == ([128, 1, 1], [256, 1, 1])
    md = (tmp_path / "camp" / "preview.md").read_text()
    assert "kernel file quack_rmsnorm.py (cute" in md and "the start file rmsnorm.py (cute)" in md
    assert not (tmp_path / "camp" / "journal.jsonl").exists()


def test_a_campaign_toml_names_the_files_relative_to_itself(tmp_path):
    pytest.importorskip("quack.rmsnorm", reason="needs quack-kernels (and torch): the .venv has them")
    no_gpu()
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "ref.py").write_text(QUACK.read_text())
    (kernels / "mine.py").write_text(START.read_text())
    (tmp_path / "campaign.toml").write_text('reference = "kernels/ref.py"\nstart = "kernels/mine.py"\n'
                                            'family = "rmsnorm"\nshape = "16384x8192"\ndtype = "bf16"\n'
                                            'start_knobs = {threads = 512}\n')
    p = mosaic("run", "campaign.toml", "--quiet", "--out", "camp", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    prev = json.loads((tmp_path / "camp" / "preview.json").read_text())
    assert prev["campaign"]["reference"] == str(kernels / "ref.py") and prev["campaign"]["target"] == "cute"
    assert prev["naive"]["status"] == "lowered" and prev["naive"]["knobs"]["threads"] == 512
    assert prev["reference"]["file"] == "ref.py"


def test_bad_files_are_one_line(tmp_path):
    (tmp_path / "broken.py").write_text(START.read_text().replace('ENTRY = "rmsnorm"', 'ENTRY = "nowhere"'))
    (tmp_path / "notes.txt").write_text("hello\n")
    cases = [
        (["--reference", "missing.py", "--target", "cute"], r"kernel file not found .*missing\.py"),
        (["--reference", "notes.txt", "--target", "cute"], r"suffix '\.txt' unknown"),
        (["--reference", "broken.py", "--target", "cute"], r"entry point 'nowhere' is not defined"),
        (["--reference", str(START), "--target", "cute", "--start", str(GEMM_CU)],
         r"language 'cute' builds python kernel files; gemm\.cu is c\+\+ \(--start\)"),
        (["--source", "cute", "--target", "cute", "--start", "broken.py"], r"entry point 'nowhere'"),
        (["--start", str(START)], r"a live run needs --source"),
    ]
    if importlib.util.find_spec("mosaic_target_cutlass") is not None:  # the .venv: C++ files have a language
        cases += [
            (["--reference", str(GEMM_CU), "--target", "cute"], r"gemm\.cu: operand a\[m,k\] names dimension\(s\) m, k"),
            (["--reference", str(START), "--source", "cutlass", "--target", "cute"],
             r"language 'cutlass' builds c\+\+ kernel files; rmsnorm\.py is python \(--reference\)")]
    else:  # .venv312 holds no C++ language plugin
        cases += [(["--reference", str(GEMM_CU), "--target", "cute"],
                   r"no installed language builds c\+\+ kernel files like gemm\.cu")]
    for args, pattern in cases:
        line = one_line(mosaic("run", *args, *PROBLEM, "--out", "bad", cwd=tmp_path))
        assert re.search(pattern, line), (args, line)
    assert not (tmp_path / "bad").exists()  # refused before a campaign directory was made
    (tmp_path / "c.toml").write_text('reference = "nope.py"\nfamily = "rmsnorm"\nshape = "64x256"\n'
                                     'dtype = "bf16"\n')
    assert "kernel file not found" in one_line(mosaic("run", "c.toml", cwd=tmp_path))
    (tmp_path / "d.toml").write_text('reference = "broken.py"\ntarget = "cute"\nfamily = "rmsnorm"\n'
                                     'shape = "64x256"\ndtype = "bf16"\n')
    assert "entry point 'nowhere'" in one_line(mosaic("run", "d.toml", cwd=tmp_path))
    assert "in a campaign file they are the keys" in one_line(mosaic("run", "c.toml", "--reference", str(START),
                                                                     cwd=tmp_path))


class Bench:
    """The device parts, scripted: every build succeeds and is recorded with the text it was given."""

    kind = "offline"

    def __init__(self):
        self.built = []

    def capture_reference(self, spec):
        from mosaic.run.workbench import Kernel, ReferenceCapture

        return ReferenceCapture(Kernel("reference", spec, bundle="ref"), [[200e3 * (1 + 1e-4 * i)] * 5
                                                                          for i in range(10)])

    def build(self, kernel):
        from mosaic.run.workbench import Built

        self.built.append(kernel)
        return Built(kernel.key, True, bundle=str(kernel.spec.knobs["threads"]))

    def check(self, kernel, built, reference):
        from mosaic.run.workbench import Checked

        return Checked(kernel.key, True)

    def time(self, incumbent, kernel, rounds):
        from mosaic.run.workbench import Timed

        us = {"ref": 200.0, "256": 260.0, "512": 210.0, "128": 300.0}
        def t(k):
            return [[us[k.bundle or str(k.spec.knobs["threads"])] * 1e3 * (1 + 1e-4 * i)] * 5 for i in range(10)]

        return Timed(kernel.key, incumbent.key, t(incumbent), t(kernel))

    def yardstick(self, spec, rounds):
        return None

    def prefetch(self, kernels):
        pass


class Script:
    """threads 256 -> 512 (faster), then 512 -> 128 (slower)."""

    name = "script"

    def propose(self, request):
        from mosaic.proposers import Proposal

        t = request.knobs["threads"]
        nxt = {256: [{"threads": 512}], 512: [{"threads": 128}]}.get(t, [])
        return [Proposal(True, request.parent, {"kind": "knob", "knob": next(iter(k)), "value": k[next(iter(k))]},
                         {**request.knobs, **k}) for k in nxt]


def test_the_loop_builds_the_start_file_and_keeps_its_text_through_knob_edits(tmp_path):
    from mosaic.run.campaign import Campaign
    from mosaic.run.journal import Journal
    from mosaic.run.loop import Loop, campaign_tools

    campaign = Campaign.from_json({"reference": str(QUACK), "start": str(START), "family": "rmsnorm",
                                   "shape": "16384x8192", "dtype": "bf16", "beam": 1, "yardstick": False,
                                   "max_candidates": 3}, "test")
    gpu, knob_cls, _ = campaign_tools(campaign)
    assert [f.name for f in attrs.fields(knob_cls)] == ["threads", "eps"]
    bench = Bench()
    loop = Loop(campaign, bench, Script(), Journal(tmp_path / "journal.jsonl"), gpu, knob_cls,
                lift=lambda bundle: bundle,
                diff=lambda ref, fp: SimpleNamespace(layers=(("all", 1.0),), rows=()))
    out = loop.run()
    text = START.read_text()
    assert [k.spec.knobs["threads"] for k in bench.built] == [256, 512, 128]
    assert all(k.source == text for k in bench.built)  # the file's text, never the (absent) template
    assert bench.built[0].spec.name == "rmsnorm.py"
    verdicts = [(e["step"], e["decision"]) for e in loop.events if e["event"] == "verdict"]
    assert verdicts == [(0, "accepted"), (1, "accepted"), (2, "rejected")]
    props = [e for e in loop.events if e["event"] == "proposal" and e["ok"]]
    assert [e["knobs"]["threads"] for e in props] == [256, 512, 128] and all(e["source"] == text for e in props[1:])
    assert out.incumbent == bench.built[1].key and loop.incumbent.kernel.source == text
