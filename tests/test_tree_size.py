"""The tracked tree stays light enough to carry: a device call carries 64 MiB in all, the working tree and the
staged wheels (CuTe DSL, CUPTI, the CUTLASS headers, quack) together, so the tree must stay under 20 MB. Bundles
store their large members xz-compressed (``mosaic bundle pack``), raw device logs under results/ are compressed,
and a tarball that duplicates an example is dropped. Above the cap this test fails naming the largest paths."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAP_BYTES = 20_000_000


def tracked_sizes(root: Path) -> dict[str, int]:
    """Path -> bytes of every file git tracks in ``root`` (the index, as a clean checkout would hold it)."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached"], capture_output=True, check=True)
    sizes = {}
    for rel in out.stdout.decode().split("\0"):
        if rel and (root / rel).is_file() and not (root / rel).is_symlink():
            sizes[rel] = os.path.getsize(root / rel)
    return sizes


def largest(sizes: dict[str, int], n: int = 12) -> list[str]:
    """The ``n`` largest paths, and the top-level folders by their total, as lines for a failure message."""
    by_dir: dict[str, int] = {}
    for rel, size in sizes.items():
        top = "/".join(rel.split("/")[:2]) if "/" in rel else rel
        by_dir[top] = by_dir.get(top, 0) + size
    files = [f"{size:>11,}  {rel}" for rel, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:n]]
    dirs = [f"{size:>11,}  {rel}/" for rel, size in sorted(by_dir.items(), key=lambda kv: -kv[1])[:n]]
    return ["largest files:", *files, "largest folders:", *dirs]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs a git checkout to know which files are tracked")
def test_the_tracked_tree_is_under_20_mb():
    sizes = tracked_sizes(ROOT)
    total = sum(sizes.values())
    assert len(sizes) > 500, f"only {len(sizes)} tracked files found: not this repository's checkout?"
    assert total < CAP_BYTES, (f"the tracked tree is {total:,} bytes, over the {CAP_BYTES:,}-byte cap a device call "
                               "can carry beside the wheels:\n" + "\n".join(largest(sizes)))


def test_the_report_names_the_largest_paths():
    lines = largest({"a/b/big.sass": 900, "a/b/small.ptx": 10, "c/x.json": 500, "top.md": 1}, n=2)
    assert lines[1].endswith("a/b/big.sass") and lines[2].endswith("c/x.json")
    assert lines[4].strip().startswith("910") and lines[4].endswith("a/b/")
