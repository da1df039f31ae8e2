"""The static validator: a failing and a passing case for every code, totality, and the CLI."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mosaic.cli import main
from mosaic_amk.schedule import Buffer, Schedule, Task, Wait
from mosaic_amk.validate import CODES, RULES, validate, validate_rules
from mosaic_amk.validate.oracle import explore

ATTN = {"position": 3, "num_heads": 2, "num_kv_heads": 2, "head_dim": 4, "row_start": 0, "row_end": 8,
        "window": 0, "scale": 0.5, "page_tokens": 2}


def base() -> Schedule:
    """rmsnorm -> two row-split GEMV tasks (one shared counter) -> K and V appends -> attention -> add.
    Three SMs; the add reads h (written on its own SM earlier: ordered by queue order, no wait)."""
    gemv = {"bias": False, "residual": False}
    return Schedule(
        num_sms=3,
        buffers=(Buffer("x", "f32", (8,), "input"), Buffer("g", "f32", (8,), "weight"),
                 Buffer("w", "f32", (8, 8), "weight"), Buffer("h", "f32", (8,), "activation"),
                 Buffer("y", "f32", (8,), "activation"), Buffer("att", "f32", (8,), "activation"),
                 Buffer("kc", "f32", (4, 2, 8), "kv_cache"), Buffer("vc", "f32", (4, 2, 8), "kv_cache"),
                 Buffer("o", "f32", (8,), "output")),
        num_counters=6,
        tasks=(
            Task(0, "rmsnorm", 0, ("x", "g"), ("h",), (), 0, {"eps": 1e-5}),
            Task(1, "gemv", 1, ("h", "w"), ("y",), (Wait(0, 1),), 1, {**gemv, "row_start": 0, "row_end": 4},
                 {"w": (0, 4), "y": (0, 4)}),
            Task(2, "gemv", 2, ("h", "w"), ("y",), (Wait(0, 1),), 1, {**gemv, "row_start": 4, "row_end": 8},
                 {"w": (4, 8), "y": (4, 8)}),
            Task(3, "kv_append", 0, ("y",), ("kc",), (Wait(1, 2),), 2, {"position": 3, "page_tokens": 2},
                 {"kc": (1, 2)}),
            Task(4, "kv_append", 1, ("y",), ("vc",), (Wait(1, 2),), 3, {"position": 3, "page_tokens": 2},
                 {"vc": (1, 2)}),
            Task(5, "attention", 2, ("y", "kc", "vc"), ("att",), (Wait(1, 2), Wait(2, 1), Wait(3, 1)), 4, ATTN,
                 {"kc": (0, 2), "vc": (0, 2)}),
            Task(6, "add", 0, ("att", "h"), ("o",), (Wait(4, 1),), 5, {}),
        ),
        outputs=("o",))


def task(s: Schedule, i: int, **changes) -> Schedule:
    tasks = list(s.tasks)
    tasks[i] = attrs.evolve(tasks[i], **changes)
    return attrs.evolve(s, tasks=tuple(tasks))


def order(s: Schedule, ids: list[int]) -> Schedule:
    by = {t.id: t for t in s.tasks}
    return attrs.evolve(s, tasks=tuple(by[i] for i in ids))


def codes(s) -> set[str]:
    return validate(s).codes()


def test_base_is_safe_and_the_oracle_agrees():
    r = validate(base())
    assert r.ok and r.num_tasks == 7, r.lines()
    assert explore(base(), runs=12).safe


# ---- one failing case (and its passing twin) per code -----------------------------------------------------

@pytest.mark.parametrize("mutate, where", [
    (lambda s: task(s, 6, inputs=("att", "nope")), "task 6"),  # unknown buffer
    (lambda s: task(s, 1, params={"row_start": 0, "bias": False, "residual": False}), "task 1"),  # missing param
    (lambda s: task(s, 6, inputs=("att",)), "task 6"),  # bad arity
    (lambda s: task(s, 5, waits=(Wait(1, 2), Wait(9, 1), Wait(3, 1))), "task 5"),  # counter out of bounds
    (lambda s: task(s, 0, signal=-1), "task 0"),  # signal out of bounds
    (lambda s: task(s, 2, sm=3), "task 2"),  # SM out of bounds
    (lambda s: task(s, 3, id=2), "task 2"),  # duplicate id
    (lambda s: task(s, 6, outputs=("g",)), "task 6"),  # writes a weight
    (lambda s: task(s, 2, ranges={"w": (4, 8), "y": (4, 6)}), "task 2"),  # declared rows narrower than the op
    (lambda s: task(s, 2, params={"row_start": 4, "row_end": 9, "bias": False, "residual": False},
                    ranges={}), "task 2"),  # rows out of bounds
    (lambda s: task(s, 6, op="matmul"), "task 6"),  # unknown op
    (lambda s: attrs.evolve(s, outputs=("o", "ghost")), "schedule outputs"),
])
def test_malformed(mutate, where):
    r = validate(mutate(base()))
    assert "malformed" in r.codes(), r.lines()
    assert any(d.code == "malformed" and d.where == where for d in r.diagnostics), r.lines()


def test_capacity_and_its_limit():
    s = base()
    w = s.tasks[5].waits
    assert codes(task(s, 5, waits=w + w[:1] * 5)) == set()  # exactly 8 waits (repeats) is fine
    assert codes(task(s, 5, waits=w + w[:1] * 6)) == {"capacity"}
    r = validate(task(s, 6, inputs=("att",) * 9))
    assert "capacity" in r.codes() and "malformed" in r.codes()  # 9 slots, and add takes 2
    assert "capacity" in codes(task(s, 6, outputs=("o",) * 5))
    bufs = list(s.buffers)
    bufs[3] = Buffer("h", "f32", (8, 1, 1, 1, 1), "activation")
    assert "capacity" in codes(attrs.evolve(s, buffers=tuple(bufs)))
    bufs[3] = Buffer("h", "f32", (8, 1, 1, 1), "activation")
    assert "capacity" not in codes(attrs.evolve(s, buffers=tuple(bufs)))


@pytest.mark.parametrize("waits", [(Wait(4, 0),), (Wait(4, 2),), (Wait(1, 3),)])
def test_unsatisfiable_wait(waits):
    r = validate(task(base(), 6, waits=waits))
    assert "unsatisfiable-wait" in r.codes(), r.lines()
    assert r.by_code("unsatisfiable-wait")[0].where == "task 6"


def test_unsatisfiable_wait_no_producer():
    s = attrs.evolve(base(), num_counters=7)
    r = validate(task(s, 6, waits=(Wait(4, 1), Wait(6, 1))))
    assert r.codes() == {"unsatisfiable-wait"} and "no task signals" in r.diagnostics[0].message


def test_cycle_between_producers_and_consumers():
    s = task(base(), 0, waits=(Wait(5, 1),))  # the rmsnorm waits for the final add, which depends on it
    r = validate(s)
    assert "cycle" in r.codes(), r.lines()
    assert not explore(s, runs=4).safe


def test_self_wait_is_a_cycle():
    r = validate(task(base(), 5, waits=(*base().tasks[5].waits, Wait(4, 1))))
    assert [d.code for d in r.diagnostics] == ["cycle"] and r.diagnostics[0].where == "task 5"


def test_cycle_through_queue_order_across_sms():
    """SM0: [a waits for d, b]; SM1: [c waits for b, d]: no producer->consumer cycle, but a deadlock."""
    bufs = (Buffer("x", "f32", (4,), "input"), Buffer("o", "f32", (4,), "output"))
    t = lambda i, sm, waits: Task(i, "add", sm, ("x", "x"), ("o",), waits, i, {})  # noqa: E731
    s = Schedule(2, bufs, 4, (t(0, 0, (Wait(3, 1),)), t(1, 0, ()), t(2, 1, (Wait(1, 1),)), t(3, 1, ())), ("o",))
    assert "cycle" in codes(s)
    assert explore(s, runs=3).kinds() == {"deadlock"}


def test_queue_order_and_its_passing_twin():
    s = task(base(), 5, sm=0)  # attention on SM 0, before the add (SM 0) that waits on it: fine
    assert codes(s) == set()
    bad = order(s, [0, 1, 2, 3, 4, 6, 5])  # now the add is queued before its producer on SM 0
    r = validate(bad)
    assert "queue-order" in r.codes(), r.lines()
    assert r.by_code("queue-order")[0].where == "tasks 5, 6"
    assert explore(bad, runs=3).kinds() == {"deadlock"}


def test_list_order():
    s = order(base(), [0, 1, 2, 3, 4, 6, 5])  # add (SM 0) listed before attention (SM 2): not a cycle
    assert codes(s) == {"list-order"}
    assert explore(s, runs=6).safe  # the oracle cannot fault it: the code guards the contract


def three_way() -> Schedule:
    s = base()
    gemv = {"bias": False, "residual": False}
    rows = [(0, 3), (3, 6), (6, 8)]
    gem = [Task(10 + k, "gemv", k, ("h", "w"), ("y",), (Wait(0, 1),), 1, {**gemv, "row_start": a, "row_end": b},
                {"w": (a, b), "y": (a, b)}) for k, (a, b) in enumerate(rows)]
    rest = [attrs.evolve(t, waits=tuple(Wait(1, 3) if w.counter == 1 else w for w in t.waits)) for t in s.tasks[3:]]
    return attrs.evolve(s, tasks=(s.tasks[0], *gem, *rest))


def test_partial_join():
    assert codes(three_way()) == set()
    s = three_way()
    bad = task(s, 4, waits=(Wait(1, 2),))  # the K append (id 3) waits for 2 of the 3 GEMV row tasks
    r = validate(bad)
    assert "partial-join" in r.codes(), r.lines()
    assert r.by_code("partial-join")[0].where == "tasks 3, 10, 11, 12"


def test_first_of_n_threshold_orders_nothing():
    bad = task(base(), 4, waits=(Wait(1, 1),))  # 1 of 2 producers: not a partial join, but a racy read
    r = validate(bad)
    assert r.codes() == {"unordered-read"}, r.lines()
    assert not explore(bad, runs=12).safe


def test_unordered_read():
    bad = task(base(), 6, waits=())
    r = validate(bad)
    assert r.codes() == {"unordered-read"}
    assert r.diagnostics[0].where == "tasks 5, 6"
    assert explore(bad, runs=6).kinds() <= {"race", "uninitialized"} and not explore(bad, runs=6).safe


def test_read_of_rows_nothing_writes():
    s = attrs.evolve(base(), buffers=(*base().buffers, Buffer("junk", "f32", (8,), "scratch")))
    assert codes(task(s, 6, inputs=("att", "junk"))) == {"unordered-read"}


def test_kv_order():
    bad = task(base(), 5, waits=(Wait(1, 2), Wait(3, 1)))  # attention no longer waits for the K append
    r = validate(bad)
    assert r.codes() == {"kv-order"}, r.lines()
    assert r.diagnostics[0].where == "tasks 3, 5"
    assert not explore(bad, runs=12).safe


def test_unreachable_output():
    s = attrs.evolve(base(), buffers=(*base().buffers, Buffer("o2", "f32", (4,), "output")), outputs=("o", "o2"))
    assert codes(s) == {"unreachable-output"}
    assert codes(attrs.evolve(s, outputs=("o",))) == set()


def test_partly_written_output():
    s = task(base(), 6, op="gemv", inputs=("att", "w"), params={"row_start": 0, "row_end": 6, "bias": False,
                                                               "residual": False}, ranges={"o": (0, 6)})
    r = validate(s)
    assert r.codes() == {"unreachable-output"} and r.diagnostics[0].actual == [[6, 8]]


def test_write_race():
    bad = task(base(), 2, params={"row_start": 3, "row_end": 8, "bias": False, "residual": False},
               ranges={"w": (3, 8), "y": (3, 8)})
    r = validate(bad)
    assert "write-race" in r.codes(), r.lines()
    assert r.by_code("write-race")[0].where == "tasks 1, 2"
    assert not explore(bad, runs=6).safe


def test_every_code_is_documented_and_exercised():
    assert set(CODES) == {"malformed", "capacity", "unsatisfiable-wait", "cycle", "queue-order", "list-order",
                          "partial-join", "unordered-read", "kv-order", "unreachable-output", "write-race",
                          "page-oversubscribed", "page-unheld", "page-reuse", "page-fill-ahead"}  # test_pages.py


# ---- totality ---------------------------------------------------------------------------------------------

json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 12) | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=5), max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_validate_never_raises_on_junk(value):
    r = validate(value)
    assert not r.ok and r.codes() == {"malformed"}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_validate_never_raises_on_damaged_schedules(data):
    raw = base().to_json()
    task_dicts = list(raw["tasks"])  # damage these even if raw["tasks"] itself gets replaced
    for _ in range(data.draw(st.integers(1, 3))):
        target = raw if data.draw(st.booleans()) else task_dicts[data.draw(st.integers(0, 6))]
        key = data.draw(st.sampled_from(sorted(target)))
        target[key] = data.draw(json_values)
    validate(raw)  # must return, whatever it says


# ---- CLI --------------------------------------------------------------------------------------------------

def run_cli(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["amk", "validate", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_safe_unsafe_and_json(tmp_path, capsys):
    good = tmp_path / "good.json"
    base().save(good)
    code, out, _ = run_cli([str(good)], capsys)
    assert code == 0 and "safe (7 tasks)" in out
    bad = tmp_path / "bad.json"
    task(base(), 6, waits=()).save(bad)
    code, out, _ = run_cli([str(bad)], capsys)
    assert code == 1 and "[unordered-read] tasks 5, 6" in out and "UNSAFE" in out
    code, out, _ = run_cli([str(bad), "--json"], capsys)
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and data["diagnostics"][0]["code"] == "unordered-read"


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ('{"format": "mosaic-amk-schedule", "version": 7}', "unsupported schedule version 7"),
    ('{"format": "something-else", "version": 1}', "format tag"),
    ("\x00\xff\xfe", "not"),
])
def test_cli_not_a_schedule_exits_2_with_one_line(tmp_path, capsys, text, message):
    p = tmp_path / "s.json"
    p.write_bytes(text.encode("latin-1"))
    code, out, err = run_cli([str(p)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cli_structurally_broken_schedule_is_unsafe_not_a_crash(tmp_path, capsys):
    raw = base().to_json()
    raw["tasks"][2]["waits"] = [{"counter": "one"}]
    raw["buffers"][0]["dtype"] = "fp64"
    p = tmp_path / "s.json"
    p.write_text(json.dumps(raw))
    code, out, err = run_cli([str(p)], capsys)
    assert code == 1 and out.count("[malformed]") == 2 and "tasks[2] (task 2)" in out and not err


def test_cli_missing_file(tmp_path, capsys):
    code, _, err = run_cli([str(tmp_path / "nope.json")], capsys)
    assert code == 2 and err.startswith("error:")


def test_declared_rows_wider_than_the_write_do_not_count_as_written():
    """A GEMV that writes rows 0..4 but declares 0..8: rows 4..8 are still unwritten for its readers."""
    s = base()
    one = tuple(attrs.evolve(t, waits=tuple(Wait(1, 1) if w.counter == 1 else w for w in t.waits))
                for t in s.tasks if t.id != 2)
    s = attrs.evolve(s, tasks=one)
    assert codes(s) == {"unordered-read"}  # rows 4..8 of y: nothing writes them
    wide = task(s, 1, ranges={"w": (0, 8), "y": (0, 8)})
    assert codes(wide) == {"unordered-read"}
    assert explore(wide, runs=4).kinds() == {"uninitialized"}


def test_kv_append_must_write_a_kv_cache():
    bufs = list(base().buffers)
    bufs[6] = Buffer("kc", "f32", (4, 2, 8), "scratch")
    assert "malformed" in codes(attrs.evolve(base(), buffers=tuple(bufs)))


def test_the_rule_table_has_one_rule_per_code():
    """Rules as data: one rule function per diagnostic code, each code documented, none shared."""
    assert [r.code for r in RULES] == list(CODES)
    assert len({r.run for r in RULES}) == len(RULES) == len(CODES) == 15  # 11 + the 4 page rules
    assert all(r.run.__doc__ and r.doc == CODES[r.code] for r in RULES)


def test_every_rule_runs_and_reports_in_schedule_order():
    """Several codes at once: every rule runs (none stops the others) and the report keeps schedule
    order (every structural problem before any wait problem, whichever task it is on)."""
    s = task(task(base(), 6, sm=7), 5, waits=(Wait(counter=0, threshold=9),))
    r = validate_rules(s)
    assert {"malformed", "unsatisfiable-wait"} <= r.codes(), r.lines()
    assert validate(s).diagnostics == r.diagnostics
    first = [d.code for d in r.diagnostics]
    assert first.index("malformed") < first.index("unsatisfiable-wait")

