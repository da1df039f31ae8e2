"""Hypothesis fuzz of the SASS and PTX parsers: line and byte mutations of real listings never crash or hang."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import ARTIFACTS  # noqa: E402
from mosaic.errors import BadInput  # noqa: E402
from mosaic.lift.fingerprint import lift_program  # noqa: E402
from mosaic.lift.inputs import parse_text  # noqa: E402

SOURCES = {"sass": (ARTIFACTS / "ws_on.sass").read_text(), "ptx": (ARTIFACTS / "copyform_src.ptx").read_text()
           if (ARTIFACTS / "copyform_src.ptx").exists() else (ARTIFACTS / "tma.ptx").read_text()}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _lift_or_reject(text: str) -> None:
    try:
        programs = parse_text(text, "fuzz")
    except BadInput:
        return
    for prog in programs.values():
        fp = lift_program(prog)
        assert fp.instructions == len(prog.instructions)


line_ops = st.lists(st.tuples(st.sampled_from(["delete", "duplicate", "swap", "truncate"]),
                              st.integers(min_value=0, max_value=10_000)), min_size=1, max_size=6)


@FUZZ
@given(kind=st.sampled_from(sorted(SOURCES)), ops=line_ops)
def test_line_mutations(kind, ops):
    lines = SOURCES[kind].splitlines()
    for op, at in ops:
        if not lines:
            break
        i = at % len(lines)
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = (i + 1) % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines[i] = lines[i][: at % (len(lines[i]) + 1)]
    _lift_or_reject("\n".join(lines))


@FUZZ
@given(kind=st.sampled_from(sorted(SOURCES)),
       edits=st.lists(st.tuples(st.integers(min_value=0), st.binary(min_size=1, max_size=3)), min_size=1, max_size=8))
def test_byte_mutations(kind, edits):
    data = bytearray(SOURCES[kind].encode())
    for at, blob in edits:
        i = at % len(data)
        data[i:i + len(blob)] = blob
    _lift_or_reject(data.decode("utf-8", errors="replace"))
