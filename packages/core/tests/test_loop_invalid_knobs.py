"""A proposal whose knobs the target's knob class refuses is recorded as refused ("invalid knobs: ...") and the
campaign goes on to the proposer's next edit; it never raises out of the loop."""

from types import SimpleNamespace

import attrs
from mosaic.plugins import host
from mosaic.proposers import Proposal
from mosaic.run.campaign import Campaign
from mosaic.run.journal import Journal
from mosaic.run.loop import Loop
from mosaic.run.workbench import Built, Checked, Kernel, ReferenceCapture, Timed

US = {1: 260.0, 2: 190.0}


@attrs.frozen
class Knobs:
    tile: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2)))


def blocks(us):
    return [[us * 1e3 * (1 + 1e-4 * i)] * 5 for i in range(10)]


class Bench:
    kind = "offline"

    def capture_reference(self, spec):
        return ReferenceCapture(Kernel("reference", spec, bundle="ref"), blocks(200.0))

    def build(self, kernel):
        return Built(kernel.key, True, bundle=str(kernel.spec.knobs["tile"]))

    def check(self, kernel, built, reference):
        return Checked(kernel.key, True)

    def time(self, incumbent, kernel, rounds):
        return Timed(kernel.key, incumbent.key, blocks(US[incumbent.spec.knobs.get("tile", 0)] if incumbent.key !=
                                                         "reference" else 200.0), blocks(US[kernel.spec.knobs["tile"]]))

    def yardstick(self, spec, rounds):
        return None

    def prefetch(self, kernels):
        pass


class Script:
    """From tile=1: first an edit the knob class refuses (tile=7), then a valid one (tile=2)."""

    name = "script"

    def propose(self, request):
        if request.knobs["tile"] != 1:
            return []
        edit = {"kind": "knob", "knob": "tile", "was": 1}
        return [Proposal(True, request.parent, {**edit, "value": 7}, {"tile": 7}),
                Proposal(True, request.parent, {**edit, "value": 2}, {"tile": 2})]


def test_refused_knobs_are_recorded_and_the_campaign_goes_on(tmp_path):
    campaign = Campaign(source="pallas", target="cute", family="gemm", shape={"m": 256, "n": 256, "k": 256},
                        dtype="bf16", gpu="h200", beam=1, start_knobs={"tile": 1}, yardstick=False)
    loop = Loop(campaign, Bench(), Script(), Journal(tmp_path / "journal.jsonl"), host().get("gpus", "h200"),
                Knobs, lift=lambda bundle: bundle,
                diff=lambda ref, fp: SimpleNamespace(layers=(("all", 1.0),), rows=()))
    loop.run()
    props = [e for e in loop.events if e["event"] == "proposal" and e["step"] >= 1]
    assert props[0]["ok"] is False and props[0]["reason"].startswith("invalid knobs:"), props[0]
    assert "tile" in props[0]["reason"]
    accepted = [e for e in loop.events if e["event"] == "verdict" and e["decision"] == "accepted"]
    assert any(e["step"] > 1 for e in accepted), [e for e in loop.events if e["event"] == "verdict"]
    assert loop.incumbent.kernel.spec.knobs["tile"] == 2
