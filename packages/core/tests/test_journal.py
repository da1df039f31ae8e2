import json

import pytest
from mosaic.errors import BadInput
from mosaic.run.journal import FORMAT, NAME, Journal, JournalDiverged, read_journal


def _write(tmp_path, n=3):
    j = Journal.create(tmp_path)
    j.emit("campaign", format=FORMAT, version=1)
    for i in range(n):
        j.emit("verdict", key=f"k{i}", step=i, decision="accepted", reason_code="faster", t=float(i))
    j.close()
    return tmp_path / NAME


def test_every_event_is_one_flushed_line(tmp_path):
    path = _write(tmp_path)
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and [json.loads(x)["seq"] for x in lines] == [0, 1, 2, 3]
    events, torn = read_journal(path)
    assert torn is None and events[2]["key"] == "k1"


def test_torn_last_line_is_dropped_and_truncated_on_resume(tmp_path):
    path = _write(tmp_path)
    with open(path, "ab") as fh:
        fh.write(b'{"event": "verdict", "key": "k3", "st')  # what a kill -9 mid-write leaves
    events, torn = read_journal(path)
    assert len(events) == 4 and "torn" in torn
    j, torn2 = Journal.resume(tmp_path)
    assert torn2 and len(j.replay) == 4
    for e in j.replay:  # a resumed loop reproduces the recorded events first (not written again)
        j.emit(e["event"], **{k: v for k, v in e.items() if k not in ("event", "seq", "time")})
    j.emit("stop", stop="converged")
    j.close()
    events, torn = read_journal(path)
    assert torn is None and [e["event"] for e in events][-2:] == ["verdict", "stop"] and len(events) == 5


def test_damage_before_the_last_line_is_an_error(tmp_path):
    path = _write(tmp_path)
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:10]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BadInput, match="line 2"):
        read_journal(path)


def test_replay_detects_a_different_decision(tmp_path):
    _write(tmp_path)
    j, _ = Journal.resume(tmp_path)
    j.emit("campaign", format=FORMAT, version=1)
    with pytest.raises(JournalDiverged, match="decision"):
        j.emit("verdict", key="k0", step=0, decision="rejected", reason_code="slower")


def test_create_refuses_to_overwrite(tmp_path):
    _write(tmp_path)
    with pytest.raises(BadInput, match="resume"):
        Journal.create(tmp_path)
