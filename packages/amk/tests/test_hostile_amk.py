"""Hostile AMK input, as a shared schedule, config or checkpoint would bring it: every case is refused with
one line ``error: … (…)`` and exit 2 (or an honest exit 1 for an unsafe schedule), never a traceback, no
unbounded memory or time. Each fixture is generated here, not committed."""

import json
import random
import tracemalloc

import pytest
from mosaic.cli import main

from mosaic_amk.validate import validate, validate_rules
from mosaic_amk.validate.clocks import inclusive_clocks, slots_of
from mosaic_amk.validate.facts import Facts


def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["amk", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def refused(capsys, args, *needles, rc=2) -> str:
    """Exit ``rc``, one ``error:`` line on stderr naming every needle, no traceback."""
    code, out, err = cli(capsys, *args)
    assert code == rc, (code, out, err)
    assert "Traceback" not in out + err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def chain(n: int, kind: str = "fanout", nsm: int = 132) -> dict:
    """A safe dependency chain: task i waits for task i-1 (its own counter). ``fanout``: every task also
    reads x0, written by task 0 (ordered only transitively, through the whole chain); ``pingpong``: two
    buffers overwritten in turn (write-after-read, ordered transitively)."""
    bufs = [{"name": "inp", "dtype": "f32", "shape": [4], "kind": "input"}]
    tasks = []
    if kind == "pingpong":
        bufs += [{"name": f"x{k}", "dtype": "f32", "shape": [4], "kind": "activation"} for k in (0, 1)]
        for i in range(n):
            a = "inp" if i == 0 else f"x{(i - 1) % 2}"
            tasks.append({"id": i, "op": "add", "sm": i % nsm, "inputs": [a, "inp"], "outputs": [f"x{i % 2}"],
                          "waits": [] if i == 0 else [{"counter": i - 1, "threshold": 1}], "signal": i,
                          "params": {}})
        out = f"x{(n - 1) % 2}"
    else:
        bufs += [{"name": f"x{i}", "dtype": "f32", "shape": [4], "kind": "activation"} for i in range(n)]
        for i in range(n):
            ins = ["inp", "inp"] if i == 0 else [f"x{i - 1}", "x0"]
            tasks.append({"id": i, "op": "add", "sm": i % nsm, "inputs": ins, "outputs": [f"x{i}"],
                          "waits": [] if i == 0 else [{"counter": i - 1, "threshold": 1}], "signal": i,
                          "params": {}})
        out = f"x{n - 1}"
    return {"format": "mosaic-amk-schedule", "version": 1, "num_sms": nsm, "buffers": bufs,
            "num_counters": n, "tasks": tasks, "outputs": [out]}


# -- 1. schedule files are read through mosaic.limits --------------------------------------------------------

def test_validate_dev_zero_is_refused_without_reading(capsys):
    refused(capsys, ["validate", "/dev/zero"], "not a regular file", "/dev/zero")


def test_validate_a_directory_and_a_missing_file(tmp_path, capsys):
    refused(capsys, ["validate", str(tmp_path)], "directory")
    refused(capsys, ["validate", str(tmp_path / "nope.json")], "no such file")


@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000, "nested"),  # RecursionError in the parser
    ("[" * 70 + "]" * 70, "nesting"),  # over the depth limit, parses
    ('{"format": "mosaic-amk-schedule", "version": 1, "num_sms": ' + "9" * 5000 + "}", "digits"),
    ('{"format": "mosaic-amk-schedule", "version": 1, "num_sms": NaN}', "NaN"),
    ('{"format": "mosaic-amk-schedule", "version": 1, "num_sms": -Infinity}', "Infinity"),
    ('{"format": "mosaic-amk-schedule", "version": 1, "meta": {"a": "' + "[" * 500 + '"}}', None),
])
def test_hostile_schedule_json_is_one_line(tmp_path, capsys, text, needle):
    p = tmp_path / "s.json"
    p.write_text(text)
    code, out, err = cli(capsys, "validate", str(p))
    assert "Traceback" not in out + err
    if needle is None:  # brackets inside a string are no nesting: an (unsafe) schedule, not a refusal
        assert code in (1, 2)
        return
    refused(capsys, ["validate", str(p)], needle, str(p))


def test_schedule_over_the_task_limit_is_refused(tmp_path, capsys, monkeypatch):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(chain(50)))
    code, out, _ = cli(capsys, "validate", str(p))
    assert code == 0 and "safe (50 tasks)" in out
    monkeypatch.setenv("MOSAIC_LIMIT_SCHEDULE_TASKS", "49")
    refused(capsys, ["validate", str(p)], "50 tasks is over the limit of 49 tasks", "MOSAIC_LIMIT_SCHEDULE_TASKS")


def test_schedule_file_over_the_size_limit_is_refused(tmp_path, capsys, monkeypatch):
    p = tmp_path / "s.json"
    p.write_text(json.dumps(chain(5)))
    monkeypatch.setenv("MOSAIC_LIMIT_TEXT_BYTES", "100")
    refused(capsys, ["validate", str(p)], "over the limit of 100 bytes")


# -- 2. the validator is linear in a dependency chain -----------------------------------------------------------

def _old_pred_bits(f: Facts) -> list[int]:
    """The bitset definition of happens-before (pred[i], a Python int per task): the reference the vector
    clocks must equal (quadratic memory, so only for small schedules here)."""
    tasks, prods, ncnt = f.tasks, f.prods, f.s.num_counters
    pred, last_on = [0] * f.n, {}
    for i, t in enumerate(tasks):
        prev = last_on.get(t.sm)
        acc = (pred[prev] | (1 << prev)) if prev is not None else 0
        last_on[t.sm] = i
        for w in t.waits:
            c, th = w.counter, w.threshold
            p = prods.get(c) if 0 <= c < ncnt else None
            if th < 1 or not p or th > len(p):
                continue
            if th == len(p):
                v = 0
                for j in p:
                    v |= pred[j] | (1 << j)
            else:
                v = -1
                for j in p:
                    v &= pred[j] | (1 << j)
            acc |= v
        pred[i] = acc
    return pred


def _random_dag(rng: random.Random, n: int) -> dict:
    nsm, ncnt = rng.randint(1, 4), rng.randint(1, 6)
    sig = [rng.randrange(ncnt) for _ in range(n)]
    tasks = []
    for i in range(n):
        waits = []
        for _ in range(rng.randint(0, 2)):
            earlier = [c for c in set(sig[:i])]
            if earlier:
                c = rng.choice(earlier)
                total = sig.count(c)
                waits.append({"counter": c, "threshold": rng.choice([1, total, max(1, total - 1)])})
        # producers of a waited counter must all be earlier: drop waits on counters signalled later
        waits = [w for w in waits if w["counter"] not in sig[i:]]
        tasks.append({"id": i, "op": "add", "sm": rng.randrange(nsm), "inputs": ["inp", "inp"],
                      "outputs": [f"y{i}"], "waits": waits, "signal": sig[i], "params": {}})
    bufs = [{"name": "inp", "dtype": "f32", "shape": [4], "kind": "input"}]
    bufs += [{"name": f"y{i}", "dtype": "f32", "shape": [4], "kind": "activation"} for i in range(n)]
    return {"format": "mosaic-amk-schedule", "version": 1, "num_sms": nsm, "buffers": bufs,
            "num_counters": ncnt, "tasks": tasks, "outputs": []}


def test_vector_clocks_equal_the_bitset_happens_before():
    from mosaic_amk.schedule import Schedule

    rng = random.Random(7)
    for _ in range(300):
        s = Schedule.from_json(_random_dag(rng, rng.randint(1, 24)))
        f = Facts(s)
        assert not f.backward and not f.self_waits
        pred = _old_pred_bits(f)
        sms = [t.sm for t in s.tasks]
        slot = slots_of(sms)
        clocks = list(inclusive_clocks(sms, [t.signal for t in s.tasks],
                                       [[(w.counter, w.threshold) for w in t.waits] for t in s.tasks],
                                       s.num_counters, slot))
        for i in range(f.n):
            for j in range(f.n):
                want = j == i or bool((pred[i] >> j) & 1)
                assert (clocks[i][slot[sms[j]]] >= j) == want, (i, j)


@pytest.mark.parametrize("kind", ["fanout", "pingpong"])
def test_a_long_chain_validates_safe_in_linear_memory(kind):
    raw = chain(30_000, kind)
    tracemalloc.start()
    try:
        result = validate(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok, result.lines()[:3]
    # the bitset happens-before held ~n^2/8 bytes twice over (225 MB here); clocks are a few per live task
    assert peak < 120 * 2**20, peak


def test_a_race_at_the_end_of_a_long_chain_is_still_found():
    raw = chain(20_000, "fanout")
    raw["tasks"][-1]["waits"] = []  # the last task no longer waits for its input's writer
    got = validate(raw)
    assert got.codes() == {"unordered-read"}
    assert got.lines() == validate_rules(raw).lines()
    assert "tasks 19998, 19999" in got.lines()[0]
