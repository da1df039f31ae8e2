"""The page protocol (issue #36, docs/amk-schedule.md "Pages"): the IR (pools, fills, uses, releases) and its JSON,
the lowering switch (ScheduleConfig.pages), the four page rules with their codes, the oracle's page observations
(a reuse race, a read of an unfilled page, a fill that reads data not yet written), the audit's page classes and the
CLI. A schedule without pages validates as before (test_validator, test_validate_fast_path)."""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from mosaic.cli import main
from mosaic.gpus import DEFAULT_GPU
from mosaic.plugins import host
from mosaic_amk.config import ScheduleConfig
from mosaic_amk.lowering import GEMV_FAMILY, lower
from mosaic_amk.reference_vm import ReferenceVM
from mosaic_amk.schedule import (
    Buffer,
    PageFill,
    PagePool,
    Schedule,
    Task,
    TaskPages,
    Wait,
    load_schedule,
    row_bytes,
)
from mosaic_amk.tiny_models import TINY_FAMILIES, tiny_model
from mosaic_amk.validate import validate, validate_rules
from mosaic_amk.validate.audit import MUTATORS, PAGE_CLASSES, RULE_CLASSES, bases_for, real_lowerings
from mosaic_amk.validate.oracle import execute, explore
from mosaic_amk.validate.screen import screen_records

GPU = host().get("gpus", DEFAULT_GPU)
PAGED = ScheduleConfig(pages=2, page_bytes=1024, num_sms=4, gemv_rows_per_task=8)
G = {"bias": False, "residual": False}


def _add(t: Task, acquire=(), use=(), release=()) -> Task:
    pg = t.pages or TaskPages()
    return attrs.evolve(t, pages=TaskPages(pg.acquire + tuple(acquire), pg.use + tuple(use), pg.release + tuple(release)))


FIRST_RELEASE = (Wait(0, 1),)


def two_fills(refill_waits=FIRST_RELEASE) -> Schedule:
    """SM 0 runs two GEMV row tasks; one page; the loader fills it with each task's weight rows; the refill waits on
    the first task's counter (its release). SM 1 adds the result."""
    bufs = (Buffer("x", "f32", (4,), "input"), Buffer("w", "f32", (4, 4), "weight"),
            Buffer("y", "f32", (4,), "activation"), Buffer("o", "f32", (4,), "output"))
    t0 = Task(0, "gemv", 0, ("x", "w"), ("y",), (), 0, {**G, "row_start": 0, "row_end": 2},
              {"w": (0, 2), "y": (0, 2)}, pages=TaskPages((PageFill(0, "w", (0, 2)),), (0,), (0,)))
    t1 = Task(1, "gemv", 0, ("x", "w"), ("y",), (), 1, {**G, "row_start": 2, "row_end": 4},
              {"w": (2, 4), "y": (2, 4)}, pages=TaskPages((PageFill(0, "w", (2, 4), refill_waits),), (0,), (0,)))
    t2 = Task(2, "add", 1, ("y", "x"), ("o",), (Wait(0, 1), Wait(1, 1)), 2, {})
    return Schedule(2, bufs, 3, (t0, t1, t2), ("o",), page_pools=(PagePool(0, 1, 32),))


def stale_page() -> Schedule:
    """A fill of an activation (ordered after its writer), read by two tasks of SM 1; between them SM 0 writes the
    activation again (ordered after the first reader, before the second): the page holds data older than the
    second reader's."""
    bufs = (Buffer("x", "f32", (4,), "input"), Buffer("a", "f32", (4,), "activation"),
            Buffer("b", "f32", (4,), "activation"), Buffer("o", "f32", (4,), "output"))
    return Schedule(2, bufs, 4, (
        Task(0, "add", 0, ("x", "x"), ("a",), (), 0, {}),
        Task(1, "add", 1, ("a", "x"), ("b",), (Wait(0, 1),), 1, {},
             pages=TaskPages((PageFill(0, "a", (0, 4), (Wait(0, 1),)),), (0,))),
        Task(2, "add", 0, ("x", "b"), ("a",), (Wait(1, 1),), 2, {}),
        Task(3, "add", 1, ("a", "x"), ("o",), (Wait(2, 1),), 3, {}, pages=TaskPages((), (0,), (0,)))),
        ("o",), page_pools=(PagePool(0, 1, 16), PagePool(1, 1, 16)))


def kinds(s: Schedule, runs: int = 8) -> set[str]:
    return explore(s, runs=runs).kinds()


# ---- IR --------------------------------------------------------------------------------------------------------

def test_page_fields_round_trip_and_are_absent_without_pages(tmp_path):
    s = two_fills()
    data = json.loads(s.dumps())
    assert data["page_pools"] == [{"sm": 0, "count": 1, "page_bytes": 32}]
    assert data["tasks"][1]["pages"] == {"acquire": [{"page": 0, "buffer": "w", "rows": [2, 4],
                                                      "waits": [{"counter": 0, "threshold": 1}]}],
                                         "use": [0], "release": [0]}
    assert Schedule.from_json(data) == s and load_schedule(s.save(tmp_path / "s.json")) == s
    plain = lower(tiny_model("llama"), ScheduleConfig(num_sms=4), GPU, 3)
    text = plain.dumps()
    assert '"pages"' not in text and '"page_pools"' not in text and not plain.has_pages()
    assert "pages" not in plain.meta["config"]  # the config's JSON is the one of earlier configs
    assert s.has_pages() and row_bytes("f32", (4, 4)) == 16 and row_bytes("q4_1", (3, 64)) == 40


def test_validate_routes_page_schedules_to_the_rule_table():
    s = two_fills()
    assert not screen_records(s)
    assert validate(s).diagnostics == validate_rules(s).diagnostics == ()
    raw = json.loads(s.dumps())
    assert validate(raw).ok and validate(raw).diagnostics == validate_rules(raw).diagnostics


# ---- lowering ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_models_lower_with_pages_and_validate(family):
    model = tiny_model(family)
    fused = ScheduleConfig(pages=3, page_bytes=2048, num_sms=6, gemv_rows_per_task=16, kv_page_tokens=4,
                           fusion=["residual", "gate_up_silu", "rope_append", "rmsnorm_gemv", "gemv_rope_append",
                                   "split_kv", "split_argmax"], sm_policy="least_loaded")
    for cfg in (PAGED, fused):
        s = lower(model, cfg, GPU, 5)
        assert s.page_pools == tuple(PagePool(sm, cfg.pages, cfg.page_bytes) for sm in range(s.num_sms))
        gemvs = [t for t in s.tasks if t.op in GEMV_FAMILY]
        paged = [t for t in gemvs if t.pages and t.pages.use]
        assert len(paged) >= len(gemvs) // 2, (len(paged), len(gemvs))
        assert all(t.pages.use == t.pages.release for t in paged)  # the reader releases its page
        refills = [f for t in s.tasks if t.pages for f in t.pages.acquire if f.waits]
        assert refills  # the ring wraps: pages are reused, each refill ordered after the previous reader
        assert validate(s).ok, validate(s).lines()[:3]
        assert explore(s, runs=6).safe


def test_pages_change_no_numbers():
    model = tiny_model("qwen2")
    plain = ReferenceVM(model, ScheduleConfig(num_sms=4, gemv_rows_per_task=8), GPU)
    paged = ReferenceVM(model, PAGED, GPU)
    assert plain.generate([1, 5, 9], 4) [0] == paged.generate([1, 5, 9], 4)[0]
    from mosaic_amk.validate.oracle import interleaving

    assert paged.generate([1, 5, 9], 4, executor=interleaving(3, "pct"))[0] == plain.generate([1, 5, 9], 4)[0]


def test_smollm2_135m_shaped_lowers_and_validates_with_pages(tmp_path):
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.tiny_models import SMOLLM2_135M, make_checkpoint

    spec = import_checkpoint(make_checkpoint(tmp_path / "smollm2-135m", config=SMOLLM2_135M))
    s = lower(spec, ScheduleConfig(pages=4, page_bytes=16384), GPU, 37)
    fills = [f for t in s.tasks if t.pages for f in t.pages.acquire]
    assert len(s.page_pools) == s.num_sms == GPU.sm_count and len(fills) > 1000
    r = validate(s)
    assert r.ok, r.lines()[:3]
    # one interleaving of the oracle, without the footprint probe (it runs every full-size op on random data once,
    # minutes here; the page observations do not depend on it)
    from mosaic_amk.validate import oracle

    assert oracle._run(oracle._Loaded(s, probe=False), 1, "random", None, True).safe


# ---- the rules and the oracle ------------------------------------------------------------------------------------

def test_a_planted_page_reuse_race_is_rejected_and_caught_by_the_oracle():
    assert validate(two_fills()).ok and explore(two_fills()).safe
    race = two_fills(refill_waits=())  # the refill no longer waits for the first reader's release
    r = validate(race)
    assert r.codes() == {"page-reuse"}, r.lines()
    assert "not ordered after task(s) [0]" in r.lines()[0]
    for seed in range(12):  # every interleaving: the refill before or after the first read
        for strategy in ("random", "priority", "pct"):
            ex = execute(race, seed=seed, strategy=strategy)
            assert {f.kind for f in ex.findings} == {"page-race"}, (seed, strategy, ex.findings)
    # on a real lowering: a refill loses its wait
    s = lower(tiny_model("llama"), PAGED, GPU, 5)
    i, k = next((i, k) for i, t in enumerate(s.tasks) if t.pages for k, f in enumerate(t.pages.acquire) if f.waits)
    t = s.tasks[i]
    acq = list(t.pages.acquire)
    acq[k] = attrs.evolve(acq[k], waits=())
    tasks = list(s.tasks)
    tasks[i] = attrs.evolve(t, pages=attrs.evolve(t.pages, acquire=tuple(acq)))
    planted = attrs.evolve(s, tasks=tuple(tasks))
    assert validate(planted).codes() == {"page-reuse"}
    assert "page-race" in kinds(planted)


def test_a_page_still_held_cannot_be_acquired_again():
    s = two_fills()
    tasks = list(s.tasks)
    tasks[0] = attrs.evolve(tasks[0], pages=TaskPages((PageFill(0, "w", (0, 2)),), (0,)))  # no release
    r = validate(attrs.evolve(s, tasks=tuple(tasks)))
    assert r.codes() == {"page-reuse"} and "still holds it" in r.lines()[0]


def test_use_of_a_page_not_acquired_or_released_is_unheld():
    s = two_fills()
    tasks = list(s.tasks)
    tasks[2] = attrs.evolve(tasks[2], sm=0, waits=(Wait(1, 1),), pages=TaskPages((), (0,)))  # after task 1's release
    after = attrs.evolve(s, tasks=tuple(tasks))
    r = validate(after)
    assert r.codes() == {"page-unheld"} and "after task 1 released it" in r.lines()[0]
    assert "page-unfilled" in kinds(after)
    tasks = list(s.tasks)
    tasks[0] = attrs.evolve(tasks[0], pages=TaskPages((), (0,), (0,)))  # its fill moved to task 1: used first
    tasks[1] = _add(tasks[1], acquire=(PageFill(0, "w", (0, 2)),))
    before = attrs.evolve(s, tasks=tuple(tasks))
    assert {"page-unheld"} <= validate(before).codes()
    assert "no task of SM 0 acquired before it" in validate(before).lines()[0]
    assert kinds(before) & {"page-unfilled", "page-race"}
    tasks = list(s.tasks)
    tasks[2] = attrs.evolve(tasks[2], pages=TaskPages((), (), (0,)))  # SM 1 releases a page it never held
    assert validate(attrs.evolve(s, tasks=tuple(tasks))).codes() == {"page-unheld"}


def test_more_pages_or_bytes_than_the_pool_is_oversubscribed():
    s = two_fills()
    tasks = list(s.tasks)
    tasks[1] = attrs.evolve(tasks[1], pages=TaskPages((PageFill(1, "w", (2, 4), (Wait(0, 1),)),), (1,), (1,)))
    two = attrs.evolve(s, tasks=tuple(tasks))  # a second page in a one-page pool
    r = validate(two)
    assert r.codes() == {"page-oversubscribed"} and "more pages than SM 0's pool holds" in r.lines()[0]
    assert kinds(two) == {"fault"}
    assert validate(attrs.evolve(two, page_pools=(PagePool(0, 2, 32),))).ok
    small = attrs.evolve(s, page_pools=(PagePool(0, 1, 31),))
    assert validate(small).codes() == {"page-oversubscribed"} and kinds(small) == {"fault"}
    huge = attrs.evolve(s, page_pools=(PagePool(0, 64, 4096),))
    assert validate(huge).codes() == {"page-oversubscribed"} and kinds(huge) == {"fault"}
    none = attrs.evolve(s, page_pools=())
    assert validate(none).codes() == {"page-oversubscribed"} and "without a page pool" in validate(none).lines()[0]


def test_a_fill_running_ahead_of_its_data_is_rejected_and_caught():
    s = stale_page()
    ahead = attrs.evolve(s, tasks=(s.tasks[0], attrs.evolve(s.tasks[1], pages=TaskPages(
        (PageFill(0, "a", (0, 4)),), (0,))), *s.tasks[2:]))  # the fill no longer waits on a's writer
    r = validate(ahead)
    assert r.codes() == {"page-fill-ahead"} and "may run ahead of writer(s) [0]" in r.lines()[0], r.lines()
    assert "fill-unwritten" in kinds(ahead)
    r = validate(s)  # the writer between the fill and its second reader
    assert r.codes() == {"page-fill-ahead"} and "run between the fill of page 0" in r.lines()[0], r.lines()
    assert kinds(s) == {"fill-unwritten"}
    fixed = attrs.evolve(s, tasks=(s.tasks[0], _add(s.tasks[1], release=(0,)), s.tasks[2], attrs.evolve(
        s.tasks[3], pages=TaskPages((PageFill(0, "a", (0, 4), (Wait(2, 1),)),), (0,), (0,)))))  # refilled after it
    assert validate(fixed).ok and explore(fixed).safe


def test_fill_waits_obey_the_wait_rules():
    s = two_fills()
    bad = lambda *ws: attrs.evolve(s, tasks=(s.tasks[0], attrs.evolve(s.tasks[1], pages=TaskPages(  # noqa: E731
        (PageFill(0, "w", (2, 4), ws),), (0,), (0,))), s.tasks[2]))
    ok = Wait(0, 1)  # the refill's own wait (its release): kept, so each case breaks one rule
    assert validate(bad(ok, Wait(0, 2))).codes() == {"unsatisfiable-wait"}
    assert validate(bad(ok, Wait(9, 1))).codes() == {"malformed"}
    assert validate(bad(*([ok] * 9))).codes() == {"capacity"}
    assert validate(bad(ok, Wait(1, 1))).codes() == {"list-order"}  # produced by the acquiring task itself
    assert kinds(bad(ok, Wait(0, 2))) == {"deadlock"} and kinds(bad(ok, Wait(9, 1))) == {"fault"}
    assert kinds(bad(*([ok] * 9))) == {"fault"}


# ---- the audit and the oracle's independence ----------------------------------------------------------------------

def test_every_page_rule_has_a_class_and_each_class_breaks_that_rule_alone():
    bases = [s for _, s in real_lowerings(families=("llama", "qwen2"), quick=True)]
    assert {RULE_CLASSES[c] for c in ("page-oversubscribed", "page-unheld", "page-reuse", "page-fill-ahead")} \
        == set(PAGE_CLASSES)
    for code in ("page-oversubscribed", "page-unheld", "page-reuse", "page-fill-ahead"):
        name = RULE_CLASSES[code]
        pool = bases_for(name, bases)
        assert pool and all(s.has_pages() for s in pool)
        rejected = unsafe = 0
        for k in range(25):
            rng = random.Random(f"pages/{name}/{k}")
            m = MUTATORS[name](pool[rng.randrange(len(pool))], rng)
            assert m is not None
            r, v = validate(m), explore(m, runs=8)
            assert r.ok or r.codes() == {code}, (name, k, r.lines()[:3])
            assert r.ok <= v.safe, (name, k, v.findings)  # no false accept
            rejected += not r.ok
            unsafe += not v.safe
        assert rejected > 0 and unsafe > 0, (name, rejected, unsafe)


def test_the_oracle_observes_pages_without_the_validator(tmp_path):
    """oracle.py imports nothing of mosaic_amk.validate, and sees the planted page problems with every validator
    module made unimportable."""
    path = Path(__import__("mosaic_amk.validate.oracle", fromlist=["x"]).__file__)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("mosaic_amk.validate"), ast.dump(node)
    files = {name: str(s.save(tmp_path / f"{name}.json")) for name, s in
             (("safe", two_fills()), ("race", two_fills(refill_waits=())), ("stale", stale_page()))}
    code = f"""
import importlib.abc, importlib.util, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mosaic_amk.validate" or name.startswith("mosaic_amk.validate."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
spec = importlib.util.spec_from_file_location("standalone_oracle", {str(path)!r})
oracle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oracle)
from mosaic_amk.schedule import load_schedule
files = {files!r}
assert oracle.explore(load_schedule(files["safe"]), runs=6).safe
assert oracle.explore(load_schedule(files["race"]), runs=6).kinds() == {{"page-race"}}
assert oracle.explore(load_schedule(files["stale"]), runs=6).kinds() == {{"fill-unwritten"}}
assert not [m for m in sys.modules if m.startswith("mosaic_amk.validate")]
print("independent")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "independent" in out.stdout, out.stderr[-3000:]


# ---- CLI -----------------------------------------------------------------------------------------------------------

def test_validate_cli_prints_the_page_diagnostics(tmp_path, capsys):
    good = two_fills().save(tmp_path / "good.json")
    bad = two_fills(refill_waits=()).save(tmp_path / "race.json")
    with pytest.raises(SystemExit) as exc:
        main(["amk", "validate", str(good)])
    assert exc.value.code == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["amk", "validate", str(bad)])
    assert exc.value.code == 1
    out = capsys.readouterr()
    assert "[page-reuse] tasks 0, 1: the fill of page 0 of SM 0 is not ordered after task(s) [0]" in out.out + out.err
    with pytest.raises(SystemExit) as exc:
        main(["amk", "validate", str(bad), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert exc.value.code == 1 and [d["code"] for d in data["diagnostics"]] == ["page-reuse"]
