"""Shared helpers for the lifting tests: the corpus spec and cached lifts."""

from __future__ import annotations

import functools
import json
from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"
ARTIFACTS = CORPUS / "artifacts"
SPEC = json.loads((CORPUS / "pairs.json").read_text())


@functools.cache
def lifted(variant: str, ext: str = "cubin"):
    from mosaic.lift.inputs import lift_path

    return lift_path(ARTIFACTS / f"{variant}.{ext}")


def diff_variants(ref: str, cand: str, ext: str = "cubin"):
    from mosaic.lift.diff import diff_fingerprints

    return diff_fingerprints(lifted(ref, ext), lifted(cand, ext))
