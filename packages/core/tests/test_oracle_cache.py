"""The campaign's float64 reference cache: computed once, read back (file, memory) only under a verified key,
recomputed on a key mismatch or an unreadable entry, and verdicts identical to the uncached oracle."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mosaic.capture import CaptureOptions, check_and_time
from mosaic.errors import BadInput
from mosaic.families import make_inputs
from mosaic.oracle import check
from mosaic.oracle.cache import ReferenceCache
from mosaic.oracle.formats import FORMATS
from mosaic.records import KernelSpec

SPEC = KernelSpec("gemm", {"m": 64, "n": 32, "k": 48}, "bf16", "numpy", {})


def _outputs(inputs, wrong=False):
    c = FORMATS["bf16"].round(inputs["a"].astype(np.float64) @ inputs["b"]).astype(np.float32)
    if wrong:
        c[3, 4] = 0.0 if c[3, 4] != 0 else 1.0
    return {"c": c}


def test_computed_once_then_read_with_the_same_verdicts(tmp_path):
    inputs = make_inputs(SPEC, 0, "normal")
    for wrong in (False, True):
        plain = check("gemm", inputs, _outputs(inputs, wrong), "bf16")
        first = ReferenceCache(tmp_path)
        v1 = check("gemm", inputs, _outputs(inputs, wrong), "bf16", cache=first)
        assert first.last["source"] == ("computed" if not wrong else "cache-file")
        v2 = check("gemm", inputs, _outputs(inputs, wrong), "bf16", cache=first)
        assert first.last["source"] == "cache-memory"
        fresh = ReferenceCache(tmp_path)  # another process: reads the file after verifying its key
        v3 = check("gemm", inputs, _outputs(inputs, wrong), "bf16", cache=fresh)
        assert fresh.last["source"] == "cache-file" and fresh.last["key_sha256"] == first.last["key_sha256"]
        assert plain.to_json() == v1.to_json() == v2.to_json() == v3.to_json() and plain.passed is not wrong
    entry = next(p for p in tmp_path.iterdir())
    assert entry.name == "gemm-bf16-bf16-a64x48_b48x32-plain"
    key = json.loads((entry / "key.json").read_text())["key"]
    assert key["inputs"]["a"]["sha256"] and key["reference"] == "mosaic.oracle.gemm.reference"
    assert len(key["reference_source_sha256"]) == 64


def test_key_mismatch_recomputes_and_replaces_the_entry(tmp_path):
    a = make_inputs(SPEC, 0, "normal")
    b = make_inputs(SPEC, 1, "normal")  # same family, shape, dtype, epilogue: same entry, other input bytes
    cache = ReferenceCache(tmp_path)
    check("gemm", a, _outputs(a), "bf16", cache=cache)
    other = ReferenceCache(tmp_path)
    v = check("gemm", b, _outputs(b), "bf16", cache=other)
    assert v.passed and other.last["source"] == "computed"
    assert other.last["why"] == "key mismatch (inputs differ)" and other.last["stored"] == "stored"
    again = ReferenceCache(tmp_path)
    check("gemm", b, _outputs(b), "bf16", cache=again)
    assert again.last["source"] == "cache-file" and len(list(tmp_path.iterdir())) == 1
    # the memory level is keyed the same way: inputs a in the process that holds b recompute
    assert check("gemm", a, _outputs(a), "bf16", cache=again).passed and again.last["source"] == "computed"
    # an edited entry (the recorded key no longer matches) is never trusted
    entry = next(tmp_path.iterdir())
    meta = json.loads((entry / "key.json").read_text())
    meta["key"]["dtype"] = "f16"
    (entry / "key.json").write_text(json.dumps(meta))
    c = ReferenceCache(tmp_path)
    check("gemm", a, _outputs(a), "bf16", cache=c)
    assert c.last["source"] == "computed" and c.last["why"] == "key mismatch (dtype differ)"


def test_unreadable_entry_recomputes_and_bad_inputs_still_fail(tmp_path):
    inputs = make_inputs(SPEC, 0, "normal")
    check("gemm", inputs, _outputs(inputs), "bf16", cache=ReferenceCache(tmp_path))
    entry = next(tmp_path.iterdir())
    (entry / "c.tolerance.npy").write_bytes(b"truncated")
    c = ReferenceCache(tmp_path)
    assert check("gemm", inputs, _outputs(inputs), "bf16", cache=c).passed
    assert c.last["source"] == "computed" and c.last["why"].startswith("unreadable entry")
    bad = {**inputs, "a": inputs["a"] + np.float32(1e-3)}  # not representable in bf16: validated, not cached
    with pytest.raises(BadInput, match="not representable in bf16"):
        check("gemm", bad, _outputs(inputs), "bf16", cache=ReferenceCache(tmp_path))


def test_capture_records_whether_the_reference_was_computed_or_read(tmp_path):
    class Wrong:  # a CPU kernel stand-in that fails the oracle (so nothing is timed)
        def __init__(self, inputs):
            self.inputs, self.c = inputs, None

        def launch(self):
            self.c = _outputs(self.inputs, wrong=True)["c"]

        def poison(self):
            pass

        def output(self):
            return {"c": self.c}

    inputs = make_inputs(SPEC, 0, "normal")
    got = []
    for _ in range(2):
        log: list[str] = []
        status, files, summary = check_and_time(Wrong(inputs), SPEC, None, inputs, CaptureOptions(), log,
                                                reference_cache=ReferenceCache(tmp_path))
        assert status == "numerics-failed"
        got.append((summary["oracle_reference"]["source"], log[0]))
    assert [g[0] for g in got] == ["computed", "cache-file"]
    assert "(float64 reference computed, no entry)" in got[0][1] and "(float64 reference cache-file)" in got[1][1]
    _, _, summary = check_and_time(Wrong(inputs), SPEC, None, inputs, CaptureOptions(), [])
    assert summary["oracle_reference"] == {"source": "computed", "why": "no cache"}
