"""Errors and diagnostics.

Every error a user can cause derives from :class:`MosaicError`; the CLI prints it as one line,
``error: <what> (<where>)``, and exits with its ``exit_code`` (2 for bad input). A traceback is shown
only with ``--debug``.
"""

from __future__ import annotations

import attrs


class MosaicError(Exception):
    """An error caused by input or environment, reported to the user as one line."""

    exit_code = 2

    def __init__(self, what: str, where: str | None = None):
        self.what = what
        self.where = where
        super().__init__(self.line())

    def line(self) -> str:
        return f"{self.what} ({self.where})" if self.where else self.what


class BadInput(MosaicError):
    """Malformed user input: a file, a schedule, an argument."""


class ToolMissing(BadInput):
    """A CUDA tool (nvcc, ptxas, nvdisasm, cuobjdump) or header set that a step needs is not installed."""


class BundleError(BadInput):
    """A bundle that cannot be read: missing manifest, wrong schema, missing file."""


class PluginError(MosaicError):
    """A plugin problem that stops the command: a name conflict, an unknown allow-list entry."""


class RecordError(BadInput, ValueError):
    """A record field with a value outside what it allows."""


@attrs.frozen
class Diagnostic:
    """One structured problem found by a rule table: a stable code, where, what was expected, what was found."""

    code: str
    where: str
    expected: object = None
    actual: object = None
    message: str = ""

    def line(self) -> str:
        text = f"[{self.code}] {self.where}"
        if self.message:
            text += f": {self.message}"
        if self.expected is not None or self.actual is not None:
            text += f" (expected {self.expected!r}, got {self.actual!r})"
        return text

    def to_json(self) -> dict:
        return attrs.asdict(self)


class CheckFailed(MosaicError):
    """Raised by ``check()`` functions of rule tables: carries every diagnostic, not only the first."""

    exit_code = 1

    def __init__(self, what: str, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        first = self.diagnostics[0].line() if self.diagnostics else ""
        super().__init__(f"{what}: {len(self.diagnostics)} problem(s); first: {first}")
