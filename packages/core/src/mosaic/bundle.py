"""The bundle: a complete, self-verifying capture of one kernel.

A bundle is a directory ``NAME.bundle/`` with a ``manifest.json`` and the captured files (PTX, SASS,
cubin, ptxas log, launch record, device timings, inputs and outputs). The manifest carries the schema
version, the kernel spec, language, GPU, toolchain versions and the SHA-256 and size of every file, so
lifting, diffing and re-deciding run from a bundle on a machine with no GPU, long after the hardware
was given back. Reading a bundle never unpickles or executes anything: JSON through ``json``, arrays
through ``numpy.load(..., allow_pickle=False)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import attrs
import numpy as np

from mosaic.errors import BundleError, RecordError
from mosaic.records import KernelSpec, LaunchRecord

FORMAT = "mosaic-bundle"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
ROLES = ("ptx", "sass", "cubin", "ptxas_log", "launch", "timings", "inputs", "outputs", "source",
         "metrics", "log", "other")
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
    def files(self) -> list[BundleFile]:
        return [BundleFile(p, **meta) for p, meta in sorted(self.manifest["files"].items())]

    def find(self, role: str) -> list[Path]:
        return [self.root / f.path for f in self.files if f.role == role]

    def one(self, role: str) -> Path | None:
        found = self.find(role)
        return found[0] if found else None

    def read_text(self, role: str) -> str | None:
        path = self.one(role)
        return path.read_text(errors="replace") if path else None

    def read_json(self, role: str) -> Any:
        path = self.one(role)
        if path is None:
            return None
        try:
            return json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BundleError(f"{role} file is not valid JSON: {exc}", str(path)) from None

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
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {k: npz[k] for k in npz.files}
        except (ValueError, OSError) as exc:
            raise BundleError(f"{role} is not a readable .npz without pickle: {exc}", str(path)) from None


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


def _check_rel(rel: str) -> None:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or rel == MANIFEST or "\\" in rel:
        raise BundleError(f"file path '{rel}' must be relative, inside the bundle, and not the manifest")


def read_manifest(root: str | os.PathLike) -> dict:
    root = Path(root)
    if not root.is_dir():
        raise BundleError("not a bundle directory" if root.exists() else "no such bundle", str(root))
    path = root / MANIFEST
    if not path.is_file():
        raise BundleError(f"bundle has no {MANIFEST}", str(root))
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{MANIFEST} is not valid JSON: {exc.__class__.__name__}: {exc}", str(path)) from None
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
    for rel, meta in manifest["files"].items():
        try:
            _check_rel(rel)
        except BundleError as exc:
            return exc.what
        if not isinstance(meta, dict) or set(meta) != {"role", "sha256", "size"}:
            return f"manifest entry for '{rel}' must have exactly role, sha256, size"
        if meta["role"] not in ROLES:
            return f"manifest entry for '{rel}' has unknown role {meta['role']!r}"
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
        path = bundle.root / f.path
        if not path.is_file():
            problems.append(f"{f.path}: missing")
        elif path.stat().st_size != f.size:
            problems.append(f"{f.path}: size {path.stat().st_size} != manifest {f.size}")
        elif sha256_file(path) != f.sha256:
            problems.append(f"{f.path}: SHA-256 mismatch")
    listed = {f.path for f in bundle.files} | {MANIFEST}
    for path in sorted(bundle.root.rglob("*")):
        rel = path.relative_to(bundle.root).as_posix()
        if path.is_file() and rel not in listed:
            problems.append(f"{rel}: not listed in the manifest")
    return problems
