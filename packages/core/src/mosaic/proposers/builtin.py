"""The built-in proposers, registered with the same hook signature a plugin uses."""

from __future__ import annotations

from mosaic.records import Proposer


def register_proposers(register) -> None:
    from mosaic.proposers.command import CommandProposer
    from mosaic.proposers.knobs import KnobsProposer

    register(Proposer("knobs", "deterministic: each ranked row -> catalog concept -> the target's knob, one "
                      "value change per edit, knob rows before rewrite rows", KnobsProposer))
    register(Proposer("command", "an external program (an agent): discrepancy report as JSON on stdin, a JSON "
                      "edit or a source file back on stdout, run with a timeout", CommandProposer))
