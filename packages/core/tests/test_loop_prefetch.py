"""The loop hands the first step's candidates to the workbench's prefetch as soon as the naive translation is
built, before its numerics gate and timing, when the proposer is pure (a function of the request): on the H200
the first lowering otherwise started only after them (an 8192^3 gate ~20 s, the first timing ~15 s; a fresh
CUTLASS nvcc build ~40-60 s, session 8's 4096^3 step 1 waited 58.7 s)."""

from types import SimpleNamespace

from mosaic.plugins import host
from mosaic.proposers import Proposal
from mosaic.run.campaign import Campaign
from mosaic.run.journal import Journal
from mosaic.run.loop import Loop
from mosaic.run.replay import Recorded
from mosaic.run.workbench import Built, Checked, Kernel, ReferenceCapture, Timed

US = {"ref": 200.0, "naive": 260.0, "a": 250.0, "b": 199.0}


def blocks(us):
    return [[us * 1e3 * (1 + 1e-4 * i)] * 5 for i in range(10)]


class Bench:
    kind = "offline"

    def __init__(self):
        self.calls = []

    def capture_reference(self, spec):
        return ReferenceCapture(Kernel("reference", spec, bundle="ref"), blocks(US["ref"]))

    def build(self, kernel):
        self.calls.append(("build", kernel.spec.knobs["name"]))
        return Built(kernel.key, True, bundle=kernel.spec.knobs["name"])

    def check(self, kernel, built, reference):
        self.calls.append(("check", kernel.spec.knobs["name"]))
        return Checked(kernel.key, True)

    def time(self, incumbent, kernel, rounds):
        name = kernel.spec.knobs["name"]
        self.calls.append(("time", name))
        return Timed(kernel.key, incumbent.key, blocks(US.get(incumbent.spec.knobs.get("name", "ref"), US["ref"])),
                     blocks(US[name]))

    def yardstick(self, spec, rounds):
        return None

    def prefetch(self, kernels):
        self.calls.append(("prefetch", tuple(k.spec.knobs["name"] for k in kernels)))


class Script:
    name = "script"
    NEXT = {"naive": ["a", "b"], "a": ["b"]}

    def __init__(self, pure):
        self.pure = pure
        self.asked = []

    def propose(self, request):
        parent = request.knobs["name"]
        self.asked.append(parent)
        return [Proposal(True, request.parent, {"kind": "knob", "knob": "name", "value": n, "was": parent},
                         {"name": n}) for n in self.NEXT.get(parent, [])]


def run(tmp_path, pure, recorded=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    campaign = Campaign(source="pallas", target="cute", family="gemm", shape={"m": 4096, "n": 4096, "k": 4096},
                        dtype="bf16", gpu="h200", beam=2, start_knobs={"name": "naive"}, yardstick=False)
    bench, proposer = Bench(), Script(pure)
    loop = Loop(campaign, bench, proposer, Journal(tmp_path / "journal.jsonl"), host().get("gpus", "h200"),
                lift=lambda bundle: bundle, recorded=recorded,
                diff=lambda ref, fp: SimpleNamespace(layers=(("all", 1.0),), rows=()))
    return loop, loop.run(), bench, proposer


def test_a_pure_proposers_first_edits_are_prefetched_before_the_naive_gate(tmp_path):
    loop, out, bench, proposer = run(tmp_path, pure=True)
    calls = bench.calls
    early = calls.index(("prefetch", ("a", "b")))
    assert calls[early - 1] == ("build", "naive") and calls[early + 1] == ("check", "naive")
    assert calls.index(("time", "naive")) > early
    # the verdicts are those of the run without it: the same proposals, in the same order
    verdicts = [(e["step"], e["reason_code"]) for e in loop.events if e["event"] == "verdict"]
    loop2, out2, bench2, _ = run(tmp_path / "other", pure=False)
    assert verdicts == [(e["step"], e["reason_code"]) for e in loop2.events if e["event"] == "verdict"]
    assert verdicts == [(0, "naive"), (1, "faster"), (2, "faster")] and out.stop == out2.stop == "converged"
    # without purity the naive's first edits are asked for (and prefetched) only after its gate and timing
    assert bench2.calls.index(("prefetch", ("a", "b"))) > bench2.calls.index(("time", "naive"))
    assert proposer.asked[0] == "naive" and proposer.asked.count("naive") >= 2  # asked early, then at step 1


def test_a_replayed_run_does_not_ask_the_proposer_early(tmp_path):
    loop, _, _, _ = run(tmp_path / "first", pure=True)
    recorded = Recorded(loop.events, measurements=False)
    _, _, bench, proposer = run(tmp_path / "again", pure=True, recorded=recorded)
    assert ("prefetch", ("a", "b")) not in bench.calls[:bench.calls.index(("check", "naive"))]
