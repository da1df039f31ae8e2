"""The user cache: sections measured, least recently used entries trimmed to the cap (the oracle's references
after each write, nvcc builds), entries in use kept (the one just written, a live campaign's scratch, a write
in progress), a root that is not mosaic's left alone, and ``mosaic cache info|prune`` with one-line errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mosaic import user_cache as U
from mosaic.errors import BadInput
from mosaic.families import make_inputs
from mosaic.oracle import check
from mosaic.oracle.cache import ReferenceCache
from mosaic.records import KernelSpec
from mosaic.toolchain import nvcc


@pytest.fixture
def root(tmp_path, monkeypatch):
    r = tmp_path / "cache"
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(r))
    monkeypatch.delenv("MOSAIC_CACHE_MAX", raising=False)
    return r


def _entry(path: Path, nbytes: int, age_s: float) -> Path:
    """A directory entry of ``nbytes`` whose last use (its tree's newest mtime) was ``age_s`` ago."""
    path.mkdir(parents=True)
    (path / "data.bin").write_bytes(b"x" * nbytes)
    when = time.time() - age_s
    for p in (path / "data.bin", path):
        os.utime(p, (when, when))
    return path


def _names(entries) -> list[str]:
    return [f"{e.section}/{e.path.name}" for e in entries]


# -- sizes and the cap --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "n"), [("20GiB", 20 * 2**30), ("20G", 20 * 2**30), ("500MB", 500 * 10**6),
                                         ("1.5 TiB", int(1.5 * 2**40)), ("1048576", 2**20), ("64k", 65536),
                                         ("0", 0)])
def test_sizes(text, n):
    assert U.parse_size(text, "--max") == n


@pytest.mark.parametrize("text", ["banana", "", "-1G", "12 parsecs", "1e9", "GiB"])
def test_a_bad_size_is_one_line_naming_where(text):
    with pytest.raises(BadInput, match=r"is not a size") as err:
        U.parse_size(text, "MOSAIC_CACHE_MAX")
    assert err.value.where == "MOSAIC_CACHE_MAX" and "\n" not in err.value.line()


def test_the_cap_defaults_to_20_gib_and_can_be_off(monkeypatch):
    monkeypatch.delenv("MOSAIC_CACHE_MAX", raising=False)
    assert U.cache_cap() == U.DEFAULT_CAP == 20 * 2**30
    monkeypatch.setenv("MOSAIC_CACHE_MAX", "2GiB")
    assert U.cache_cap() == 2 * 2**30
    monkeypatch.setenv("MOSAIC_CACHE_MAX", "off")
    assert U.cache_cap() is None
    monkeypatch.setenv("MOSAIC_CACHE_MAX", "lots")
    with pytest.raises(BadInput, match="'lots' is not a size"):
        U.cache_cap()
    with pytest.raises(BadInput, match="'lots' is not a size"):  # the oracle's cache says so before computing
        ReferenceCache("/nonexistent")


# -- least recently used first ------------------------------------------------------------------------------------
def test_trim_removes_the_least_recently_used_entries_first_across_sections(root):
    _entry(root / "oracle" / "old", 1000, 5000)
    _entry(root / "cutlass" / "older", 1000, 9000)
    _entry(root / "oracle" / "new", 1000, 10)
    _entry(root / "members" / "ab" / "abcdef", 1000, 7000)  # members' entries are two deep
    c = U.UserCache(root, None)
    assert _names(c.entries("oracle")) == ["oracle/old", "oracle/new"]
    assert [e.path.name for e in c.entries("members")] == ["abcdef"]
    done = c.trim(1500)
    assert _names(done.removed) == ["cutlass/older", "members/abcdef", "oracle/old"]  # oldest use first
    assert (done.before, done.after, done.freed) == (4000, 1000, 3000)
    assert (root / "oracle" / "new").is_dir() and not (root / "members" / "ab").exists()  # emptied bucket gone
    assert (root / U.TAG).is_file()  # a root of mosaic's sections only is tagged as mosaic's


def test_a_touch_makes_an_entry_recent(root):
    a = _entry(root / "oracle" / "a", 1000, 9000)
    _entry(root / "oracle" / "b", 1000, 5000)
    U.touch(a)
    done = U.UserCache(root, None).trim(1000)
    assert _names(done.removed) == ["oracle/b"] and a.is_dir()


def test_trim_of_one_section_leaves_the_others(root):
    _entry(root / "cutlass" / "x", 5000, 9000)
    _entry(root / "oracle" / "a", 1000, 10)
    _entry(root / "oracle" / "b", 1000, 20)
    done = U.UserCache(root, None).trim(1000, section="oracle")
    assert _names(done.removed) == ["oracle/b"] and (root / "cutlass" / "x").is_dir()
    with pytest.raises(BadInput, match="no cache section 'nope'"):
        U.UserCache(root, None).trim(0, section="nope")


# -- in use ---------------------------------------------------------------------------------------------------------
def _scratch(root: Path, name: str, pid: int, age_s: float = 9000, host: str | None = None) -> Path:
    d = _entry(root / "scratch" / name, 1000, age_s)
    (d / U.OWNER).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname()}))
    os.utime(d / U.OWNER, (time.time() - age_s,) * 2)
    return d


def test_entries_in_use_are_kept_even_past_the_cap(root):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = _scratch(root, "aaaa-gpu0-live", os.getpid())
    gone = _scratch(root, "bbbb-gpu0-dead", dead.pid)
    elsewhere = _scratch(root, "cccc-gpu0-other", 1, age_s=60, host="another-host")
    writing = _entry(root / "oracle" / ".tmp-123", 1000, 60)  # an atomic write in progress
    kept = _entry(root / "oracle" / "just-written", 1000, 9999)
    done = U.UserCache(root, None).trim(0, keep=[kept])
    assert _names(done.removed) == ["scratch/bbbb-gpu0-dead"] and not gone.exists()
    why = {e.path.name: reason for e, reason in done.in_use}
    assert why == {"aaaa-gpu0-live": f"campaign process {os.getpid()} is running",
                   "cccc-gpu0-other": "campaign on another-host", ".tmp-123": "a write in progress",
                   "just-written": "in use by this process"}
    assert live.is_dir() and elsewhere.is_dir() and writing.is_dir() and kept.is_dir()


def test_a_root_that_is_not_mosaics_is_never_trimmed(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(home))  # a mistake: the cache pointed at a home directory
    _entry(home / "Documents" / "thesis", 10, 9000)
    mine = _entry(home / "checkpoints" / "my-own-model", 10**6, 9000)
    monkeypatch.setenv("MOSAIC_CACHE_MAX", "1")
    with pytest.raises(BadInput, match="not mosaic's: it holds Documents"):
        U.UserCache(home, 1).trim(0)
    assert U.after_write(mine) is None and mine.is_dir()
    (home / U.TAG).write_text(U.TAG_TEXT)  # once tagged, it is
    assert _names(U.UserCache(home, 1).trim(0).removed) == ["checkpoints/my-own-model"]
    assert (home / "Documents" / "thesis").is_dir()  # a directory that is no section of mosaic's stays


# -- the writers ----------------------------------------------------------------------------------------------------
def _gate(cache: ReferenceCache, spec: KernelSpec) -> None:
    import numpy as np
    from mosaic.oracle.formats import FORMATS

    inputs = make_inputs(spec, 0, "normal")
    out = FORMATS["bf16"].round(inputs["a"].astype(np.float64) @ inputs["b"]).astype(np.float32)
    assert check("gemm", inputs, {"c": out}, "bf16", cache=cache).passed


def test_the_oracle_cache_trims_to_the_cap_after_a_write_and_keeps_the_entry_in_use(root, monkeypatch):
    oracle = root / "oracle"
    shapes = [{"m": 64, "n": 32, "k": 48}, {"m": 64, "n": 64, "k": 48}, {"m": 128, "n": 32, "k": 48}]
    specs = [KernelSpec("gemm", s, "bf16", "numpy", {}) for s in shapes]
    for spec in specs[:2]:
        _gate(ReferenceCache(oracle), spec)
    first, second = sorted(oracle.iterdir(), key=lambda p: p.stat().st_mtime)
    for p, age in ((first, 9000), (second, 5000)):
        for f in [p, *p.iterdir()]:
            os.utime(f, (time.time() - age,) * 2)
    hit = ReferenceCache(oracle)
    _gate(hit, specs[0])  # a hit marks the older entry used: now the second is the least recently used
    assert hit.last["source"] == "cache-file"
    sizes = {e.path: e.bytes for e in U.UserCache(root, None).entries("oracle")}
    # room for two of them (the third's arrays are as large as the second's): one must go, the least recently used
    monkeypatch.setenv("MOSAIC_CACHE_MAX", str(sizes[first] + sizes[second] + 1000))
    third = ReferenceCache(oracle)
    _gate(third, specs[2])
    assert third.last["source"] == "computed" and third.last["stored"].startswith("stored; the user cache was trimmed")
    names = sorted(p.name for p in oracle.iterdir())
    assert second.name not in names and first.name in names and len(names) == 2
    monkeypatch.setenv("MOSAIC_CACHE_MAX", "1")  # below one entry: everything else goes, never the new one
    fourth = ReferenceCache(oracle)
    _gate(fourth, KernelSpec("gemm", {"m": 32, "n": 32, "k": 32}, "bf16", "numpy", {}))
    (left,) = oracle.iterdir()
    assert left.name == "gemm-bf16-bf16-a32x32_b32x32-plain" and (left / "key.json").is_file()
    assert fourth.last["entry"] == str(left)


def test_nvcc_build_cache_touches_on_a_hit_and_trims_after_a_build(root, monkeypatch):
    def make(nbytes):
        return lambda tmp: (tmp / "out.cubin").write_bytes(b"x" * nbytes)

    def complete(d):
        return (d / "out.cubin").is_file()

    a, b = root / "cutlass" / "a", root / "cutlass" / "b"
    nvcc.build_cached(a, make(1000), complete=complete)
    nvcc.build_cached(b, make(1000), complete=complete)
    for p, age in ((a, 9000), (b, 5000)):
        for f in (p / "out.cubin", p):
            os.utime(f, (time.time() - age,) * 2)
    assert nvcc.build_cached(a, make(1000), complete=complete) is True  # a hit: a is now the recent one
    monkeypatch.setenv("MOSAIC_CACHE_MAX", "2500")
    nvcc.build_cached(root / "cutlass" / "c", make(1000), complete=complete)
    assert sorted(p.name for p in (root / "cutlass").iterdir()) == ["a", "c"]


def test_scratch_is_per_process_and_a_dead_campaigns_is_swept(root, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = _scratch(root, "dddd-gpu0-1", dead.pid)
    s = U.make_scratch(tmp_path / "campaign", "gpu0")
    assert s.parent == root / "scratch" and s.name.endswith(f"-gpu0-{os.getpid()}") and not stale.exists()
    owner = json.loads((s / U.OWNER).read_text())
    assert owner["pid"] == os.getpid() and owner["campaign"] == str((tmp_path / "campaign").resolve())
    U.remove_scratch(s)
    assert not s.exists()


# -- mosaic cache info | prune -------------------------------------------------------------------------------------
def mosaic(*args, **env):
    e = {**os.environ, "MOSAIC_LOAD_PLUGINS": "", **env}
    e.pop("MOSAIC_DEBUG", None)
    return subprocess.run([sys.executable, "-c", "from mosaic.cli import main; main()", *args],
                          capture_output=True, text=True, env=e, timeout=120)


def test_cache_info_and_prune(root):
    _entry(root / "oracle" / "gemm-old", 3000, 9000)
    _entry(root / "oracle" / "gemm-new", 2000, 10)
    _entry(root / "cutlass" / "build1", 1000, 5000)
    env = {"MOSAIC_CACHE_DIR": str(root), "MOSAIC_CACHE_MAX": "4KB"}
    info = mosaic("cache", "info", **env)
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    assert lines[0] == f"root   {root}" and lines[1] == "cap    3.9 KiB (MOSAIC_CACHE_MAX)"
    assert any(ln.split()[:3] == ["oracle", "4.9", "KiB"] and ln.split()[3] == "2" for ln in lines)
    assert "over the cap by" in info.stdout
    data = json.loads(mosaic("cache", "info", "--json", **env).stdout)
    sections = {s["name"]: s for s in data["sections"]}
    assert data["total"] == 6000 and data["cap"] == 4000 and sections["cutlass"]["entries"] == 1
    assert sections["oracle"]["bytes"] == 5000 and sections["scratch"]["entries"] == 0
    pruned = mosaic("cache", "prune", **env)  # to the cap: the oldest goes
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.splitlines()[0] == "removed oracle/gemm-old  2.9 KiB"
    assert "1 entry removed, 3,000 bytes (2.9 KiB) freed" in pruned.stdout
    pruned = mosaic("cache", "prune", "--section", "oracle", "--all", **env)
    assert "removed oracle/gemm-new" in pruned.stdout and "2,000 bytes" in pruned.stdout
    assert (root / "cutlass" / "build1").is_dir() and list((root / "oracle").iterdir()) == []
    pruned = mosaic("cache", "prune", "--max", "0", "--json", **env)
    assert json.loads(pruned.stdout)["freed"] == 1000 and not (root / "cutlass" / "build1").exists()


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--max", "banana"], {}, "error: 'banana' is not a size (e.g. 20GiB, 500MB, 1.5T or a number of bytes) (--max)"),
    (["--section", "nope"], {}, "error: no cache section 'nope'"),
    (["--all", "--max", "1G"], {}, "error: --all and --max cannot be given together (mosaic cache prune)"),
    ([], {"MOSAIC_CACHE_MAX": "huge"}, "error: 'huge' is not a size"),
    ([], {"MOSAIC_CACHE_MAX": "off"}, "error: the cap is off (MOSAIC_CACHE_MAX=off)"),
])
def test_cache_prune_bad_input_is_one_line_and_exit_2(root, args, env, message):
    _entry(root / "oracle" / "keep-me", 100, 9000)
    r = mosaic("cache", "prune", *args, MOSAIC_CACHE_DIR=str(root), **env)
    assert r.returncode == 2 and r.stderr.startswith(message) and len(r.stderr.splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and (root / "oracle" / "keep-me").is_dir()
