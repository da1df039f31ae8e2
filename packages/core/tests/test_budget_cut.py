"""When the device-minute budget runs out with a candidate's gate in flight, the kernel gets no verdict: the step is
recorded as not judged (reason code ``budget``), not as a numerics failure that would mark the kernel wrong and keep
the proposer from offering it again; the report says so, and the campaign stops on its budget. (The H200 quack
rmsnorm -> Pallas campaign of session 12 recorded its last candidate as 'failed numerics: budget: killed after 1 s'.)"""

from types import SimpleNamespace

from mosaic.plugins import host
from mosaic.proposers import Proposal
from mosaic.run.campaign import Campaign
from mosaic.run.journal import Journal, read_campaign_journal
from mosaic.run.loop import Loop, proposer_history
from mosaic.run.report import build_report, to_markdown
from mosaic.run.workbench import Built, Checked, Kernel, ReferenceCapture, Timed

US = {"ref": 200.0, "naive": 230.0, "a": 215.0, "b": 205.0}  # none within the reference's noise


def blocks(us):
    return [[us * 1e3 * (1 + 1e-4 * i)] * 5 for i in range(10)]


def name(kernel):
    return kernel.spec.knobs.get("name", "ref")


class Bench:
    """The gate of 'b' is cut by the budget, with what was left of it (as the live workbench's would be)."""
    kind = "offline"

    def capture_reference(self, spec):
        return ReferenceCapture(Kernel("reference", spec, bundle="ref"), blocks(US["ref"]), cost_s=20.0)

    def build(self, kernel):
        return Built(kernel.key, True, bundle=name(kernel), cost_s=5.0)

    def check(self, kernel, built, reference):
        if name(kernel) == "b":
            return Checked(kernel.key, False, "budget: killed after 9 s, what is left of the 1 device-minute budget, "
                           "with the gate in flight (no verdict on the kernel's numerics)", 9.0, judged=False)
        return Checked(kernel.key, True, cost_s=5.0)

    def time(self, incumbent, kernel, rounds):
        return Timed(kernel.key, incumbent.key, blocks(US.get(name(incumbent), US["ref"])), blocks(US[name(kernel)]),
                     cost_s=2.0)

    def yardstick(self, spec, rounds):
        return None


class Two:
    name = "two"

    def propose(self, request):
        return [Proposal(True, request.parent, {"kind": "knob", "knob": "name", "value": v}, {"name": v})
                for v in ("a", "b")]


def test_a_gate_cut_by_the_budget_is_not_judged_and_the_campaign_stops_on_its_budget(tmp_path):
    c = Campaign(source="pallas", target="cute", family="gemm", shape={"m": 4096, "n": 4096, "k": 4096},
                 dtype="bf16", gpu="h200", start_knobs={"name": "naive"}, budget_min=1.0, yardstick=False)
    loop = Loop(c, Bench(), Two(), Journal(tmp_path / "journal.jsonl"), host().get("gpus", "h200"),
                lift=lambda bundle: bundle, diff=lambda ref, fp: SimpleNamespace(layers=(("all", 1.0),), rows=()))
    out = loop.run()
    events, _ = read_campaign_journal(tmp_path / "journal.jsonl")
    verdicts = [(e["decision"], e["reason_code"]) for e in events if e["event"] == "verdict"]
    assert verdicts[-1] == ("unjudged", "budget")
    assert ("rejected", "numerics") not in verdicts
    assert out.stop == "budget"
    # the proposer's history: outcome 'budget' (no retry block), no repair request (nothing was wrong with it)
    last = proposer_history(events)[-1]
    assert last["outcome"] == "budget" and not last["accepted"] and loop.repair is None
    rep = build_report(events)
    row = rep["edits"][-1]
    assert (row["outcome"], row["reason_code"]) == ("unjudged", "budget")
    assert "unjudged (budget)" in to_markdown(rep)
    numerics = [e for e in events if e["event"] == "numerics"]
    assert numerics[-1]["judged"] is False and all(e["judged"] for e in numerics[:-1])


def test_a_knob_edit_whose_gate_was_cut_is_no_retry_block():
    from mosaic.proposers.knobs import blocked

    history = [{"edit": {"kind": "knob", "knob": "stages", "value": 5, "was": 4}, "knobs": {"stages": 5},
                "outcome": "budget", "accepted": False}]
    reverts, retries = blocked(history, {})
    assert not retries and not reverts
