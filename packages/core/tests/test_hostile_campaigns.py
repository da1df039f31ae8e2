"""Hostile campaign directories, as a colleague's shared campaign would bring them: nothing they name is ever run
(``--offline`` never runs a proposer's program; ``--resume`` only with the user's consent), one run at a time per
directory, a journal never truncated past a complete event, no other campaign's report overwritten, and every
malformed journal or campaign refused with one line ``error: … (…)``. Every fixture is generated here."""

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402
import test_proposers as tp  # noqa: E402

MOSAIC = str(Path(sys.executable).parent / "mosaic")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "h200-pallas-to-cute-gemm-4096"


def main(*args) -> tuple[int, str, str]:
    """``mosaic ARGS`` in this process (fast): (exit status, stdout, stderr)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from mosaic.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            cli_main(list(args))
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue(), err.getvalue()


def one_error(rc, out, err, *needles, code=2):
    assert rc == code, (rc, out, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def marker_command(marker: Path) -> list[str]:
    """A proposer program that leaves a file behind if it is ever run (and then says it is done)."""
    return ["sh", "-c", f"id > {shlex.quote(str(marker))}; echo '{{\"done\": true}}'"]


def command_toml(marker: Path) -> str:
    return rf.CAMPAIGN_TOML + f'proposer = "command"\ncommand = {json.dumps(marker_command(marker))}\n'


def events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def write_events(path: Path, evs: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A campaign directory (bundles + campaign.toml) and its finished offline journal in DIR/o."""
    root = tmp_path_factory.mktemp("finished")
    src = rf.build_campaign(root / "c")
    rc, out, err = main("run", "--offline", str(src), "--out", str(root / "o"), "--quiet")
    assert rc == 0, err
    return root


def campaign_copy(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished / "c", tmp_path / "c")
    return tmp_path / "c"


# -- 1. nothing a campaign directory names is run -----------------------------------------------------------------

def test_offline_never_runs_the_command_a_campaign_toml_names(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    marker = tmp_path / "ran"
    (src / "campaign.toml").write_text(command_toml(marker))
    rc, out, err = main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet")
    assert rc == 0, err
    assert not marker.exists()
    assert "never runs it" in err and len(err.strip().splitlines()) == 1
    stop = events(tmp_path / "o" / "journal.jsonl")[-1]
    assert stop["event"] == "stop" and stop["stop"] == "exhausted"


def test_offline_never_runs_the_command_a_journal_header_names(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    marker = tmp_path / "ran"
    evs = events(finished / "o" / "journal.jsonl")
    evs[0]["campaign"].update(proposer="command", command=marker_command(marker))
    evs[0]["proposer"] = "command"
    first_verdict = next(i for i, e in enumerate(evs) if e["event"] == "verdict" and e["step"] == 0)
    write_events(src / "journal.jsonl", evs[: first_verdict + 1])  # recorded proposals run out after the naive
    rc, out, err = main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet")
    assert not marker.exists()
    assert rc in (0, 1) and "Traceback" not in err, err


def test_the_issue_repro_on_the_shipped_example_runs_nothing(tmp_path):
    src = tmp_path / "x"
    src.mkdir()
    shutil.copytree(EXAMPLE / "bundles", src / "bundles")
    marker = tmp_path / "x.id"
    (src / "campaign.toml").write_text(command_toml(marker))
    p = subprocess.run([MOSAIC, "run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert not marker.exists(), "the offline run executed the campaign's command"
    assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr


def test_offline_with_the_users_own_command_runs_it_and_only_for_a_command_campaign(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    (src / "campaign.toml").write_text(command_toml(tmp_path / "never"))
    mine = tmp_path / "mine"
    rc, out, err = main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet",
                        "--command", shlex.join(marker_command(mine)))
    assert rc == 0, err
    assert mine.exists() and not (tmp_path / "never").exists()
    knobs = campaign_copy(finished, tmp_path / "k")
    one_error(*main("run", "--offline", str(knobs), "--out", str(tmp_path / "o2"), "--command", "true"),
              "proposer is 'command'", "--command")


def _unfinished_agent_journal(tmp_path: Path, marker: Path) -> Path:
    """An offline campaign of the agent, cut after its first edit's verdict, whose header names a marker command."""
    src = tp.agent_campaign(tmp_path / "c")
    done = tp.run_agent(src, tmp_path / "agent.log", out=tmp_path / "o")
    assert done.returncode == 0, done.stderr
    evs = events(tmp_path / "o" / "journal.jsonl")
    cut = next(i for i, e in enumerate(evs) if e["event"] == "verdict" and e["step"] == 1)
    evs[0]["campaign"]["command"] = marker_command(marker)
    write_events(tmp_path / "o" / "journal.jsonl", evs[: cut + 1])
    for name in ("report.md", "report.json", "report.html"):
        (tmp_path / "o" / name).unlink()
    return tmp_path / "o"


def test_resume_runs_a_recorded_command_only_with_the_users_consent(tmp_path):
    marker = tmp_path / "ran"
    out = _unfinished_agent_journal(tmp_path, marker)
    before = (out / "journal.jsonl").read_bytes()
    line = one_error(*main("run", "--resume", str(out), "--quiet"), "--command", "--trust-command",
                     "journal.jsonl")
    assert "sh -c" in line and not marker.exists()
    assert (out / "journal.jsonl").read_bytes() == before  # nothing appended by a refused resume
    one_error(*main("run", "--resume", str(out), "--quiet", "--command", "sh -c 'echo other'"),
              "is not the journal's recorded command")
    assert not marker.exists()
    rc, so, err = main("run", "--resume", str(out), "--quiet", "--trust-command")
    assert rc == 0, err
    assert marker.exists()
    said = [ln for ln in err.splitlines() if "recorded command" in ln]
    assert len(said) == 1 and "confirmed by --trust-command" in said[0]


def test_resume_with_the_same_command_passed_again(tmp_path):
    marker = tmp_path / "ran"
    out = _unfinished_agent_journal(tmp_path, marker)
    p = subprocess.run([MOSAIC, "run", "--resume", str(out), "--quiet", "--command",
                        shlex.join(marker_command(marker))], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert marker.exists() and "confirmed by --command" in p.stderr


# -- 2. one run at a time, no event lost, no other campaign's report overwritten ----------------------------------

HOLD = """
import sys, time
from pathlib import Path
from mosaic.run.lock import campaign_lock
with campaign_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_run_on_a_locked_directory_is_refused_naming_the_holder(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    out = tmp_path / "o"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_error(*main("run", "--offline", str(src), "--out", str(out), "--quiet"),
                         f"pid {holder.pid}", "another mosaic run", str(out))
        assert "mosaic" in line
        assert not (out / "journal.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    rc, so, err = main("run", "--offline", str(src), "--out", str(out), "--quiet")  # released by the holder's death
    assert rc == 0, err


def test_two_offline_runs_at_once_through_the_entry_point(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    out = tmp_path / "o"
    args = [MOSAIC, "run", "--offline", str(src), "--out", str(out), "--quiet"]
    a = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = sorted([(p.wait(timeout=300), p.stderr.read()) for p in (a, b)])
    a.stdout.close()
    b.stdout.close()
    assert results[0][0] == 0, results
    rc, err = results[1]
    assert rc == 2 and ("another mosaic run" in err or "journal exists already" in err), results
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    seqs = [e["seq"] for e in events(out / "journal.jsonl")]
    assert seqs == list(range(len(seqs)))  # one run's journal, never two interleaved


def test_resume_of_a_locked_directory_is_refused(finished, tmp_path):
    shutil.copytree(finished / "o", tmp_path / "r")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "r")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        one_error(*main("run", "--resume", str(tmp_path / "r"), "--quiet"), f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()


def test_a_last_event_that_lost_only_its_newline_is_kept(finished, tmp_path):
    shutil.copytree(finished / "o", tmp_path / "r")
    journal = tmp_path / "r" / "journal.jsonl"
    whole = journal.read_bytes()
    journal.write_bytes(whole.rstrip(b"\n"))
    rc, out, err = main("run", "--resume", str(tmp_path / "r"), "--quiet")
    assert rc == 0 and "had finished" in out, err
    assert "torn" not in err
    assert journal.read_bytes() == whole  # the stop event kept, its line ended
    assert events(journal)[-1]["event"] == "stop"


def test_a_torn_last_line_is_still_dropped(finished, tmp_path):
    shutil.copytree(finished / "o", tmp_path / "r")
    journal = tmp_path / "r" / "journal.jsonl"
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"event": "timed", "key": "tr')
    rc, out, err = main("run", "--resume", str(tmp_path / "r"), "--quiet")
    assert rc == 0 and "torn" in err
    assert journal.read_bytes() == whole


def test_a_journal_header_without_its_campaign_is_refused_not_finished(finished, tmp_path):
    shutil.copytree(finished / "o", tmp_path / "r")
    journal = tmp_path / "r" / "journal.jsonl"
    evs = events(journal)
    del evs[0]["campaign"]
    write_events(journal, evs)
    rc, out, err = main("run", "--resume", str(tmp_path / "r"), "--quiet")
    one_error(rc, out, err, "journal line 1", "lacks field 'campaign'", "journal.jsonl")
    assert "finished" not in out


def test_another_campaigns_report_in_out_is_not_overwritten(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    (out / "report.md").write_text("# someone else's campaign\n")
    one_error(*main("run", "--offline", str(src), "--out", str(out), "--quiet"), "report.md", "another campaign",
              "--force", "fresh --out")
    assert (out / "report.md").read_text() == "# someone else's campaign\n"
    assert not (out / "journal.jsonl").exists() or not (out / "journal.jsonl").stat().st_size
    rc, so, err = main("run", "--offline", str(src), "--out", str(out), "--quiet", "--force")
    assert rc == 0, err
    assert (out / "report.md").read_text().startswith("# mosaic run:")


def test_a_report_symlink_planted_in_out_is_replaced_not_written_through(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "o"
    out.mkdir()
    (out / "report.html").symlink_to(victim)
    rc, so, err = main("run", "--offline", str(src), "--out", str(out), "--quiet", "--force")
    assert rc == 0, err
    assert victim.read_text() == "keep me\n" and not (out / "report.html").is_symlink()


def test_capture_force_replaces_only_a_bundle(tmp_path):
    precious = tmp_path / "results"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work\n")
    p = subprocess.run([MOSAIC, "capture", "--lang", "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype",
                        "bf16", "--lower-only", "--force", "-o", str(precious)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "not a bundle" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert (precious / "thesis.tex").read_text() == "years of work\n"
    (tmp_path / "file.bundle").write_text("x")
    one_error(*main("capture", "--lang", "cute", "--family", "gemm", "--shape", "64x64x64", "--dtype", "bf16",
                    "--lower-only", "--force", "-o", str(tmp_path / "file.bundle")), "is a file")
    assert (tmp_path / "file.bundle").read_text() == "x"


def test_out_that_is_a_file_is_refused(finished, tmp_path):
    src = campaign_copy(finished, tmp_path)
    (tmp_path / "o").write_text("not a directory\n")
    one_error(*main("run", "--offline", str(src), "--out", str(tmp_path / "o"), "--quiet"), "must be a directory")
    assert (tmp_path / "o").read_text() == "not a directory\n"
