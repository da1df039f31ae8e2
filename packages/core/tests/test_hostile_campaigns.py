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
