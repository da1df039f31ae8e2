"""Mechanical source rewrites of catalog concepts, and what applying one to a kernel file gives.

A language plugin registers :class:`~mosaic.records.Rewrite` records through ``register_rewrites``: one
concept (``approximate-exp``), one language, the diff row keys it targets (``exp.form``), the side it moves
(``gain``: the candidate takes the reference's form; ``lose``: the candidate drops a form only it shows) and
``apply(text) -> text`` (or ``apply(text, row=None)``: :func:`apply_rewrite` passes the diff row to an ``apply``
that takes a second argument). Core holds no language's edits. :func:`apply_rewrite` runs one on a source text and
checks what it returned: a changed text, parseable where the language is Python; a rewrite with nothing
to edit raises :class:`NotApplicable` with the reason, and that is recorded, never an error of the campaign.

:func:`rewrites_for` selects, for one diff row, the rewrites of the target language that target its key and
move it the row's way: a ``*.form`` row's reference tokens the candidate lacks want a ``gain`` rewrite
producing them; the candidate's extra tokens a ``lose`` rewrite removing them; a row that is not a form
takes the rewrites of its key that move it the reference's way: a categorical one (``fma.contraction``)
those not producing the value the candidate already has, a numeric one (``loop.unroll``, a width) the ``gain``
rewrites (they raise it) when the reference's value is above the candidate's, the ``lose`` ones below.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from mosaic.errors import MosaicError
from mosaic.records import Rewrite


class NotApplicable(MosaicError):
    """The rewrite finds nothing to edit in this source (no exact ``expf`` to make approximate ...)."""


@attrs.frozen
class Applied:
    """A rewrite's result on one source: the new text and its SHA-256."""

    rewrite: Rewrite
    text: str
    sha256: str

    def to_json(self) -> dict:
        return {**self.rewrite.to_json(), "sha256": self.sha256}


PYTHON_LANGUAGES = frozenset({"pallas", "cute"})


def takes_row(apply: Any) -> bool:
    """True when ``apply`` takes a second positional argument: ``apply(text, row)`` (a diff row), read by the
    rewrites whose edit depends on the row's values (an unroll toward the reference's)."""
    try:
        params = list(inspect.signature(apply).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def apply_rewrite(rewrite: Rewrite, source: str, row: Any = None) -> Applied:
    """``rewrite.apply(source)`` -- ``rewrite.apply(source, row)`` when a diff row is given and ``apply`` takes
    one -- checked: NotApplicable when it changes nothing or breaks a Python file's syntax."""
    try:
        text = rewrite.apply(source, row) if row is not None and takes_row(rewrite.apply) else rewrite.apply(source)
    except NotApplicable:
        raise
    except (SyntaxError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise NotApplicable(f"{rewrite.name}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(text, str) or text == source:
        raise NotApplicable(f"{rewrite.name}: nothing to rewrite in this source")
    if rewrite.language in PYTHON_LANGUAGES:
        try:
            ast.parse(text)
        except SyntaxError as exc:
            raise NotApplicable(f"{rewrite.name}: the rewritten file does not parse ({exc.msg}, line {exc.lineno})") \
                from exc
    return Applied(rewrite, text, hashlib.sha256(text.encode()).hexdigest())


def registered(host=None) -> dict[str, Rewrite]:
    """Every installed rewrite by name (``rewrite@language``)."""
    if host is None:
        from mosaic.plugins import host as _host

        host = _host()
    return host.items("rewrites")


def _tokens(value: Any) -> set[str]:
    if isinstance(value, list | tuple | set):
        return {str(v) for v in value}
    return {str(value)} if value is not None else set()


def wanted_sides(row) -> dict[str, set[str]]:
    """For a ``*.form`` row: {"gain": tokens the reference shows and the candidate lacks, "lose": the reverse}."""
    ref, cand = _tokens(row.reference), _tokens(row.candidate)
    return {"gain": ref - cand, "lose": cand - ref}


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list | tuple) and value and all(isinstance(v, int | float) and not isinstance(v, bool)
                                                         for v in value):
        return float(max(value))
    return None


def numeric_side(row) -> str | None:
    """``gain`` when a numeric row's reference value is above the candidate's (raise it), ``lose`` when below;
    None for a row that is not numeric on both sides (a list of widths compares by its widest)."""
    ref, cand = _number(row.reference), _number(row.candidate)
    if ref is None or cand is None or ref == cand:
        return None
    return "gain" if ref > cand else "lose"


def rewrites_for(row, language: str, available: Iterable[Rewrite] | Mapping[str, Rewrite]) -> list[Rewrite]:
    """The rewrites of ``language`` aimed at ``row``, in registration order (those moving the row's way)."""
    items = available.values() if isinstance(available, Mapping) else available
    out = []
    for rw in items:
        if rw.language != language or row.key not in rw.rows:
            continue
        if rw.forms and row.key.endswith((".form", "_form")):
            sides = wanted_sides(row)
            if not set(rw.forms) & sides[rw.side]:
                continue
        elif rw.forms and str(row.candidate) in set(rw.forms):
            continue  # a categorical row (fma.contraction): the candidate already has what the rewrite produces
        elif not rw.forms and (way := numeric_side(row)) is not None and way != rw.side:
            continue  # a numeric row (loop.unroll, a width): gain raises it, lose lowers it
        out.append(rw)
    return out


__all__ = ["Applied", "NotApplicable", "apply_rewrite", "numeric_side", "registered", "rewrites_for", "takes_row",
           "wanted_sides"]
