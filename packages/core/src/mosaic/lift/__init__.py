"""Lifting and structural diff.

A kernel's SASS (or PTX) is parsed into instructions (``sass``, ``ptx``), cut into basic blocks with a
control-flow graph, dominators and natural loops (``cfg``), normalised (``normalize``), split by warp role
(``roles``) and lifted into a six-layer fingerprint (``fingerprint``). ``diff`` compares two fingerprints
and returns ranked :class:`~mosaic.records.Discrepancy` rows plus one distance per layer; the rules that
name, rank and explain each row are data (``rules``). The verbs ``mosaic lift`` / ``mosaic diff`` are
:mod:`mosaic.commands.lift` / :mod:`mosaic.commands.diff`.
"""
