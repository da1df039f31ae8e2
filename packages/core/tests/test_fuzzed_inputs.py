"""Hypothesis over what a colleague shares: campaign journals (``mosaic run --offline`` / ``--resume``), campaign
files (``mosaic run campaign.toml``) and bundle manifests (``mosaic bundle verify/show``, ``lift``). Whatever the
mutation, the promise holds: exit 0, 1 or 2, at most one ``error:`` line, no traceback, nothing written outside
the output directory. Bounded (``max_examples``) so the suite stays a few seconds per property."""

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402
from test_hostile_campaigns import main  # noqa: E402

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
           | st.sampled_from(["gemm", "cute", "pallas", "h200", "bf16", "knobs", "command", "offline", "4096x4096x4096",
                              "reference", "faster", "accepted", "stop", ""]))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                                          max_size=4), max_leaves=8)
RAW_LINES = ["", "{", "[1, 2]", '{"event": 5}', '{"event": "x", "v": NaN}', '{"event": "x", "v": ' + "9" * 5000 + "}",
             '{"event": "x", "a": ' + "[" * 200 + "]" * 200 + "}", "\x00\xff", '{"event": "campaign"}', "null"]


def snapshot(root: Path) -> dict:
    """Every path under ``root`` with its size and modification time (what 'nothing written' compares)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def kept_promise(rc: int, out: str, err: str) -> None:
    assert rc in (0, 1, 2), (rc, out, err)
    event(f"exit {rc}")
    assert "Traceback" not in out + err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) <= 1, err
    if rc == 2:
        assert len(errors) == 1, err


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    src = rf.build_campaign(root / "c")
    rc, out, err = main("run", "--offline", str(src), "--out", str(root / "o"), "--quiet")
    assert rc == 0, err
    return root


@st.composite
def journal_mutations(draw, n_events: int):
    """1-3 edits of a recorded journal: set or delete a field, replace or duplicate a line, cut the tail."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["set", "set", "set", "del", "raw", "dup", "cut", "nested"]))
        i = draw(st.integers(0, n_events - 1))
        if kind == "set":
            field = draw(st.sampled_from(["event", "key", "step", "ok", "knobs", "edit", "bundle", "noise",
                                          "noise_blocks", "blocks", "incumbent_blocks", "candidate_blocks", "against",
                                          "decision", "reason_code", "passed", "cost_s", "time_ns", "stop",
                                          "remaining", "campaign", "gpu", "source_dir", "replays_journal",
                                          "members", "parent", "source", "done", "floor_ns", "noise_ns"]))
            edits.append(("set", i, field, draw(json_values)))
        elif kind == "del":
            edits.append(("del", i, draw(st.sampled_from(["event", "key", "step", "ok", "campaign", "noise",
                                                          "bundle", "reason", "stop", "time_ns", "against"]))))
        elif kind == "raw":
            edits.append(("raw", i, draw(st.sampled_from(RAW_LINES) | st.text(max_size=30))))
        elif kind == "dup":
            edits.append(("dup", i))
        elif kind == "cut":
            edits.append(("cut", draw(st.integers(1, 400))))
        else:
            setting = draw(st.sampled_from(["shape", "start_knobs", "family", "beam", "budget_min", "proposer",
                                            "command", "dtype", "check_shape", "rounds", "isolation", "nonsense"]))
            edits.append(("nested", setting, draw(json_values)))
    return edits


def apply(events: list[dict], edits) -> bytes:
    evs = json.loads(json.dumps(events))
    lines: list[str | None] = [None] * len(evs)
    cut = 0
    for e in edits:
        if e[0] == "set":
            evs[e[1]][e[2]] = e[3]
        elif e[0] == "del":
            evs[e[1]].pop(e[2], None)
        elif e[0] == "raw":
            lines[e[1]] = e[2].replace("\n", " ")
        elif e[0] == "dup":
            evs.insert(e[1], json.loads(json.dumps(evs[e[1]])))
            lines.insert(e[1], lines[e[1]])
        elif e[0] == "cut":
            cut = e[1]
        elif isinstance(evs[0].get("campaign"), dict):
            evs[0]["campaign"][e[1]] = e[2]
    text = "".join((raw if raw is not None else json.dumps(ev)) + "\n" for ev, raw in zip(evs, lines, strict=True))
    data = text.encode("utf-8", "surrogatepass")
    return data[: max(0, len(data) - cut)] if cut else data


def _events(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "o" / "journal.jsonl").read_text().splitlines()]


@SETTINGS
@given(data=st.data())
def test_fuzzed_journal_offline(recorded, data):
    evs = _events(recorded)
    blob = apply(evs, data.draw(journal_mutations(len(evs))))
    with tempfile.TemporaryDirectory(dir=recorded) as tmp:
        src = Path(tmp) / "c"
        src.mkdir()
        (src / "bundles").symlink_to(recorded / "c" / "bundles", target_is_directory=True)
        (src / "journal.jsonl").write_bytes(blob)
        before = snapshot(recorded / "c")
        rc, out, err = main("run", "--offline", str(src), "--out", str(Path(tmp) / "out"), "--quiet")
        kept_promise(rc, out, err)
        assert snapshot(recorded / "c") == before
        assert (src / "journal.jsonl").read_bytes() == blob
        assert sorted(p.name for p in Path(tmp).iterdir()) in (["c"], ["c", "out"])


@SETTINGS
@given(data=st.data())
def test_fuzzed_journal_resume(recorded, data):
    evs = _events(recorded)
    blob = apply(evs, data.draw(journal_mutations(len(evs))))
    with tempfile.TemporaryDirectory(dir=recorded) as tmp:
        d = Path(tmp) / "r"
        d.mkdir()
        (d / "journal.jsonl").write_bytes(blob)
        before = snapshot(recorded / "c")
        rc, out, err = main("run", "--resume", str(d), "--quiet")
        kept_promise(rc, out, err)
        assert snapshot(recorded / "c") == before
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["r"]
        after = (d / "journal.jsonl").read_bytes() if (d / "journal.jsonl").is_file() else b""
        assert after.startswith(blob[: blob.rfind(b"\n") + 1])  # no complete line is ever lost or changed
        if rc == 2 and "journal.jsonl" in err:  # a journal refused as it stands is kept byte for byte
            assert after == blob


# -- campaign files -------------------------------------------------------------------------------------------------

def toml_value(v) -> str:
    if v is None:
        return '""'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


BASE = {"source": "pallas", "target": "cute", "family": "gemm", "shape": "4096x4096x4096", "dtype": "bf16",
        "reference_knobs": {"kernel": "jax-hopper"}, "start_knobs": {"kernel": "naive"}}
SETTINGS_NAMES = ["source", "target", "family", "shape", "dtype", "gpu", "beam", "budget_min", "max_candidates",
                  "proposer", "command", "command_timeout_s", "reference_knobs", "start_knobs", "check_shape",
                  "noise_blocks", "runs_per_block", "rounds", "yardstick", "isolation", "bogus"]
setting_values = json_values | st.floats() | st.sampled_from(["4096x4096", "64x64x64", "m=1,n=2,k=3", "0x1x1",
                                                              "1x1x" + "9" * 300, "abc"])


@st.composite
def campaigns(draw):
    data = dict(BASE)
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(SETTINGS_NAMES))
        if draw(st.booleans()) and name in data:
            del data[name]
        else:
            data[name] = draw(setting_values)
    return data


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=campaigns())
def test_fuzzed_campaign_file(tmp_path_factory, data):
    from mosaic.errors import MosaicError
    from mosaic.run.campaign import Campaign, load_campaign

    text = "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items())
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "campaign.toml"
        f.write_text(text)
        try:
            c = load_campaign(f)
        except MosaicError as exc:
            assert "\n" not in exc.line() and exc.where is not None
            return
        assert isinstance(c, Campaign)
        again = Campaign.from_json(c.to_json())  # what a journal header records must read back the same
        assert again == c
        json.dumps(c.to_json(), allow_nan=False)


# -- bundle manifests -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def a_bundle(tmp_path_factory) -> Path:
    from mosaic.bundle import save_bundle
    from mosaic.records import KernelSpec

    root = tmp_path_factory.mktemp("manifest")
    spec = KernelSpec("gemm", {"m": 64, "n": 64, "k": 64}, "bf16", "cutlass", {"stages": 4})
    save_bundle(root / "b.bundle", kernel=spec, language="cutlass", gpu="h200",
                files={"kernel.sass": ("sass", (rf.CORPUS / "tma.sass").read_text()),
                       "timings.json": ("timings", json.dumps({"time_ns": 1000.0}))})
    return root / "b.bundle"


MANIFEST_PATHS = [("format",), ("schema_version",), ("kernel",), ("kernel", "family"), ("kernel", "dtype"),
                  ("kernel", "language"), ("kernel", "name"), ("kernel", "shape"), ("kernel", "shape", "m"), ("kernel", "knobs"), ("language",), ("gpu",),
                  ("toolchain",), ("files",), ("files", "kernel.sass"), ("files", "kernel.sass", "role"),
                  ("files", "kernel.sass", "sha256"), ("files", "kernel.sass", "size"), ("files", "../x"),
                  ("mosaic_run",), ("capture",), ("created",)]


@SETTINGS
@given(edits=st.lists(st.tuples(st.sampled_from(MANIFEST_PATHS), json_values | st.just("<delete>")), min_size=1,
                      max_size=3))
def test_fuzzed_manifest(a_bundle, edits):
    with tempfile.TemporaryDirectory() as tmp:
        b = Path(tmp) / "b.bundle"
        shutil.copytree(a_bundle, b)
        m = json.loads((b / "manifest.json").read_text())
        for path, value in edits:
            node = m
            for k in path[:-1]:
                if not isinstance(node, dict):
                    break
                node = node.setdefault(k, {})
            else:
                if isinstance(node, dict):
                    if value == "<delete>":
                        node.pop(path[-1], None)
                    else:
                        node[path[-1]] = value
        (b / "manifest.json").write_text(json.dumps(m))
        before = snapshot(Path(tmp))
        for args in (["bundle", "verify", str(b)], ["bundle", "show", str(b)], ["lift", str(b)]):
            kept_promise(*main(*args))
        assert snapshot(Path(tmp)) == before


@st.composite
def valid_looking_campaigns(draw):
    """Campaigns that parse, with settings a re-decision must cope with (knobs, limits, a smaller check shape)."""
    data = dict(BASE)
    knob_values = st.sampled_from([4, 5, 8, 0, -1, "naive", "hopper", "x", True, [128, 256], [1], None]) | json_values
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(["start_knobs", "reference_knobs", "beam", "budget_min", "max_candidates",
                                     "check_shape", "noise_blocks", "runs_per_block", "rounds", "yardstick", "gpu",
                                     "shape"]))
        if name in ("start_knobs", "reference_knobs"):
            data[name] = draw(st.dictionaries(st.sampled_from(["kernel", "stages", "tile_mn", "tile_k", "raster",
                                                               "persistent", "bogus"]), knob_values, max_size=3))
        elif name in ("beam", "max_candidates", "rounds", "runs_per_block"):
            data[name] = draw(st.integers(1, 50))
        elif name == "noise_blocks":
            data[name] = draw(st.sampled_from([10, 12, 20, 40]))
        elif name == "budget_min":
            data[name] = draw(st.floats(min_value=1e-6, max_value=1e6))
        elif name == "check_shape":
            data[name] = draw(st.sampled_from(["64x64x64", "32x24x16", "1x1x1"]))
        elif name == "shape":
            data[name] = draw(st.sampled_from(["4096x4096x4096", "64x64x64", "8192x4096x8192"]))
        elif name == "gpu":
            data[name] = draw(st.sampled_from(["h200", "h100-sxm", "b200", "nope"]))
        else:
            data[name] = draw(st.booleans())
    return data


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=valid_looking_campaigns())
def test_fuzzed_campaign_offline(recorded, data):
    text = "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items())
    with tempfile.TemporaryDirectory(dir=recorded) as tmp:
        src = Path(tmp) / "c"
        src.mkdir()
        (src / "bundles").symlink_to(recorded / "c" / "bundles", target_is_directory=True)
        (src / "campaign.toml").write_text(text)
        before = snapshot(recorded / "c")
        rc, out, err = main("run", "--offline", str(src), "--out", str(Path(tmp) / "out"), "--quiet")
        kept_promise(rc, out, err)
        assert snapshot(recorded / "c") == before
        assert sorted(p.name for p in Path(tmp).iterdir()) in (["c"], ["c", "out"])
