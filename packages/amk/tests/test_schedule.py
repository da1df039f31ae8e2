"""The schedule IR records and the version-1 JSON interchange."""

from __future__ import annotations

import json

import pytest
from mosaic.errors import RecordError
from mosaic_amk.schedule import (
    FORMAT,
    Buffer,
    Schedule,
    ScheduleFormatError,
    Task,
    Wait,
    load_schedule,
    read_schedule_json,
)


def tiny() -> Schedule:
    return Schedule(
        num_sms=2,
        buffers=(Buffer("x", "f32", (4,), "input"), Buffer("g", "f32", (4,), "weight"),
                 Buffer("y", "f32", (4,), "activation"), Buffer("z", "f32", (4,), "output")),
        num_counters=2,
        tasks=(Task(0, "rmsnorm", 0, ("x", "g"), ("y",), (), 0, {"eps": 1e-5}),
               Task(1, "add", 1, ("y", "x"), ("z",), (Wait(0, 1),), 1, {}, {"z": (0, 4)})),
        outputs=("z",))


def test_json_round_trip_is_exactly_the_contract():
    s = tiny()
    data = json.loads(s.dumps())
    assert data["format"] == FORMAT and data["version"] == 1
    assert set(data) == {"format", "version", "num_sms", "buffers", "num_counters", "tasks", "outputs"}
    assert data["tasks"][1] == {"id": 1, "op": "add", "sm": 1, "inputs": ["y", "x"], "outputs": ["z"],
                                "waits": [{"counter": 0, "threshold": 1}], "signal": 1, "params": {},
                                "ranges": {"z": [0, 4]}}
    assert "ranges" not in data["tasks"][0]  # optional extra field: omitted when empty
    assert data["buffers"][0] == {"name": "x", "dtype": "f32", "shape": [4], "kind": "input"}
    assert Schedule.from_json(data) == s


def test_helpers():
    s = tiny()
    assert {c: [t.id for t in ts] for c, ts in s.producers().items()} == {0: [0], 1: [1]}
    assert [t.id for t in s.producers_of(1)] == [1]
    assert {sm: [t.id for t in q] for sm, q in s.queues().items()} == {0: [0], 1: [1]}
    assert s.buffer_map()["y"].rows == 4


def test_records_check_types_and_vocabularies():
    with pytest.raises(RecordError, match="dtype"):
        Buffer("x", "fp16", (4,), "input")
    with pytest.raises(RecordError, match="kind"):
        Buffer("x", "f32", (4,), "global")
    with pytest.raises(RecordError, match="threshold"):
        Wait(0, "1")
    with pytest.raises(RecordError, match="inputs"):
        Task(0, "add", 0, "x", ("y",), (), 0, {})


@pytest.mark.parametrize("text, message", [
    ("not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"format": "other", "version": 1}', "format tag"),
    ('{"format": "mosaic-amk-schedule", "version": 2}', "unsupported schedule version 2"),
    ('{"format": "mosaic-amk-schedule", "version": true}', "unsupported schedule version"),
])
def test_loader_rejects_what_is_not_a_schedule(tmp_path, text, message):
    p = tmp_path / "s.json"
    p.write_text(text)
    with pytest.raises(ScheduleFormatError, match=message) as exc:
        load_schedule(p)
    assert exc.value.exit_code == 2


def test_loader_strict_vs_raw(tmp_path):
    data = tiny().to_json()
    data["tasks"][0]["sm"] = "zero"
    p = tmp_path / "s.json"
    p.write_text(json.dumps(data))
    assert read_schedule_json(p)["tasks"][0]["sm"] == "zero"  # raw: the validator reports it
    with pytest.raises(ScheduleFormatError, match="Task.sm"):
        load_schedule(p)
    good = tmp_path / "good.json"
    tiny().save(good)
    assert load_schedule(good) == tiny()
