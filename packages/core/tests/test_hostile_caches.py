"""Hostile caches (issue #35): a cache entry is believed only while every file in it still hashes to the
manifest written with it, in directories only this user can write.

* a poisoned ``expected`` array in the oracle cache is noticed, the entry discarded and the reference
  recomputed: an all-zero output then fails the oracle, as without a cache;
* a tampered nvcc build (``libkernel.so`` with bytes changed), an entry without a manifest, a group-writable
  file or an entry that is a symbolic link is rebuilt, with one warning line naming it;
* a world-writable cache directory is refused with one warning line: nothing is read from it (not even an
  entry whose manifest matches) and nothing is written to it;
* the normal hit still hits, and what the caches create is mode 0700.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from mosaic.families import make_inputs
from mosaic.oracle import check
from mosaic.oracle.cache import ReferenceCache
from mosaic.oracle.formats import FORMATS
from mosaic.records import KernelSpec
from mosaic.toolchain import nvcc

SPEC = KernelSpec("gemm", {"m": 64, "n": 32, "k": 48}, "bf16", "numpy", {})
MANIFEST = "integrity.json"


def _good(inputs):
    return {"c": FORMATS["bf16"].round(inputs["a"].astype(np.float64) @ inputs["b"]).astype(np.float32)}


def _zeros():
    return {"c": np.zeros((64, 32), np.float32)}


def _reseal(entry: Path, key: str) -> None:
    """What a writer of the directory could do: a manifest that matches the planted content (when the code
    under test writes manifests at all)."""
    try:
        from mosaic.cache_integrity import seal
    except ImportError:  # the code before manifests: nothing to forge
        return
    (entry / MANIFEST).unlink(missing_ok=True)
    seal(entry, key)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _warnings(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


# -- the oracle's float64 references ------------------------------------------------------------------------------
def test_a_poisoned_expected_array_is_recomputed_and_an_all_zero_output_then_fails(tmp_path, capsys):
    inputs = make_inputs(SPEC, 0, "normal")
    assert not check("gemm", inputs, _zeros(), "bf16").passed  # the oracle without a cache
    root = tmp_path / "oracle"
    assert check("gemm", inputs, _good(inputs), "bf16", cache=ReferenceCache(root)).passed
    (entry,) = root.iterdir()
    poisoned = entry / "c.expected.npy"
    np.save(poisoned, np.zeros_like(np.load(poisoned)))  # what an all-zero output matches
    _warnings(capsys)

    cache = ReferenceCache(root)
    verdict = check("gemm", inputs, _zeros(), "bf16", cache=cache)
    assert not verdict.passed, "a changed entry was believed"
    assert cache.last["source"] == "computed" and cache.last["stored"] == "stored"
    (line,) = _warnings(capsys)
    assert str(poisoned) in line and "SHA-256" in line
    # the entry was replaced by the true reference: the next process reads it, verified, and still fails zeros
    again = ReferenceCache(root)
    assert not check("gemm", inputs, _zeros(), "bf16", cache=again).passed and again.last["source"] == "cache-file"
    assert check("gemm", inputs, _good(inputs), "bf16", cache=again).passed
    assert _warnings(capsys) == []


def test_the_normal_hit_still_hits_from_a_verified_entry_in_a_private_directory(tmp_path, capsys):
    inputs = make_inputs(SPEC, 0, "normal")
    root = tmp_path / "oracle"
    first = ReferenceCache(root)
    assert check("gemm", inputs, _good(inputs), "bf16", cache=first).passed and first.last["source"] == "computed"
    (entry,) = root.iterdir()
    manifest = json.loads((entry / MANIFEST).read_text())
    files = sorted(p.name for p in entry.iterdir() if p.name != MANIFEST)
    assert sorted(manifest["files"]) == files and "key.json" in files and "c.expected.npy" in files
    assert manifest["files"]["c.expected.npy"]["sha256"] == hashlib.sha256(
        (entry / "c.expected.npy").read_bytes()).hexdigest()
    assert manifest["key"] == first.last["key_sha256"]
    assert _mode(root) == 0o700 and _mode(entry) == 0o700
    fresh = ReferenceCache(root)  # another process
    v = check("gemm", inputs, _good(inputs), "bf16", cache=fresh)
    assert v.passed and fresh.last["source"] == "cache-file" and fresh.last["key_sha256"] == first.last["key_sha256"]
    assert not check("gemm", inputs, _zeros(), "bf16", cache=fresh).passed
    assert _warnings(capsys) == []


def test_an_entry_without_a_manifest_is_recomputed(tmp_path, capsys):
    inputs = make_inputs(SPEC, 0, "normal")
    root = tmp_path / "oracle"
    check("gemm", inputs, _good(inputs), "bf16", cache=ReferenceCache(root))
    (entry,) = root.iterdir()
    (entry / MANIFEST).unlink(missing_ok=True)
    np.save(entry / "c.expected.npy", np.zeros((64, 32)))
    _warnings(capsys)
    cache = ReferenceCache(root)
    assert not check("gemm", inputs, _zeros(), "bf16", cache=cache).passed and cache.last["source"] == "computed"
    (line,) = _warnings(capsys)
    assert str(entry / MANIFEST) in line


def test_a_world_writable_oracle_directory_is_refused_with_one_warning(tmp_path, capsys):
    inputs = make_inputs(SPEC, 0, "normal")
    root = tmp_path / "oracle"
    first = ReferenceCache(root)
    check("gemm", inputs, _good(inputs), "bf16", cache=first)
    (entry,) = root.iterdir()
    np.save(entry / "c.expected.npy", np.zeros((64, 32)))
    _reseal(entry, first.last["key_sha256"])  # a planted entry whose manifest matches it
    root.chmod(0o777)
    planted = {p.name: p.read_bytes() for p in entry.iterdir()}
    _warnings(capsys)

    cache = ReferenceCache(root)
    assert not check("gemm", inputs, _zeros(), "bf16", cache=cache).passed
    assert cache.last["source"] == "computed" and cache.last["stored"].startswith("not stored")
    (line,) = _warnings(capsys)
    assert str(root) in line and "writable by" in line
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == planted  # neither read nor written
    assert [p.name for p in root.iterdir()] == [entry.name]


# -- nvcc's build cache --------------------------------------------------------------------------------------------
@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    r = tmp_path / "cache"
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(r))
    monkeypatch.delenv("MOSAIC_CACHE_MAX", raising=False)
    return r


class Builder:
    """A stand-in for nvcc: each build writes ``libkernel.so`` (numbered) and ``done.json``."""

    def __init__(self):
        self.calls = 0

    def __call__(self, tmp: Path) -> None:
        self.calls += 1
        (tmp / "libkernel.so").write_bytes(b"\x7fELF the real build " + bytes([self.calls]) * 64)
        (tmp / "done.json").write_text("{}")

    @staticmethod
    def complete(d: Path) -> bool:
        return (d / "done.json").is_file()


def test_a_tampered_libkernel_so_is_rebuilt_not_used(cache_dir, capsys):
    build = Builder()
    out = nvcc.cache_root() / "kernel-file" / "0123456789abcdef01234567"
    assert nvcc.build_cached(out, build, complete=build.complete) is False
    assert nvcc.build_cached(out, build, complete=build.complete) is True and build.calls == 1  # the normal hit
    assert _warnings(capsys) == []
    assert _mode(cache_dir) == _mode(cache_dir / "kernel-file") == _mode(out) == 0o700
    lib = out / "libkernel.so"
    data = bytearray(lib.read_bytes())
    data[30] ^= 0xFF
    lib.write_bytes(bytes(data))

    assert nvcc.build_cached(out, build, complete=build.complete) is False, "a tampered library was a cache hit"
    assert build.calls == 2 and lib.read_bytes() == b"\x7fELF the real build " + bytes([2]) * 64
    (line,) = _warnings(capsys)
    assert str(lib) in line and "SHA-256" in line
    assert nvcc.build_cached(out, build, complete=build.complete) is True and build.calls == 2
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # the discarded entry is gone


@pytest.mark.parametrize("how", ["no manifest", "group-writable file", "symlinked entry", "extra file"])
def test_an_entry_that_cannot_be_vouched_for_is_rebuilt(cache_dir, tmp_path, capsys, how):
    build = Builder()
    out = nvcc.cache_root() / "kernel-file" / "89abcdef0123456789abcdef"
    nvcc.build_cached(out, build, complete=build.complete)
    if how == "no manifest":
        (out / MANIFEST).unlink(missing_ok=True)
        named = out / MANIFEST
    elif how == "group-writable file":
        (out / "libkernel.so").chmod(0o664)
        named = out / "libkernel.so"
    elif how == "extra file":
        (out / "libextra.so").write_bytes(b"planted")
        named = out / "libextra.so"
    else:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        for p in out.iterdir():
            (elsewhere / p.name).write_bytes(p.read_bytes())
        for p in out.iterdir():
            p.unlink()
        out.rmdir()
        out.symlink_to(elsewhere, target_is_directory=True)
        named = out
    _warnings(capsys)
    assert nvcc.build_cached(out, build, complete=build.complete) is False and build.calls == 2
    (line,) = _warnings(capsys)
    assert str(named) in line
    assert not out.is_symlink() and (out / "libkernel.so").read_bytes().endswith(bytes([2]) * 64)


def test_a_world_writable_cache_root_is_refused_with_one_warning(cache_dir, capsys):
    planted = cache_dir / "kernel-file" / "fedcba9876543210fedcba98"
    planted.mkdir(parents=True)
    (planted / "libkernel.so").write_bytes(b"planted")
    (planted / "done.json").write_text("{}")
    _reseal(planted, planted.name)
    cache_dir.chmod(0o777)
    before = sorted(str(p) for p in cache_dir.rglob("*"))
    _warnings(capsys)

    build = Builder()
    out = nvcc.cache_root() / "kernel-file" / planted.name
    assert nvcc.build_cached(out, build, complete=build.complete) is False and build.calls == 1
    assert (out / "libkernel.so").read_bytes() != b"planted"
    assert cache_dir not in out.parents  # nothing is written there either
    assert nvcc.cache_root() == out.parent.parent  # the same stand-in root for the rest of the process
    (line,) = _warnings(capsys)
    assert str(cache_dir) in line and "writable by" in line
    assert sorted(str(p) for p in cache_dir.rglob("*")) == before
    assert (planted / "libkernel.so").read_bytes() == b"planted"
