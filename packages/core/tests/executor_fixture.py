"""A scripted workbench for the Ray executor's tests: one per GPU slot, each slot its own device (its times
scaled by its own factor, its own block-to-block spread, so its own reference noise). Every answer is a
plain function of (slot, kernel) — no GPU, no randomness."""

from mosaic.proposers import Proposal
from mosaic.run.executor import Lowered
from mosaic.run.workbench import Built, Checked, Kernel, ReferenceCapture, Timed

US = {"ref": 200.0, "naive": 260.0, "a": 275.0, "b": 270.0, "c": 199.0}  # device time on slot 0, us
D = {"ref": 0.0, "naive": 2.0, "a": 2.5, "b": 2.4, "c": 1.0}  # fingerprint distance to the reference
SCALE = {0: 1.0, 1: 1.1}  # slot 1 is a slower device
SPREAD = {0: 2e-4, 1: 8e-4}  # and a noisier one


def name(kernel):
    return kernel.spec.knobs.get("name", "ref")


class SlotBench:
    kind = "offline"

    def __init__(self, slot: int = 0):
        self.slot = slot
        self.built: list[str] = []
        self.adopted: dict[str, str] = {}

    def adopt(self, key, lowered):
        self.adopted[key] = lowered.message

    def adopted_keys(self):
        return dict(self.adopted)

    def blocks(self, us):
        return [[us * SCALE[self.slot] * 1e3 * (1 + SPREAD[self.slot] * ((i % 3) - 1))] * 5 for i in range(10)]

    def capture_reference(self, spec):
        return ReferenceCapture(Kernel("reference", spec, bundle="ref"), self.blocks(US["ref"]))

    def build(self, kernel):
        self.built.append(kernel.key)
        return Built(kernel.key, True, bundle=name(kernel))

    def built_keys(self):
        return list(self.built)

    def check(self, kernel, built, reference):
        return Checked(kernel.key, True)

    def time(self, incumbent, kernel, rounds):
        return Timed(kernel.key, incumbent.key, self.blocks(US.get(name(incumbent), US["ref"])),
                     self.blocks(US[name(kernel)]))

    def yardstick(self, spec, rounds):
        return None

    def bundle_path(self, key):
        return None


class Ranked:
    """naive -> a, b, c in that order (a and b slower, c faster); nothing after."""

    name = "ranked"

    def propose(self, request):
        if request.knobs["name"] != "naive":
            return []
        return [Proposal(True, request.parent, {"kind": "knob", "knob": "name", "value": n, "was": "naive"},
                         {"name": n}) for n in ("a", "b", "c")]


class ScriptedLowerer:
    """Stands in for a language's lower-only capture: answers at once, naming what it lowered."""

    def accepts(self, kernel):
        return kernel.source is None

    def __call__(self, key, spec_json):
        return Lowered(key, "lowered", f"lowered {spec_json['knobs']['name']}")
