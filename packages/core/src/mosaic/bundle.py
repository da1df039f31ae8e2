"""The bundle: a complete, self-verifying capture of one kernel.

A bundle is a directory ``NAME.bundle/`` with a ``manifest.json`` and the captured files (PTX, SASS,
cubin, ptxas log, launch record, device timings, inputs and outputs). The manifest carries the schema
version, the kernel spec, language, GPU, toolchain versions and the SHA-256 and size of every file, so
lifting, diffing and re-deciding run from a bundle on a machine with no GPU, long after the hardware
was given back. Reading a bundle never unpickles or executes anything: JSON through ``json``, arrays
through ``numpy.load(..., allow_pickle=False)``, every read through the limits of :mod:`mosaic.limits`.
Nothing outside the bundle is ever read: a symlink, device file or FIFO inside it is refused, not followed.

**Storage.** A large member (PTX, SASS, cubin, logs, arrays: anything of at least :data:`COMPRESS_MIN` bytes that
xz shrinks by a tenth or more) is stored compressed, as ``NAME.xz`` beside where ``NAME`` would be; its manifest
entry keeps the SHA-256 and size of the *uncompressed* content (so a bundle's identity does not change with its
storage) and adds ``codec`` with the ``stored_sha256`` and ``stored_size`` of the file on disk. Readers never see
the difference: :meth:`Bundle.read_text`/``read_json``/``arrays`` inflate in memory, and :meth:`Bundle.find`,
:meth:`Bundle.one` and :meth:`Bundle.path` hand out a path to the plain content, inflated once into the user
cache (``$MOSAIC_CACHE_DIR/members/``, content-addressed and re-hashed on every use). Inflating is bounded by the
manifest size, so a hostile member cannot grow past what the manifest claims. Bundles written before storage
existed (every entry plain) read as they always did; ``mosaic bundle pack|unpack`` converts either way.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import attrs
import numpy as np

from mosaic import limits
from mosaic.errors import BadInput, BundleError, RecordError
from mosaic.records import KernelSpec, LaunchRecord

FORMAT = "mosaic-bundle"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
ROLES = ("ptx", "sass", "cubin", "ptxas_log", "launch", "timings", "inputs", "outputs", "source",
         "metrics", "profile", "log", "other")
_REQUIRED = ("format", "schema_version", "kernel", "language", "files")
_ENTRY_KEYS = frozenset({"role", "sha256", "size"})
_STORED_KEYS = frozenset({"codec", "stored_sha256", "stored_size"})
COMPRESS_MIN = 16 * 1024  # bytes: smaller members stay plain (a launch record, a timings file, a short log)
COMPRESS_GAIN = 0.9  # a member is stored compressed only when that takes at most this fraction of its size
COMPRESS_ENV = "MOSAIC_BUNDLE_COMPRESS"  # "0": new bundles store every member plain
_CHUNK = 1 << 20


@attrs.frozen
class Codec:
    """One storage codec: its manifest name, the suffix of the stored file, and how it (de)compresses."""

    name: str
    suffix: str
    compressor: Any  # () -> an object with compress(bytes) and flush()
    decompressor: Any  # () -> an object with decompress(bytes, max_length), eof, needs_input, unused_data


CODECS: dict[str, Codec] = {c.name: c for c in (
    Codec("xz", ".xz", lambda: lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=6),
          lambda: lzma.LZMADecompressor(format=lzma.FORMAT_XZ)),
)}
DEFAULT_CODEC = "xz"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@attrs.frozen
class BundleFile:
    """One member: its logical path, role, and the SHA-256 and size of its (uncompressed) content; ``codec``,
    ``stored_sha256`` and ``stored_size`` describe the file on disk when it is stored compressed."""

    path: str
    role: str
    sha256: str
    size: int
    codec: str | None = None
    stored_sha256: str | None = None
    stored_size: int | None = None

    @property
    def stored_path(self) -> str:
        """The relative path of the file on disk: ``path``, or ``path`` + the codec's suffix."""
        return self.path + CODECS[self.codec].suffix if self.codec else self.path

    def entry(self) -> dict:
        out = {"role": self.role, "sha256": self.sha256, "size": self.size}
        if self.codec:
            out.update(codec=self.codec, stored_sha256=self.stored_sha256, stored_size=self.stored_size)
        return out


@attrs.frozen
class Member:
    """A member of a loaded bundle, handed to :func:`save_bundle` as content: copied as stored (compressed or
    not), never inflated and compressed again. Its hashes were checked when its bundle was loaded."""

    bundle: Bundle
    file: BundleFile


@attrs.frozen
class Bundle:
    """A loaded bundle: its directory and parsed manifest. Files are read on demand."""

    root: Path
    manifest: Mapping[str, Any]

    @property
    def kernel(self) -> KernelSpec:
        return KernelSpec.from_json(self.manifest["kernel"])

    @property
    def language(self) -> str:
        return self.manifest["language"]

    @property
    def gpu(self) -> str | None:
        return self.manifest.get("gpu")

    @property
    def toolchain(self) -> dict[str, str]:
        """Tool name -> version; empty when the manifest records none (``null`` or absent)."""
        return dict(self.manifest.get("toolchain") or {})

    @property
    def files(self) -> list[BundleFile]:
        return [BundleFile(p, **meta) for p, meta in sorted(self.manifest["files"].items())]

    def file(self, rel: str) -> BundleFile:
        meta = self.manifest["files"].get(rel)
        if meta is None:
            raise BundleError(f"bundle holds no member '{rel}'", str(self.root))
        return BundleFile(rel, **meta)

    @property
    def compressed(self) -> bool:
        """Whether any member is stored compressed."""
        return any(f.codec for f in self.files)

    def path(self, rel: str) -> Path:
        """A readable path to member ``rel``'s plain content: the file in the bundle, or (stored compressed)
        its inflated copy in the user cache, content-addressed and re-hashed on every call."""
        f = self.file(rel)
        if not f.codec:
            return inside(self.root, f.path)
        return _materialize(self.root, f)

    def member(self, rel: str) -> Member:
        """Member ``rel`` as content for :func:`save_bundle` (copied as stored)."""
        return Member(self, self.file(rel))

    def find(self, role: str) -> list[Path]:
        return [self.path(f.path) for f in self.files if f.role == role]

    def one(self, role: str) -> Path | None:
        found = [f for f in self.files if f.role == role]
        return self.path(found[0].path) if found else None

    def one_file(self, role: str) -> BundleFile | None:
        found = [f for f in self.files if f.role == role]
        return found[0] if found else None

    def read_bytes(self, rel: str, limit_name: str = "text_bytes") -> bytes:
        """The plain content of member ``rel``, no larger than limit ``limit_name``; inflated in memory when stored
        compressed (bounded by the manifest size, checked against the manifest SHA-256)."""
        f = self.file(rel)
        if not f.codec:
            return _bundle_read(lambda p: limits.read_bytes(p, limit_name), inside(self.root, f.path))
        where = str(self.root / f.stored_path)
        if f.size > limits.limit(limit_name):
            raise BundleError(limits.refuse(limit_name, f.size, where).what, where)
        data = _inflate(self.root, f, None)
        return data

    def read_text(self, role: str) -> str | None:
        f = self.one_file(role)
        return self.read_bytes(f.path).decode("utf-8", errors="replace") if f else None

    def read_json(self, role: str) -> Any:
        f = self.one_file(role)
        if f is None:
            return None
        where = str(self.root / f.stored_path)
        try:
            data = self.read_bytes(f.path, "json_bytes")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise BadInput("not valid JSON: not UTF-8 text", where) from None
            return limits.loads_json(text, where)
        except BadInput as exc:
            raise BundleError(f"{role} file: {exc.what}", where) from None

    def launch(self) -> LaunchRecord | None:
        data = self.read_json("launch")
        if data is None:
            return None
        try:
            return LaunchRecord.from_json(data)
        except RecordError as exc:
            raise BundleError(f"bad launch record: {exc}", str(self.one('launch'))) from None

    def arrays(self, role: str) -> dict[str, np.ndarray]:
        """Arrays of an ``inputs``/``outputs`` .npz, loaded without pickle."""
        path = self.one(role)
        if path is None:
            return {}
        return _bundle_read(lambda p: limits.load_npz(p, role), path)


def _stored_file(root: Path, f: BundleFile) -> Path:
    """The stored (compressed) file of ``f``: a regular file inside the bundle, or BundleError."""
    path = inside(root, f.stored_path)
    try:
        limits.regular_file(path)
    except BadInput as exc:
        raise BundleError(f"{f.stored_path}: {exc.what}", str(root)) from None
    return path


def _inflate(root: Path, f: BundleFile, sink) -> bytes | None:
    """Inflate stored member ``f``: into ``sink`` (a binary file) when given, else into memory (returned).

    Never produces more than the manifest's ``size`` bytes; the result must hash to the manifest's ``sha256``.
    """
    codec = CODECS.get(f.codec or "")
    where = str(root / f.stored_path)
    if codec is None:
        raise BundleError(f"{f.path}: stored with codec {f.codec!r}; this mosaic reads {', '.join(CODECS)}", where)
    path = _stored_file(root, f)
    d = codec.decompressor()
    digest, n, parts = hashlib.sha256(), 0, []
    try:
        with open(path, "rb") as fh:
            while not d.eof:
                chunk = b""
                if d.needs_input:
                    chunk = fh.read(_CHUNK)
                    if not chunk:
                        raise BundleError(f"{f.path}: compressed stream is truncated", where)
                out = d.decompress(chunk, max_length=min(_CHUNK, f.size - n + 1))
                n += len(out)
                if n > f.size:
                    raise BundleError(f"{f.path}: inflates past its manifest size {f.size}", where)
                digest.update(out)
                if sink is None:
                    parts.append(out)
                else:
                    sink.write(out)
            if d.unused_data or fh.read(1):
                raise BundleError(f"{f.path}: stored file has data after its compressed stream", where)
    except (lzma.LZMAError, EOFError) as exc:
        raise BundleError(f"{f.path}: not a readable {f.codec} stream: {exc}", where) from None
    if n != f.size:
        raise BundleError(f"{f.path}: inflates to {n} bytes, manifest says {f.size}", where)
    if digest.hexdigest() != f.sha256:
        raise BundleError(f"{f.path}: SHA-256 mismatch (of the inflated content)", where)
    return b"".join(parts) if sink is None else None


def members_cache() -> Path:
    """Where compressed members are inflated for readers that need a path: ``$MOSAIC_CACHE_DIR/members``."""
    from mosaic.toolchain.nvcc import cache_root

    return cache_root() / "members"


def _materialize(root: Path, f: BundleFile) -> Path:
    """A path to the plain content of stored member ``f``: ``members/<sha[:2]>/<sha>/<name>``, reused when it
    still hashes to the manifest's SHA-256, else inflated again (to a temporary file, then renamed)."""
    target = members_cache() / f.sha256[:2] / f.sha256 / PurePosixPath(f.path).name
    if target.is_file() and not target.is_symlink():
        st = target.stat()
        if st.st_size == f.size and sha256_file(target) == f.sha256:
            os.utime(target)  # recency, for the cache's least-recently-used eviction
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as sink:
            _inflate(root, f, sink)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def member_path(path: str | os.PathLike) -> Path:
    """``path`` itself, or, when it names a member of a bundle that is stored compressed (``X.bundle/kernel.sass``
    whose file is ``kernel.sass.xz``, or that ``.xz`` file itself), a path to its plain content: so a user (or
    a script) who points a command at a bundle's file reads the same bytes whatever the bundle's storage."""
    p = Path(path)
    if p.exists() and not p.name.endswith(tuple(c.suffix for c in CODECS.values())):
        return p
    for root in p.parents:
        if (root / MANIFEST).is_file():
            rel = p.relative_to(root).as_posix()
            try:
                b = Bundle(root, read_manifest(root))
            except BundleError:
                return p
            files = b.manifest["files"]
            if rel not in files:
                rel = next((r for r, m in files.items() if m.get("codec") and r + CODECS[m["codec"]].suffix == rel),
                           rel)
            return b.path(rel) if rel in files else p
    return p


def compression_default() -> bool:
    """Whether new bundles store large members compressed: yes, unless ``MOSAIC_BUNDLE_COMPRESS=0``."""
    raw = os.environ.get(COMPRESS_ENV, "1").strip().lower()
    if raw not in ("0", "1", "yes", "no", "true", "false", "on", "off", ""):
        raise BadInput(f"{COMPRESS_ENV}={raw!r} must be 0 or 1", COMPRESS_ENV)
    return raw not in ("0", "no", "false", "off")


def _store(plain: Path, dest_dir: Path, rel: str, role: str, codec: str | None, preset: int | None) -> BundleFile:
    """Write ``plain`` (a file in the temporary bundle) as stored: compressed beside it when that pays, else as is."""
    size = plain.stat().st_size
    sha = sha256_file(plain)
    if codec and size >= COMPRESS_MIN:
        c = CODECS[codec]
        stored = dest_dir / (rel + c.suffix)
        comp = (lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=preset) if codec == "xz" and preset is not None
                else c.compressor())
        zdigest, zsize = hashlib.sha256(), 0
        with open(plain, "rb") as src, open(stored, "wb") as out:
            for chunk in iter(lambda: src.read(_CHUNK), b""):
                z = comp.compress(chunk)
                out.write(z)
                zdigest.update(z)
                zsize += len(z)
            z = comp.flush()
            out.write(z)
            zdigest.update(z)
            zsize += len(z)
        if zsize <= COMPRESS_GAIN * size:
            plain.unlink()
            return BundleFile(rel, role, sha, size, codec, zdigest.hexdigest(), zsize)
        stored.unlink()
    return BundleFile(rel, role, sha, size)


def _bundle_read(reader, path: Path):
    try:
        return reader(path)
    except BundleError:
        raise
    except BadInput as exc:
        raise BundleError(exc.what, exc.where) from None


def inside(root: Path, rel: str) -> Path:
    """``root / rel`` after checking that no component is a symlink, so nothing outside the bundle is read."""
    path = root
    for part in PurePosixPath(rel).parts:
        path = path / part
        if path.is_symlink():
            raise BundleError(f"{rel}: is a symlink; a bundle holds its files, it never points outside itself",
                              str(root))
    return path


def save_bundle(
    root: str | os.PathLike,
    *,
    kernel: KernelSpec,
    language: str,
    files: Mapping[str, tuple[str, bytes | str | os.PathLike]],
    gpu: str | None = None,
    toolchain: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    compress: bool | None = None,
    preset: int | None = None,
) -> Bundle:
    """Write a bundle atomically: files go to a temporary sibling directory that is renamed into place.

    ``files`` maps a relative POSIX path to ``(role, content)`` where content is bytes, text, a path to copy,
    or a :class:`Member` of a loaded bundle (copied as stored). Nothing existing is lost: writing over an
    existing bundle needs ``overwrite=True``. ``compress`` (default :func:`compression_default`) stores large
    members compressed; ``False`` stores every member plain (a :class:`Member` included); ``preset`` is xz's.
    """
    if compress is None:
        compress = compression_default()
    codec = DEFAULT_CODEC if compress else None
    root = Path(root)
    if root.exists() and not overwrite:
        raise BundleError("bundle already exists; pass overwrite to replace it", str(root))
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        entries = {}
        for rel, (role, content) in sorted(files.items()):
            _check_rel(rel)
            if role not in ROLES:
                raise BundleError(f"file role '{role}' unknown; known: {', '.join(ROLES)}", rel)
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Member) and content.file.codec and compress:
                src = content.file
                shutil.copyfile(_stored_file(content.bundle.root, src), tmp / src.stored_path)
                entries[rel] = attrs.evolve(src, path=rel, role=role).entry()
                continue
            if isinstance(content, Member):
                content = content.bundle.path(content.file.path)
            if isinstance(content, bytes):
                dest.write_bytes(content)
            elif isinstance(content, str):
                dest.write_text(content)
            else:
                shutil.copyfile(content, dest)
            entries[rel] = _store(dest, tmp, rel, role, codec, preset).entry()
        manifest = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "kernel": kernel.to_json(),
            "language": language,
            "gpu": gpu,
            "toolchain": dict(toolchain or {}),
            "files": entries,
        }
        if extra:
            clash = set(extra) & set(manifest)
            if clash:
                raise BundleError(f"extra manifest keys clash with reserved ones: {sorted(clash)}")
            manifest.update(extra)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return load_bundle(root)


def add_files(root: str | os.PathLike, files: Mapping[str, tuple[str, bytes | str | os.PathLike]]) -> Bundle:
    """Rewrite a bundle with ``files`` added (replacing any of the same path); everything else it held, files
    and manifest keys, is kept. Atomic like :func:`save_bundle`; the bundle is verified first."""
    b = load_bundle(root)
    kept = {f.path: (f.role, b.member(f.path)) for f in b.files}
    return save_bundle(b.root, kernel=b.kernel, language=b.language, files={**kept, **files}, gpu=b.gpu,
                       toolchain=b.toolchain, extra=extra_keys(b), overwrite=True)


RESERVED = frozenset({"format", "schema_version", "created", "kernel", "language", "gpu", "toolchain", "files"})


def extra_keys(b: Bundle) -> dict:
    """The manifest keys of ``b`` beyond the reserved ones (capture records, ``mosaic_run``, notes)."""
    return {k: v for k, v in b.manifest.items() if k not in RESERVED}


def restore(root: str | os.PathLike, *, compress: bool, preset: int | None = None) -> tuple[Bundle, int, int]:
    """Rewrite a bundle with every large member stored compressed (``compress``) or every member plain. The
    manifest's content hashes, its ``created`` stamp and every other key are unchanged: the bundle's identity
    is the same. Returns the bundle and its stored bytes before and after."""
    b = load_bundle(root)
    before = stored_bytes(b)
    files = {f.path: (f.role, b.path(f.path)) for f in b.files}
    extra = extra_keys(b)
    with tempfile.TemporaryDirectory(prefix="mosaic-restore-") as tmp:
        # the plain copies of compressed members live in the user cache; copy them out before the rewrite
        staged = {}
        for rel, (role, path) in files.items():
            dest = Path(tmp) / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            staged[rel] = (role, dest)
        out = save_bundle(b.root, kernel=b.kernel, language=b.language, files=staged, gpu=b.gpu,
                          toolchain=b.toolchain, extra=extra, overwrite=True, compress=compress, preset=preset)
    manifest = dict(out.manifest)
    if "created" in b.manifest:
        manifest["created"] = b.manifest["created"]
        (out.root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        out = load_bundle(out.root)
    return out, before, stored_bytes(out)


def stored_bytes(b: Bundle) -> int:
    """Bytes the bundle takes on disk: its manifest and every stored file."""
    return (b.root / MANIFEST).stat().st_size + sum(f.stored_size if f.codec else f.size for f in b.files)


def _check_rel(rel: str) -> None:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or rel == MANIFEST or "\\" in rel:
        raise BundleError(f"file path '{rel}' must be relative, inside the bundle, and not the manifest")


def read_manifest(root: str | os.PathLike) -> dict:
    root = Path(root)
    if not root.is_dir():
        raise BundleError("not a bundle directory" if root.exists() else "no such bundle", str(root))
    path = root / MANIFEST
    if path.is_symlink():
        raise BundleError(f"{MANIFEST} is a symlink; a bundle never points outside itself", str(root))
    if not path.is_file():
        raise BundleError(f"bundle has no {MANIFEST}", str(root))
    try:
        manifest = limits.read_json(path)
    except BadInput as exc:
        raise BundleError(f"{MANIFEST}: {exc.what}", str(path)) from None
    problem = _schema_problem(manifest)
    if problem:
        raise BundleError(problem, str(path))
    return manifest


def _schema_problem(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return "manifest is not a JSON object"
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        return f"manifest lacks {', '.join(missing)}"
    if manifest["format"] != FORMAT:
        return f"manifest format is {manifest['format']!r}, expected {FORMAT!r}"
    if manifest["schema_version"] != SCHEMA_VERSION:
        return f"manifest schema_version is {manifest['schema_version']!r}; this mosaic reads {SCHEMA_VERSION}"
    if not isinstance(manifest["files"], dict):
        return "manifest 'files' is not an object"
    for key, kinds, name in (("language", (str,), "a string"), ("gpu", (str, type(None)), "a string or null"),
                             ("toolchain", (dict, type(None)), "an object or null"), ("kernel", (dict,), "an object")):
        if not isinstance(manifest.get(key), kinds):
            return f"manifest '{key}' must be {name}, not {type(manifest.get(key)).__name__}"
    for rel, meta in manifest["files"].items():
        try:
            _check_rel(rel)
        except BundleError as exc:
            return exc.what
        if not isinstance(meta, dict) or set(meta) not in (_ENTRY_KEYS, _ENTRY_KEYS | _STORED_KEYS):
            return (f"manifest entry for '{rel}' must have exactly role, sha256, size (and, stored compressed, "
                    "codec, stored_sha256, stored_size)")
        if meta["role"] not in ROLES:
            return f"manifest entry for '{rel}' has unknown role {meta['role']!r}"
        sha = meta["sha256"]
        if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            return f"manifest entry for '{rel}' has sha256 {sha!r}, not 64 lower-case hex digits"
        size = meta["size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"manifest entry for '{rel}' has size {size!r}, not a non-negative integer"
        if "codec" in meta:
            if meta["codec"] not in CODECS:
                return (f"manifest entry for '{rel}' has codec {meta['codec']!r}; this mosaic reads "
                        f"{', '.join(CODECS)}")
            zsha, zsize = meta["stored_sha256"], meta["stored_size"]
            if not isinstance(zsha, str) or len(zsha) != 64 or any(c not in "0123456789abcdef" for c in zsha):
                return f"manifest entry for '{rel}' has stored_sha256 {zsha!r}, not 64 lower-case hex digits"
            if not isinstance(zsize, int) or isinstance(zsize, bool) or zsize < 0:
                return f"manifest entry for '{rel}' has stored_size {zsize!r}, not a non-negative integer"
            stored = rel + CODECS[meta["codec"]].suffix
            if stored in manifest["files"]:
                return f"manifest entry for '{rel}' is stored as '{stored}', which the manifest also lists"
    try:
        KernelSpec.from_json(manifest["kernel"])
    except RecordError as exc:
        return f"manifest kernel spec: {exc}"
    return None


def load_bundle(root: str | os.PathLike, *, verify: bool = True) -> Bundle:
    """Read and (by default) verify a bundle; raise :class:`BundleError` on the first problem."""
    manifest = read_manifest(root)
    bundle = Bundle(Path(root), manifest)
    if verify:
        problems = verify_bundle(bundle)
        if problems:
            raise BundleError(problems[0])
    return bundle


def verify_bundle(bundle: Bundle | str | os.PathLike) -> list[str]:
    """Every integrity problem, in file order: missing files, size or SHA-256 mismatches, strays."""
    if not isinstance(bundle, Bundle):
        bundle = Bundle(Path(bundle), read_manifest(bundle))
    problems = []
    for f in bundle.files:
        try:
            path = inside(bundle.root, f.stored_path)
        except BundleError as exc:
            problems.append(exc.what)  # checked before any stat, so a link discloses nothing of its target
            continue
        if not path.exists():
            problems.append(f"{f.stored_path}: missing")
            continue
        st = path.stat()
        size, sha = (f.stored_size, f.stored_sha256) if f.codec else (f.size, f.sha256)
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{f.stored_path}: not a regular file")
        elif st.st_size != size:
            problems.append(f"{f.stored_path}: size {st.st_size} != manifest {size}")
        elif sha256_file(path) != sha:
            problems.append(f"{f.stored_path}: SHA-256 mismatch")
        elif f.codec:
            try:
                _inflate(bundle.root, f, _Discard())  # the content's own size and hash, not just the stored file's
            except BundleError as exc:
                problems.append(exc.what)
    listed = {f.stored_path for f in bundle.files} | {MANIFEST}
    for top, dirs, names in os.walk(bundle.root):  # never follows a symlinked directory
        for name in sorted(dirs + names):
            path = Path(top) / name
            rel = path.relative_to(bundle.root).as_posix()
            if path.is_symlink():
                if rel not in listed:
                    problems.append(f"{rel}: a symlink inside the bundle (refused, never followed)")
            elif path.is_file() and rel not in listed:
                problems.append(f"{rel}: not listed in the manifest")
        dirs.sort()
    return problems


class _Discard:
    def write(self, data: bytes) -> None:
        pass
