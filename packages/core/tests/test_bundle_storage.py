"""Bundle storage: large members are stored xz-compressed, transparently. The manifest keeps the SHA-256 and
size of the plain content (a bundle's identity does not change with its storage), every reader sees the plain
bytes, an old all-plain bundle still reads, and a hostile stored stream is refused in one line."""

import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mosaic.bundle import (
    COMPRESS_MIN,
    load_bundle,
    member_path,
    restore,
    save_bundle,
    sha256_file,
    verify_bundle,
)
from mosaic.errors import BundleError
from mosaic.records import KernelSpec

SPEC = KernelSpec(family="gemm", shape={"m": 64, "n": 64, "k": 64}, dtype="bf16", language="cutlass")
SASS = "".join(f"        /*{i * 16:04x}*/                   IMAD.MOV.U32 R{i % 200}, RZ, RZ, c[0x0][0x{i % 64:x}] ;\n"
               for i in range(4000))  # a listing-like text of ~300 KB
OLD = Path(__file__).parent / "data" / "h200-first-campaign" / "reference.bundle"  # written before storage existed
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MOSAIC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MOSAIC_BUNDLE_COMPRESS", raising=False)


def make(root, **kw):
    noise = np.random.default_rng(0).integers(0, 256, size=64 * 1024, dtype=np.uint8).tobytes()
    files = {"kernel.sass": ("sass", SASS), "note.txt": ("log", "short\n"), "random.bin": ("other", noise)}
    return save_bundle(root, kernel=SPEC, language="cutlass", files=files, gpu="h200", **kw)


def test_a_large_text_member_is_stored_compressed_and_read_plain(tmp_path):
    b = make(tmp_path / "g.bundle")
    sass = b.file("kernel.sass")
    assert sass.codec == "xz" and (b.root / "kernel.sass.xz").is_file() and not (b.root / "kernel.sass").exists()
    assert sass.size == len(SASS.encode()) and sass.stored_size < sass.size / 10
    assert sass.sha256 == __import__("hashlib").sha256(SASS.encode()).hexdigest()  # the content's hash, not the xz's
    assert b.read_text("sass") == SASS
    path = b.one("sass")  # a path to the plain content, for readers that need one (nvdisasm, lift)
    assert path.read_text() == SASS and path.name == "kernel.sass" and sha256_file(path) == sass.sha256
    assert str(path).startswith(str(tmp_path / "cache" / "members"))
    assert verify_bundle(b) == []


def test_small_and_incompressible_members_stay_plain(tmp_path):
    b = make(tmp_path / "g.bundle")
    assert b.file("note.txt").codec is None and (b.root / "note.txt").read_text() == "short\n"
    assert b.file("random.bin").codec is None and b.file("random.bin").size >= COMPRESS_MIN  # xz would not pay


def test_compression_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("MOSAIC_BUNDLE_COMPRESS", "0")
    b = make(tmp_path / "g.bundle")
    assert not b.compressed and (b.root / "kernel.sass").read_text() == SASS


def test_the_identity_is_the_same_in_both_storages(tmp_path):
    packed = make(tmp_path / "a.bundle")
    plain = make(tmp_path / "b.bundle", compress=False)
    strip = lambda b: {p: {k: m[k] for k in ("role", "sha256", "size")} for p, m in b.manifest["files"].items()}  # noqa: E731
    assert strip(packed) == strip(plain) and packed.compressed and not plain.compressed
    created = packed.manifest["created"]
    unpacked, before, after = restore(packed.root, compress=False)
    assert strip(unpacked) == strip(plain) and unpacked.manifest["created"] == created and after > before
    assert (unpacked.root / "kernel.sass").read_text() == SASS and verify_bundle(unpacked) == []
    repacked, _, again = restore(unpacked.root, compress=True, preset=9)
    assert strip(repacked) == strip(plain) and again < after / 5


def test_rewriting_a_bundle_copies_compressed_members_as_stored(tmp_path):
    from mosaic.bundle import add_files

    b = make(tmp_path / "g.bundle")
    stored = (b.root / "kernel.sass.xz").read_bytes()
    b2 = add_files(b.root, {"extra.json": ("other", "{}")})
    assert (b2.root / "kernel.sass.xz").read_bytes() == stored and b2.read_text("sass") == SASS


def test_an_old_plain_bundle_verifies_and_lifts_as_a_packed_copy_does(tmp_path):
    from mosaic.lift.inputs import lift_bundle

    assert not load_bundle(OLD).compressed and verify_bundle(OLD) == []
    copy = tmp_path / "ref.bundle"
    shutil.copytree(OLD, copy)
    packed, before, after = restore(copy, compress=True)
    assert packed.compressed and after < before / 3
    plain_fp, packed_fp = lift_bundle(OLD).to_json(), lift_bundle(copy).to_json()
    assert plain_fp.pop("origin") != packed_fp.pop("origin")  # each names its own bundle ...
    assert plain_fp == packed_fp and plain_fp["layers"]  # ... and nothing else differs
    # a member named by its path reads the same bytes whatever the storage
    assert member_path(copy / "kernel.sass").read_bytes() == (OLD / "kernel.sass").read_bytes()
    assert member_path(copy / "kernel.sass.xz").read_bytes() == (OLD / "kernel.sass").read_bytes()


def _forge(root: Path, member: str, stream: bytes) -> None:
    """Replace a stored member's stream and fix the manifest's stored hash, as a careful forger would."""
    (root / f"{member}.xz").write_bytes(stream)
    m = json.loads((root / "manifest.json").read_text())
    m["files"][member]["stored_sha256"] = sha256_file(root / f"{member}.xz")
    m["files"][member]["stored_size"] = len(stream)
    (root / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("stream, says", [
    (lzma.compress(SASS.encode() + b"x" * 10_000_000), "inflates past its manifest size"),  # a bomb
    (lzma.compress(SASS.encode())[:-200], "truncated"),
    (lzma.compress(SASS.encode()) + b"junk", "after its compressed stream"),
    (lzma.compress(SASS.replace("IMAD", "IADD").encode()), "SHA-256 mismatch (of the inflated content)"),
    (b"not xz at all" * 100, "not a readable xz stream"),
])
def test_a_hostile_stored_stream_is_refused_in_one_line(tmp_path, stream, says):
    b = make(tmp_path / "g.bundle")
    _forge(b.root, "kernel.sass", stream)
    problems = verify_bundle(b.root)
    assert len(problems) == 1 and says in problems[0], problems
    with pytest.raises(BundleError, match="kernel.sass"):
        load_bundle(b.root, verify=False).read_text("sass")
    p = subprocess.run([*MOSAIC, "lift", str(b.root)], capture_output=True, text=True, env=os.environ)
    assert p.returncode == 2 and "Traceback" not in p.stderr and says.split(" (")[0] in p.stderr, p.stderr


def test_a_manifest_with_an_unknown_codec_or_a_colliding_stored_name_is_refused(tmp_path):
    b = make(tmp_path / "g.bundle")
    m = json.loads((b.root / "manifest.json").read_text())
    m["files"]["kernel.sass"]["codec"] = "brotli"
    (b.root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="codec 'brotli'"):
        load_bundle(b.root)
    m["files"]["kernel.sass"]["codec"] = "xz"
    m["files"]["kernel.sass.xz"] = {"role": "other", "sha256": "0" * 64, "size": 1}
    (b.root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="also lists"):
        load_bundle(b.root)


def test_the_cli_packs_unpacks_and_shows_the_storage(tmp_path):
    make(tmp_path / "d" / "g.bundle", compress=False)
    run = lambda *a: subprocess.run([*MOSAIC, "bundle", *a], capture_output=True, text=True, env=os.environ)  # noqa: E731
    p = run("pack", str(tmp_path / "d"))
    assert p.returncode == 0 and "1 bundle(s)" in p.stdout and "identities (content SHA-256s) unchanged" in p.stdout
    shown = run("show", str(tmp_path / "d" / "g.bundle")).stdout
    assert any(line.startswith("kernel.sass") and " xz " in line for line in shown.splitlines()), shown
    assert run("verify", str(tmp_path / "d" / "g.bundle")).returncode == 0
    assert run("unpack", str(tmp_path / "d")).returncode == 0 and (tmp_path / "d" / "g.bundle" / "kernel.sass").is_file()
    bad = run("pack", str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "no such bundle" in bad.stderr
