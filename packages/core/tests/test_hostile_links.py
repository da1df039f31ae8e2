"""Symlinks planted in a campaign directory, as a hostile colleague's shared campaign (or a shared /tmp) would bring
them: a write of a campaign directory never follows a link (``offline/``, the journal, the lock and its holder,
the reports, the preview, a temporary file's name), and a read of a campaign's bundles stays inside the directory
given (``bundles/`` or a bundle that is a link, a journal header's ``source_dir`` elsewhere, a recorded bundle
path outside). A refused path is one line ``error: … (…)`` and exit 2, and nothing is written outside. Every
fixture is generated here (run_fixture)."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402
from test_hostile_campaigns import MOSAIC, events, main, one_error, write_events  # noqa: E402, F401


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A recorded campaign in DIR/c (bundles + campaign.toml) and its finished offline journal in DIR/o."""
    root = tmp_path_factory.mktemp("links")
    src = rf.build_campaign(root / "c")
    rc, out, err = main("run", "--offline", str(src), "--out", str(root / "o"), "--quiet")
    assert rc == 0, err
    return root


def campaign_copy(finished: Path, tmp_path: Path, name: str = "c") -> Path:
    shutil.copytree(finished / "c", tmp_path / name)
    return tmp_path / name


def empty_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def victim(path: Path, text: str = "keep me\n") -> Path:
    path.write_text(text)
    return path


# -- writes: the campaign directory and every file in it ----------------------------------------------------------

def test_a_planted_offline_link_is_refused_and_nothing_lands_where_it_points(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    elsewhere = empty_dir(tmp_path / "elsewhere")
    (src / "offline").symlink_to(elsewhere)
    one_error(*main("run", "--offline", str(src), "--quiet"), "symlink", "offline")
    assert list(elsewhere.iterdir()) == []  # no journal, no report, no lock


def test_an_out_or_resume_directory_that_is_a_link_is_refused(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    elsewhere = empty_dir(tmp_path / "elsewhere")
    (tmp_path / "o").symlink_to(elsewhere)
    one_error(*main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"), "symlink")
    assert list(elsewhere.iterdir()) == []
    shutil.copytree(finished / "o", tmp_path / "real")
    before = sorted(p.name for p in (tmp_path / "real").iterdir())
    (tmp_path / "r").symlink_to(tmp_path / "real")
    one_error(*main("run", "--resume", str(tmp_path / "r"), "--quiet"), "symlink")
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == before


def test_a_dangling_journal_link_is_refused_not_created_through(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    outside = empty_dir(tmp_path / "outside")
    empty_dir(src / "offline")
    (src / "offline" / "journal.jsonl").symlink_to(outside / "journal.jsonl")  # dangling: exists() is False
    one_error(*main("run", "--offline", str(src), "--quiet"), "journal.jsonl", "symlink")
    assert list(outside.iterdir()) == []
    out = empty_dir(tmp_path / "o")  # the same through --out
    (out / "journal.jsonl").symlink_to(outside / "journal.jsonl")
    one_error(*main("run", "--offline", str(src), "--out", str(out), "--quiet"), "journal.jsonl", "symlink")
    assert list(outside.iterdir()) == [] and not (out / "report.md").exists()


def test_a_journal_link_is_never_resumed_or_appended_through(finished, tmp_path):
    shutil.copytree(finished / "o", tmp_path / "real")
    theirs = tmp_path / "real" / "journal.jsonl"
    evs = events(theirs)
    cut = next(i for i, e in enumerate(evs) if e["event"] == "verdict" and e["step"] == 1)
    write_events(theirs, evs[: cut + 1])  # an unfinished campaign a resume would append to
    before = theirs.read_bytes()
    r = empty_dir(tmp_path / "r")
    (r / "journal.jsonl").symlink_to(theirs)
    one_error(*main("run", "--resume", str(r), "--quiet"), "journal.jsonl", "symlink")
    assert theirs.read_bytes() == before and not (r / "report.md").exists()


def test_a_planted_lock_link_is_refused_and_its_target_left_whole(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    target = victim(tmp_path / "precious.txt")
    out = empty_dir(tmp_path / "o")
    (out / ".mosaic-run.lock").symlink_to(target)
    one_error(*main("run", "--offline", str(src), "--out", str(out), "--quiet"), ".mosaic-run.lock", "symlink")
    assert target.read_text() == "keep me\n" and not (out / "journal.jsonl").exists()


def test_links_planted_at_temporary_file_names_are_never_written_through(finished, tmp_path):
    """The holder file and the reports were written to ``.NAME.<pid>.tmp`` first: a name anyone can guess."""
    src = campaign_copy(finished, tmp_path)
    out = empty_dir(tmp_path / "o")
    pid = os.getpid()  # main() runs in this process
    planted = {f"..mosaic-run.holder.json.{pid}.tmp": victim(tmp_path / "v-holder"),
               f".report.md.{pid}.tmp": victim(tmp_path / "v-md"),
               f".report.json.{pid}.tmp": victim(tmp_path / "v-json"),
               f".report.html.{pid}.tmp": victim(tmp_path / "v-html")}
    for name, target in planted.items():
        (out / name).symlink_to(target)
    rc, so, err = main("run", "--offline", str(src), "--out", str(out), "--quiet")
    assert rc == 0, err
    for target in planted.values():
        assert target.read_text() == "keep me\n", target
    for name in ("report.md", "report.json", "report.html"):
        assert (out / name).is_file() and not (out / name).is_symlink()
    assert json.loads((out / "report.json").read_text())["format"] == "mosaic-run-report"


def test_preview_files_that_are_links_are_replaced_not_written_through(tmp_path):
    from mosaic.run.campaign import Campaign
    from mosaic.run.preview import run_preview

    out = empty_dir(tmp_path / "d")
    md, js = victim(tmp_path / "v.md"), victim(tmp_path / "v.json")
    (out / "preview.md").symlink_to(md)
    (out / "preview.json").symlink_to(js)
    campaign = Campaign.from_json({"source": "pallas", "target": "cute", "family": "gemm",
                                   "shape": "1024x1024x1024", "dtype": "bf16"})
    run_preview(campaign, out, "test: no device", lambda line: None)
    assert md.read_text() == "keep me\n" and js.read_text() == "keep me\n"
    assert not (out / "preview.md").is_symlink() and (out / "preview.md").read_text().startswith("# mosaic run")
    assert json.loads((out / "preview.json").read_text())["format"] == "mosaic-run-preview"


def _has_gpu():
    from mosaic.gpus import probe_devices

    return bool(probe_devices()[0])


@pytest.mark.skipif(_has_gpu(), reason="the preview runs only without a GPU")
@pytest.mark.parametrize("planted", ["bundles", "bundles/reference.bundle"])
def test_a_preview_bundle_directory_that_is_a_link_is_refused(tmp_path, planted):
    out = empty_dir(tmp_path / "d")
    elsewhere = empty_dir(tmp_path / "elsewhere")
    marker = victim(elsewhere / "keep.txt")
    (out / planted).parent.mkdir(parents=True, exist_ok=True)
    (out / planted).symlink_to(elsewhere)
    rc, so, err = main("run", "--source", "pallas", "--target", "cute", "--family", "gemm", "--shape",
                       "4096x4096x4096", "--dtype", "bf16", "--out", str(out), "--quiet")
    said = "\n".join(ln for ln in err.splitlines() if not ln.startswith("no GPU here"))  # always said
    one_error(rc, so, said, "symlink", planted.split("/")[-1])
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"] and marker.read_text() == "keep me\n"


# -- reads: a campaign's bundles stay inside the directory given ---------------------------------------------------

def test_a_bundles_link_outside_the_campaign_is_refused(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    shutil.move(src / "bundles", theirs / "bundles")
    (src / "bundles").symlink_to(theirs / "bundles")
    one_error(*main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"), "bundles", "symlink")
    assert not (tmp_path / "o" / "journal.jsonl").exists()


def test_a_bundle_that_is_a_link_outside_the_campaign_is_refused(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    theirs = empty_dir(tmp_path / "theirs")
    name = next(p.name for p in sorted((src / "bundles").glob("cand-*.bundle")))
    shutil.move(src / "bundles" / name, theirs / name)
    (src / "bundles" / name).symlink_to(theirs / name)
    one_error(*main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"), name, "symlink")
    assert not (tmp_path / "o" / "journal.jsonl").exists()


def _unfinished(finished: Path, tmp_path: Path) -> Path:
    """The finished offline journal cut after step 1's verdict (a killed re-decision), in tmp_path/r."""
    r = tmp_path / "r"
    shutil.copytree(finished / "o", r)
    evs = events(r / "journal.jsonl")
    cut = next(i for i, e in enumerate(evs) if e["event"] == "verdict" and e["step"] == 1)
    write_events(r / "journal.jsonl", evs[: cut + 1])
    for name in ("report.md", "report.json", "report.html"):
        (r / name).unlink()
    return r


def test_a_resume_never_follows_a_source_dir_that_points_elsewhere(finished, tmp_path):
    r = _unfinished(finished, tmp_path)
    evs = events(r / "journal.jsonl")
    other = campaign_copy(finished, tmp_path, "other")  # someone else's campaign: not the bundles re-decided
    manifest = other / "bundles" / "reference.bundle" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "note": "another campaign"}))
    evs[0]["source_dir"] = str(other)
    write_events(r / "journal.jsonl", evs)
    before = (r / "journal.jsonl").read_bytes()
    one_error(*main("run", "--resume", str(r), "--quiet"), "source_dir", str(other), "journal.jsonl")
    assert (r / "journal.jsonl").read_bytes() == before and not (r / "report.md").exists()
    evs[0]["source_dir"] = str(finished / "c")  # the journal's own source: resumed to its end
    write_events(r / "journal.jsonl", evs)
    rc, so, err = main("run", "--resume", str(r), "--quiet")
    assert rc == 0, err
    assert events(r / "journal.jsonl")[-1]["event"] == "stop"


def test_a_resume_reads_recorded_bundles_only_inside_the_campaign(finished, tmp_path):
    """A recorded bundle path (the reference's, a build's) that names a directory outside is never read: the
    bundle of that name in the campaign's own bundles/ is."""
    r = _unfinished(finished, tmp_path)
    bait = empty_dir(tmp_path / "outside" / "reference.bundle")
    (bait / "manifest.json").write_text("{not json")  # a read of it would fail, naming it
    evs = events(r / "journal.jsonl")
    next(e for e in evs if e["event"] == "reference")["bundle"] = str(bait)
    for e in evs:
        if e["event"] == "build" and e.get("bundle"):
            e["bundle"] = str(tmp_path / "outside" / Path(e["bundle"]).name)
    write_events(r / "journal.jsonl", evs)
    rc, so, err = main("run", "--resume", str(r), "--quiet")
    assert rc == 0, err
    assert str(tmp_path / "outside") not in so + err
    assert events(r / "journal.jsonl")[-1]["event"] == "stop"
