"""The beam keeps a closer-but-slower candidate (not the incumbent) and expands it for a bounded number of
follow-up steps, so a structural step that is briefly slower is not lost; the accept rule is unchanged."""

from types import SimpleNamespace

from mosaic.plugins import host
from mosaic.proposers import Proposal
from mosaic.run.campaign import Campaign
from mosaic.run.journal import Journal
from mosaic.run.loop import BEAM_HOLD_STEPS, Loop
from mosaic.run.workbench import Built, Checked, Kernel, ReferenceCapture, Timed

US = {"ref": 200.0, "naive": 260.0, "wide": 270.0, "wide+deep": 198.0, "naive+x": 262.0}  # device time, us
D = {"ref": 0.0, "naive": 2.0, "wide": 1.0, "wide+deep": 0.5, "naive+x": 2.0}  # fingerprint distance


def name(kernel):
    return kernel.spec.knobs.get("name", "ref")


def blocks(us):
    return [[us * 1e3 * (1 + 1e-4 * i)] * 5 for i in range(10)]


class Bench:
    kind = "offline"

    def capture_reference(self, spec):
        return ReferenceCapture(Kernel("reference", spec, bundle="ref"), blocks(US["ref"]))

    def build(self, kernel):
        return Built(kernel.key, True, bundle=name(kernel))

    def check(self, kernel, built, reference):
        return Checked(kernel.key, True)

    def time(self, incumbent, kernel, rounds):
        return Timed(kernel.key, incumbent.key, blocks(US.get(name(incumbent), US["ref"])), blocks(US[name(kernel)]))

    def yardstick(self, spec, rounds):
        return None

    def prefetch(self, kernels):
        pass


class Script:
    """naive -> wide (closer, slower) and naive -> naive+x; wide -> wide+deep (faster than the incumbent)."""

    name = "script"
    NEXT = {"naive": ["wide", "naive+x"], "wide": ["wide+deep"]}

    def propose(self, request):
        parent = request.knobs["name"]
        return [Proposal(True, request.parent, {"kind": "knob", "knob": "name", "value": n, "was": parent},
                         {"name": n}) for n in self.NEXT.get(parent, [])]


def test_a_closer_but_slower_candidate_is_kept_and_expanded_and_its_child_wins(tmp_path):
    campaign = Campaign(source="pallas", target="cute", family="gemm", shape={"m": 4096, "n": 4096, "k": 4096},
                        dtype="bf16", gpu="h200", beam=2, start_knobs={"name": "naive"}, yardstick=False)
    loop = Loop(campaign, Bench(), Script(), Journal(tmp_path / "journal.jsonl"), host().get("gpus", "h200"),
                lift=lambda bundle: bundle,
                diff=lambda ref, fp: SimpleNamespace(layers=(("all", D[fp]),), rows=()))
    out = loop.run()
    ev = loop.events
    verdicts = [(e["step"], e["reason_code"], e.get("closer_but_slower")) for e in ev if e["event"] == "verdict"]
    assert verdicts[1] == (1, "slower", True)  # wide: 270 vs 260 us, but closer (D 1.0 < 2.0)
    props = [e for e in ev if e["event"] == "proposal" and e["step"] >= 1]
    by_key = {e["key"]: e for e in props}
    # step 2 expands the kept candidate (not the incumbent): its child is timed against the incumbent
    assert props[1]["parent"] == by_key[props[0]["key"]]["key"] and props[1]["knobs"]["name"] == "wide+deep"
    assert verdicts[2] == (2, "faster", False)
    beams = [e["members"] for e in ev if e["event"] == "beam"]
    assert [m["knobs"]["name"] for m in beams[1]] == ["naive", "wide"]  # kept although slower
    assert out.stop == "converged" and loop.incumbent.kernel.spec.knobs["name"] == "wide+deep"
    assert BEAM_HOLD_STEPS >= 1


def test_the_report_shows_each_beam_members_lineage_and_the_shape_as_typed(tmp_path):
    from mosaic.run.report import build_report, to_markdown

    campaign = Campaign(source="pallas", target="cute", family="gemm", shape={"m": 8192, "n": 4096, "k": 2048},
                        dtype="bf16", gpu="h200", beam=2, start_knobs={"name": "naive"}, yardstick=False)
    loop = Loop(campaign, Bench(), Script(), Journal(tmp_path / "journal.jsonl"), host().get("gpus", "h200"),
                lift=lambda bundle: bundle,
                diff=lambda ref, fp: SimpleNamespace(layers=(("all", D[fp]),), rows=()))
    loop.run()
    from mosaic.run.journal import read_campaign_journal

    events, _ = read_campaign_journal(tmp_path / "journal.jsonl")  # sorted keys, as on disk
    assert list(events[0]["campaign"]["shape"]) == ["k", "m", "n"]
    rep = build_report(events)
    key = {e["knobs"]["name"]: e["key"] for e in events if e["event"] == "proposal"}
    after1 = rep["beams"][1]
    assert after1["step"] == 1
    roles = {m["knobs"]["name"]: (m["role"], [(x["step"], x["link"]) for x in m["lineage"]])
             for m in after1["members"]}
    assert roles == {"naive": ("incumbent", [(0, "naive")]), "wide": ("held", [(0, "naive"), (1, "held")])}
    final = rep["beams"][-1]["members"][0]
    assert final["role"] == "incumbent" and final["key"] == key["wide+deep"]
    # wide+deep descends from the held step 1, not from the incumbent directly
    assert [(x["step"], x["key"], x["link"]) for x in final["lineage"]] == [
        (0, key["naive"], "naive"), (1, key["wide"], "held"), (2, key["wide+deep"], "accepted")]
    md = to_markdown(rep)
    assert md.splitlines()[0].startswith("# mosaic run: pallas -> cute, gemm 8192x4096x2048 bf16")
    assert "## Beam lineage" in md and "[0 naive -> 1 held -> 2 accepted]" in md


def test_the_proposers_history_carries_what_each_verdict_said(tmp_path):
    from mosaic.run.loop import proposer_history

    campaign = Campaign(source="pallas", target="cute", family="gemm", shape={"m": 4096, "n": 4096, "k": 4096},
                        dtype="bf16", gpu="h200", beam=2, start_knobs={"name": "naive"}, yardstick=False)
    loop = Loop(campaign, Bench(), Script(), Journal(tmp_path / "journal.jsonl"), host().get("gpus", "h200"),
                lift=lambda bundle: bundle,
                diff=lambda ref, fp: SimpleNamespace(layers=(("all", D[fp]),), rows=()))
    loop.run()
    said = {e["key"]: e["reason"] for e in loop.events if e["event"] == "verdict"}
    history = proposer_history(loop.events)
    assert [h["outcome"] for h in history] == ["slower", "faster"]
    assert all(h["reason"] == said[h["key"]] and h["reason"] for h in history)
    assert loop.request(loop.beam[0]).source is None  # a knob-only kernel has no source text to show
