"""The bundle: a complete, self-verifying capture of one kernel.

A bundle is a directory ``NAME.bundle/`` with a ``manifest.json`` and the captured files (PTX, SASS,
cubin, ptxas log, launch record, device timings, inputs and outputs). The manifest carries the schema
version, the kernel spec, language, GPU, toolchain versions and the SHA-256 and size of every file, so
lifting, diffing and re-deciding run from a bundle on a machine with no GPU, long after the hardware
was given back. Reading a bundle never unpickles or executes anything: JSON through ``json``, arrays
through ``numpy.load(..., allow_pickle=False)``, every read through the limits of :mod:`mosaic.limits`.
Nothing outside the bundle is ever read: a symlink, device file or FIFO inside it is refused, not followed.
"""

from __future__ import annotations

import hashlib
import json
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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@attrs.frozen
class BundleFile:
    path: str
    role: str
    sha256: str
    size: int


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

    def find(self, role: str) -> list[Path]:
        return [inside(self.root, f.path) for f in self.files if f.role == role]

    def one(self, role: str) -> Path | None:
        found = self.find(role)
        return found[0] if found else None

    def read_text(self, role: str) -> str | None:
        path = self.one(role)
        return _bundle_read(limits.read_text, path) if path else None

    def read_json(self, role: str) -> Any:
        path = self.one(role)
        if path is None:
            return None
        try:
            return limits.read_json(path)
        except BadInput as exc:
            raise BundleError(f"{role} file: {exc.what}", str(path)) from None

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
) -> Bundle:
    """Write a bundle atomically: files go to a temporary sibling directory that is renamed into place.

    ``files`` maps a relative POSIX path to ``(role, content)`` where content is bytes, text, or a path
    to copy. Nothing existing is lost: writing over an existing bundle needs ``overwrite=True``.
    """
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
            if isinstance(content, bytes):
                dest.write_bytes(content)
            elif isinstance(content, str):
                dest.write_text(content)
            else:
                shutil.copyfile(content, dest)
            entries[rel] = {"role": role, "sha256": sha256_file(dest), "size": dest.stat().st_size}
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
    kept = {f.path: (f.role, inside(b.root, f.path)) for f in b.files}
    reserved = {"format", "schema_version", "created", "kernel", "language", "gpu", "toolchain", "files"}
    extra = {k: v for k, v in b.manifest.items() if k not in reserved}
    return save_bundle(b.root, kernel=b.kernel, language=b.language, files={**kept, **files}, gpu=b.gpu,
                       toolchain=b.toolchain, extra=extra, overwrite=True)


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
        if not isinstance(meta, dict) or set(meta) != {"role", "sha256", "size"}:
            return f"manifest entry for '{rel}' must have exactly role, sha256, size"
        if meta["role"] not in ROLES:
            return f"manifest entry for '{rel}' has unknown role {meta['role']!r}"
        sha = meta["sha256"]
        if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            return f"manifest entry for '{rel}' has sha256 {sha!r}, not 64 lower-case hex digits"
        size = meta["size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"manifest entry for '{rel}' has size {size!r}, not a non-negative integer"
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
            path = inside(bundle.root, f.path)
        except BundleError as exc:
            problems.append(exc.what)  # checked before any stat, so a link discloses nothing of its target
            continue
        if not path.exists():
            problems.append(f"{f.path}: missing")
            continue
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{f.path}: not a regular file")
        elif st.st_size != f.size:
            problems.append(f"{f.path}: size {st.st_size} != manifest {f.size}")
        elif sha256_file(path) != f.sha256:
            problems.append(f"{f.path}: SHA-256 mismatch")
    listed = {f.path for f in bundle.files} | {MANIFEST}
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
