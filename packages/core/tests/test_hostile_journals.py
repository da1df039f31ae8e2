"""Malformed campaign journals, campaign files and flags: each is refused with one line ``error: … (…)`` and exit 2
by ``mosaic run --offline``, ``--resume`` and the report, never a KeyError/IndexError/TypeError traceback and
nothing written. Every fixture is generated here from a recorded campaign (run_fixture)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402
from test_hostile_campaigns import EXAMPLE, MOSAIC, events, main, one_error  # noqa: E402


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("journals")
    src = rf.build_campaign(root / "c")
    rc, out, err = main("run", "--offline", str(src), "--out", str(root / "o"), "--quiet")
    assert rc == 0, err
    return root


def _first(evs, kind):
    return next(e for e in evs if e["event"] == kind)


def _set(kind, field, value):
    def edit(evs):
        _first(evs, kind)[field] = value
    return edit


def _drop(kind, field):
    def edit(evs):
        del _first(evs, kind)[field]
    return edit


def _line(index, text):
    """Replace journal line ``index`` (0-based; -1: the last) by raw text."""
    return ("raw", index, text)


# (name, edit of the event list or raw line, what the one error line must name)
CASES = [
    ("header-without-campaign", _drop("campaign", "campaign"), "lacks field 'campaign'"),
    ("header-campaign-is-text", _set("campaign", "campaign", "gemm"), "malformed field 'campaign'"),
    ("header-gpu-is-a-list", _set("campaign", "gpu", ["h200"]), "malformed field 'gpu'"),
    ("header-source-dir-is-a-number", _set("campaign", "source_dir", 5), "malformed field 'source_dir'"),
    ("header-campaign-lacks-shape", lambda evs: evs[0]["campaign"].pop("shape"), "campaign lacks shape"),
    ("header-campaign-start-knobs-text", lambda evs: evs[0]["campaign"].update(start_knobs="x"), "start_knobs"),
    ("header-campaign-family-list", lambda evs: evs[0]["campaign"].update(family=["gemm"]), "'family' must be a string"),
    ("proposal-step-is-text", _set("proposal", "step", "1"), "malformed field 'step'"),
    ("proposal-without-ok", _drop("proposal", "ok"), "lacks field 'ok'"),
    ("proposal-knobs-is-text", _set("proposal", "knobs", "xy"), "malformed field 'knobs'"),
    ("proposal-edit-row-is-text", lambda evs: _first(evs, "proposal").update(edit={"kind": "knob", "row": "r"}),
     "malformed field 'edit'"),
    ("reference-without-noise-blocks", _drop("reference", "noise_blocks"), "lacks field 'noise_blocks'"),
    ("reference-noise-blocks-empty-block", _set("reference", "noise_blocks", [[]]), "malformed field 'noise_blocks'"),
    ("reference-noise-is-a-list", _set("reference", "noise", [1, 2]), "malformed field 'noise'"),
    ("build-ok-is-text", _set("build", "ok", "yes"), "malformed field 'ok'"),
    ("numerics-without-passed", _drop("numerics", "passed"), "lacks field 'passed'"),
    ("timed-blocks-is-a-number", _set("timed", "incumbent_blocks", 5), "malformed field 'incumbent_blocks'"),
    ("verdict-without-key", _drop("verdict", "key"), "lacks field 'key'"),
    ("incumbent-time-is-text", _set("incumbent", "time_ns", "fast"), "malformed field 'time_ns'"),
    ("stop-remaining-is-text", _set("stop", "remaining", "x"), "malformed field 'remaining'"),
    ("stop-noise-is-null", _set("stop", "noise_ns", None), "malformed field 'noise_ns'"),
    ("yardstick-blocks-is-text", _set("yardstick", "blocks", "x"), "malformed field 'blocks'"),
    ("yardstick-unmeasured-without-reason",
     lambda evs: evs.insert(3, {"event": "yardstick-unmeasured", "key": "yardstick-cudnn", "yardstick": "cudnn",
                                "name": "cuDNN SDPA", "reason_code": "unavailable"}), "lacks field 'reason'"),
    ("stop-yardsticks-paired-lacks-times", _set("stop", "yardsticks_paired", [{"key": "yardstick", "name": "x",
                                                                               "yardstick": "x"}]),
     "malformed field 'yardsticks_paired'"),
    ("second-header", lambda evs: evs.insert(3, dict(evs[0])), "second campaign header"),
    ("event-is-a-list", _line(2, "[1, 2]"), "not an event object"),
    ("event-kind-is-a-number", _line(2, '{"event": 5}'), "not an event object"),
    ("nan-in-a-field", _line(2, '{"event": "reference", "time_ns": NaN}'), "NaN is not a JSON value"),
    ("nested-too-deep", _line(2, '{"event": "x", "a": ' + "[" * 500 + "]" * 500 + "}"), "levels is over the limit"),
    ("integer-of-5000-digits", _line(2, '{"event": "x", "a": ' + "9" * 5000 + "}"), "digits is over the limit"),
    ("damage-before-the-last-line", _line(2, '{"event": "refer'), "line 3 is not JSON"),
    ("not-a-mosaic-journal", _line(0, '{"event": "campaign", "format": "other"}'), "campaign header"),
]


def _hostile(finished: Path, tmp_path: Path, edit) -> list[str]:
    evs = events(finished / "o" / "journal.jsonl")
    lines = None
    if isinstance(edit, tuple):
        _, index, text = edit
        lines = [json.dumps(e) for e in evs]
        lines[index] = text
    else:
        edit(evs)
        lines = [json.dumps(e) for e in evs]
    return lines


@pytest.mark.parametrize("name, edit, needle", CASES, ids=[c[0] for c in CASES])
def test_malformed_journal_is_one_line_in_offline_and_resume(finished, tmp_path, name, edit, needle):
    text = "".join(x + "\n" for x in _hostile(finished, tmp_path, edit))
    src = tmp_path / "c"
    shutil.copytree(finished / "c", src)
    (src / "journal.jsonl").write_text(text)
    one_error(*main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"), needle, "journal.jsonl")
    assert not (tmp_path / "o" / "journal.jsonl").exists()
    resumed = tmp_path / "r"
    shutil.copytree(finished / "o", resumed)
    (resumed / "journal.jsonl").write_text(text)
    for name_ in ("report.md", "report.json", "report.html"):
        (resumed / name_).unlink()
    one_error(*main("run", "--resume", str(resumed), "--quiet"), needle, "journal.jsonl")
    assert (resumed / "journal.jsonl").read_text() == text  # a refused resume changes nothing
    assert not (resumed / "report.md").exists()


def test_report_of_a_malformed_journal_is_one_line(finished, tmp_path):
    from mosaic.errors import BadInput
    from mosaic.run.report import write_report

    shutil.copytree(finished / "o", tmp_path / "r")
    evs = events(tmp_path / "r" / "journal.jsonl")
    _first(evs, "stop")["remaining"] = [{"layer": 1}]
    (tmp_path / "r" / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    with pytest.raises(BadInput, match="malformed field 'remaining'"):
        write_report(tmp_path / "r")


# -- campaign files and flags ---------------------------------------------------------------------------------------

def _toml_with(line: str) -> str:
    key = line.split("=", 1)[0].strip()
    kept = [x for x in rf.CAMPAIGN_TOML.splitlines() if x.split("=", 1)[0].strip() != key]
    return "\n".join(kept) + "\n" + line + "\n"


@pytest.mark.parametrize("line, needle", [
    ('start_knobs = "x"', "'start_knobs' must be a table"),
    ('reference_knobs = [1, 2]', "'reference_knobs' must be a table"),
    ('family = ["gemm"]', "'family' must be a string"),
    ('source = 5', "'source' must be a string"),
    ('budget_min = nan', "budget_min=nan is invalid"),
    ('budget_min = inf', "budget_min=inf is invalid"),
    ('beam = 2.5', "beam=2.5 is invalid"),
    ('max_candidates = true', "max_candidates=True is invalid"),
    ('shape = 5', "'shape' must be a string"),
    ('shape = "ab"', "is not AxBxC"),
    ('check_shape = "1x1x' + "9" * 5000 + '"', "over the limit of 200"),
    ('shape = {m = 4096, n = 4096, k = 99999999999999999999}', "over the limit of 2**40"),
    ('command = [1, 2]', "'command' must be a command line or a list of strings"),
    ("command = \"sh -c 'unclosed\"", "not a command line"),
    ('isolation = ["step"]', "'isolation' must be a string"),
])
def test_malformed_campaign_file(tmp_path, line, needle):
    f = tmp_path / "c.toml"
    f.write_text(_toml_with(line))
    one_error(*main("run", str(f), "--out", str(tmp_path / "o")), needle, str(f))
    assert not (tmp_path / "o").exists()


LIVE = ["run", "--source", "pallas", "--target", "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16"]


@pytest.mark.parametrize("flags, needle", [
    (["--source", "nope"], "unknown language 'nope'; known: "),
    (["--target", "nope"], "unknown language 'nope'; known: "),
    (["--proposer", "magic"], "unknown proposer 'magic'; known: command, knobs"),
    (["--gpu", "nope"], "unknown gpu 'nope'; known: "),
    (["--budget-min", "nan"], "budget_min=nan is invalid"),
    (["--beam", "0"], "beam=0 is invalid"),
    (["--shape", "64x64x" + "9" * 5000], "over the limit of 200"),
    (["--shape", "64x64x99999999999999"], "over the limit of 2**40"),
])
def test_unknown_names_and_bad_numbers_exit_2_without_a_preview(tmp_path, flags, needle):
    args = LIVE + ["--out", str(tmp_path / "o")]
    for i in range(0, len(flags), 2):
        j = args.index(flags[i]) if flags[i] in args else None
        if j is None:
            args += flags[i:i + 2]
        else:
            args[j + 1] = flags[i + 1]
    rc, out, err = main(*args)
    one_error(rc, out, err, needle)
    assert "preview" not in out and not (tmp_path / "o" / "preview.md").exists()


def test_offline_and_command_flags(finished, tmp_path):
    one_error(*main("run", "--offline", str(finished / "c"), "--out", str(tmp_path / "o"), "--command", "'x"),
              "not a command line", "--command")
    shutil.copytree(finished / "o", tmp_path / "r")
    journal = tmp_path / "r" / "journal.jsonl"
    journal.write_text("".join(x + "\n" for x in journal.read_text().splitlines()[:8]))  # unfinished
    one_error(*main("run", "--resume", str(tmp_path / "r"), "--command", "python agent.py"), "proposer is 'knobs'")


# -- bundles inside a campaign, diff and capture --------------------------------------------------------------------

def test_a_tampered_bundle_inside_a_campaign_is_named(finished, tmp_path):
    src = tmp_path / "c"
    shutil.copytree(finished / "c", src)
    cand = sorted((src / "bundles").glob("cand-*.bundle"))[0]
    (cand / "kernel.sass").write_text("tampered\n")
    one_error(*main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"), "kernel.sass",
              str(cand))
    one_error(*main("diff", str(src / "bundles" / "reference.bundle"), str(cand)), "kernel.sass", str(cand))
    one_error(*main("lift", str(cand)), "kernel.sass", str(cand))


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m["mosaic_run"].update(cost_s="abc"), "mosaic_run.cost_s"),
    (lambda m: m["mosaic_run"].update(key=5), "mosaic_run.key must be a string"),
    (lambda m: m["mosaic_run"].update(build="ok"), "mosaic_run.build must be an object"),
])
def test_a_malformed_run_record_in_a_bundle_is_named(finished, tmp_path, edit, needle):
    src = tmp_path / "c"
    shutil.copytree(finished / "c", src)
    cand = sorted((src / "bundles").glob("cand-*.bundle"))[0]
    m = json.loads((cand / "manifest.json").read_text())
    edit(m)
    (cand / "manifest.json").write_text(json.dumps(m))
    one_error(*main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"), needle, str(cand))


def _timed_bundle(path: Path, timings) -> Path:
    from mosaic.bundle import save_bundle
    from mosaic.records import KernelSpec

    spec = KernelSpec("gemm", {"m": 64, "n": 64, "k": 64}, "bf16", "cutlass")
    sass = (rf.CORPUS / "tma.sass").read_text()
    save_bundle(path, kernel=spec, language="cutlass", gpu="h200",
                files={"kernel.sass": ("sass", sass), "timings.json": ("timings", json.dumps(timings))})
    return path


@pytest.mark.parametrize("timings", [
    {"time_ns": 1000.0, "noise": [1, 2]},
    {"time_ns": "fast"},
    [1, 2, 3],
    {"time_ns": 1000.0, "noise": {"value_ns": "x"}},
])
def test_diff_with_odd_timings_shows_what_it_can(tmp_path, timings):
    a = _timed_bundle(tmp_path / "a.bundle", timings)
    b = _timed_bundle(tmp_path / "b.bundle", {"time_ns": 2000.0, "noise": {"value_ns": 5.0}})
    rc, out, err = main("diff", str(a), str(b))
    assert rc == 0 and "Traceback" not in err, err
    assert "2.00 us (noise 0.01 us" in out


@pytest.mark.parametrize("flags, needle", [
    (["--timeout", "-1"], "--timeout -1.0 must be a positive number"),
    (["--timeout", "nan"], "--timeout nan must be a positive number"),
    (["--runs", "0"], "--runs 0 must be a positive integer"),
    (["--knob", "warp_drive=9"], "unknown knob(s) warp_drive for cute gemm; known: kernel"),
    (["--knob", "stages"], "not name=value"),
])
def test_capture_flags_exit_2(tmp_path, flags, needle):
    rc, out, err = main("capture", "--lang", "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16",
                        "--lower-only", "-o", str(tmp_path / "x.bundle"), *flags)
    one_error(rc, out, err, needle)
    assert not (tmp_path / "x.bundle").exists()


def test_capture_shape_with_5000_digits(tmp_path):
    one_error(*main("capture", "--lang", "cute", "--family", "gemm", "--shape", "64x64x" + "9" * 5000, "--dtype",
                    "bf16", "--lower-only", "-o", str(tmp_path / "x.bundle")), "over the limit of 200", "--shape")


def test_offline_of_the_example_without_its_target_plugin_names_the_plugin(tmp_path):
    import os

    env = {**os.environ, "MOSAIC_LOAD_PLUGINS": "pallas,hopper"}
    p = subprocess.run([MOSAIC, "run", "--offline", str(EXAMPLE), "--out", str(tmp_path / "o"), "--quiet"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "MISMATCH" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "target language 'cute' is not installed" in lines[0]
    assert "MOSAIC_LOAD_PLUGINS" in lines[0] and "mosaic-target-cute" in lines[0]
    assert not (tmp_path / "o").exists()


# -- one hostile case per verb through the installed `mosaic` entry point -------------------------------------------

def _verb_cases(finished: Path, tmp: Path) -> list[tuple[list[str], dict, str]]:
    src = tmp / "c"
    shutil.copytree(finished / "c", src)
    (src / "journal.jsonl").write_text('{"event": "campaign", "format": "mosaic-journal", "version": 1}\n')
    tampered = tmp / "t"
    shutil.copytree(finished / "c" / "bundles", tampered)
    cand = sorted(tampered.glob("cand-*.bundle"))[0]
    (cand / "kernel.sass").write_text("x\n")
    (tmp / "empty.bundle").mkdir()
    (tmp / "junk.sass").write_text("not a listing\n")
    return [
        (["run", "--offline", str(src), "--out", str(tmp / "o")], {}, "lacks field 'campaign'"),
        (["capture", "--lang", "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16", "--lower-only",
          "--timeout", "-1", "-o", str(tmp / "x.bundle")], {}, "--timeout"),
        (["check", "--family", "gemm", "--inputs", "/dev/zero", "--output", "/dev/zero", "--dtype", "bf16"], {},
         "not a regular file"),
        (["bundle", "verify", str(tmp / "empty.bundle")], {}, "no manifest.json"),
        (["bundle", "show", str(tmp / "empty.bundle")], {}, "no manifest.json"),
        (["lift", str(tmp / "junk.sass")], {}, "junk.sass"),
        (["diff", str(tampered / "reference.bundle"), str(cand)], {}, str(cand)),
        (["catalog", "--lang", "nope"], {}, "unknown language 'nope'"),
        (["gpus", "--bogus"], {}, "No such option"),
        (["plugins"], {"MOSAIC_LOAD_PLUGINS": "nope"}, "unknown plugin(s) nope"),
    ]


def test_one_hostile_case_per_verb_through_the_entry_point(finished, tmp_path):
    import os

    procs = []
    for args, env, needle in _verb_cases(finished, tmp_path):
        e = {**os.environ, **env}
        e.pop("MOSAIC_DEBUG", None)
        procs.append((args, needle, subprocess.Popen([MOSAIC, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                     text=True, env=e)))
    verbs = set()
    for args, needle, p in procs:
        out, err = p.communicate(timeout=300)
        one_error(p.returncode, out, err, needle)
        verbs.add(args[0])
    assert verbs == {"run", "capture", "check", "bundle", "lift", "diff", "catalog", "gpus", "plugins"}
    assert not (tmp_path / "o" / "journal.jsonl").exists() and not (tmp_path / "x.bundle").exists()


def test_manifest_kernel_spec_of_the_wrong_type_is_one_line(tmp_path):
    """kernel.shape = "ab" / kernel.knobs = "xy" (KernelSpec.from_json in records.py refuses them)."""
    from mosaic.bundle import save_bundle
    from mosaic.records import KernelSpec

    b = save_bundle(tmp_path / "b.bundle", kernel=KernelSpec("gemm", {"m": 8, "n": 8, "k": 8}, "bf16", "cutlass"),
                    language="cutlass", gpu="h200", files={"k.sass": ("sass", (rf.CORPUS / "tma.sass").read_text())})
    original = (b.root / "manifest.json").read_text()
    for field, value in (("shape", "ab"), ("knobs", "xy"), ("shape", [8, 8, 8])):
        m = json.loads(original)
        m["kernel"][field] = value
        (b.root / "manifest.json").write_text(json.dumps(m))
        for verb in (["bundle", "verify"], ["bundle", "show"], ["lift"]):
            one_error(*main(*verb, str(b.root)), f"KernelSpec.{field}=", "manifest.json")


@pytest.mark.parametrize("reply, needle", [
    ("[" * 5000 + "]" * 5000, "levels is over the limit"),
    ('{"knobs": {"stages": ' + "9" * 5000 + "}}", "digits is over the limit"),
    ('{"knobs": {"stages": NaN}}', "NaN is not a JSON value"),
])
def test_a_hostile_agent_reply_is_a_recorded_rejection(reply, needle):
    import test_proposers as tp
    from mosaic.proposers.command import parse_reply

    req = tp.request(rf.HOPPER, [])
    p = parse_reply(reply, req, {req.parent})
    assert not p.ok and needle in p.reason
