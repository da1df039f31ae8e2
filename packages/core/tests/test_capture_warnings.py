"""A capture child's ``warning:`` lines (a plugin's, a damaged oracle-cache entry's) reach the parent's stderr and
the result, instead of being dropped with the rest of a successful child's output; a failed child's output stays
in its bundle's log as before."""

import json
import sys

from mosaic.capture import MAX_WARNINGS, CaptureOptions, child_warnings, run_child
from mosaic.records import KernelSpec

SPEC = KernelSpec("gemm", {"m": 8, "n": 8, "k": 8}, "bf16", "cuda")


def child(tmp_path, body: str):
    res = tmp_path / "result.json"
    script = tmp_path / "child.py"
    script.write_text(f"import json, sys\n{body}\nopen({str(res)!r}, 'w').write(json.dumps("
                      "{'status': 'lowered', 'bundle': None, 'message': '', 'summary': {}}))\n")
    return run_child([sys.executable, str(script)], res, SPEC, "h200", tmp_path / "out.bundle",
                     CaptureOptions(timeout=60), None)


def test_a_successful_childs_warnings_are_relayed_once_each(tmp_path, capsys):
    r = child(tmp_path, "print('compiling'); print('warning: oracle cache entry ab12 damaged: recomputed')\n"
                        "print('  Warning: plugin x is slow', file=sys.stderr)\n"
                        "print('warning: oracle cache entry ab12 damaged: recomputed')")
    assert r.status == "lowered"
    assert r.warnings == ("warning: oracle cache entry ab12 damaged: recomputed", "Warning: plugin x is slow")
    err = capsys.readouterr().err
    assert err.count("warning: oracle cache entry ab12") == 1 and "plugin x is slow" in err
    assert "compiling" not in err
    assert json.loads(json.dumps(r.to_json()))["warnings"] == list(r.warnings)


def test_no_warnings_no_key_and_the_count_is_capped(tmp_path):
    assert "warnings" not in child(tmp_path, "print('all fine')").to_json()
    many = "\n".join(f"warning: w{i}" for i in range(MAX_WARNINGS + 5))
    assert len(child_warnings(many)) == MAX_WARNINGS and child_warnings(None) == ()
