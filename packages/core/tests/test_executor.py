"""The Ray executor on a real local Ray runtime (2 CPUs, no GPU): the lowering stage runs the live lowering
(lower-only captures of the CUTLASS backend) as Ray tasks in the proposer's order, the live workbench in a Ray
actor takes those lowerings instead of lowering again, and a campaign whose workbench sits in a Ray actor
gives exactly the journal (every event, in order) that the sequential in-process run gives."""

import functools
import json
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from mosaic.bundle import load_bundle  # noqa: E402
from mosaic.records import KernelSpec  # noqa: E402
from mosaic.run.campaign import load_campaign  # noqa: E402
from mosaic.run.executor import CaptureLowerer, LoweringStage, RayWorkbench, check_executor  # noqa: E402
from mosaic.run.journal import Journal  # noqa: E402
from mosaic.run.live.parent import PREFETCH_LANGUAGES, LiveWorkbench  # noqa: E402
from mosaic.run.loop import run_campaign  # noqa: E402
from mosaic.run.offline import OfflineWorkbench  # noqa: E402
from mosaic.run.workbench import Kernel, candidate_key  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402

SMALL = {"m": 256, "n": 256, "k": 128}


@pytest.fixture(scope="module")
def runtime():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def unbuildable(tile_n: int) -> Kernel:
    """A CUTLASS knob set the backend refuses (cooperative schedule on a 64-row tile): lowering it is real and
    quick (the plugin's can-implement rules answer, no nvcc)."""
    spec = KernelSpec("gemm", SMALL, "bf16", "cutlass", {"kernel_schedule": "cooperative", "tile_m": 64,
                                                               "tile_n": tile_n})
    return Kernel(candidate_key(spec), spec)


def test_the_lowering_stage_lowers_in_the_proposers_order_with_the_gpu_hidden(runtime):
    stage = LoweringStage(CaptureLowerer("h200", 120.0, PREFETCH_LANGUAGES), parallel=1)
    kernels = [unbuildable(t) for t in (128, 64, 256)]
    stage.submit(kernels)
    stage.submit([kernels[1]])  # named again: not lowered twice
    assert stage.order == [k.key for k in kernels]
    assert list(stage.running) == [kernels[0].key]  # one in flight (parallel=1), the best-ranked first
    got = [stage.take(k.key) for k in kernels]
    assert [g.key for g in got] == [k.key for k in kernels]
    for g in got:
        assert g.status == "unbuildable", g.message
        assert "CUTLASS-COOP-TILE" in g.message and g.wall_s > 0
    assert stage.take(unbuildable(32).key) is None  # never named: nothing to wait for
    stage.submit([unbuildable(64)])  # already lowered and taken: not again
    assert stage.queue == [] and not stage.running
    k4 = unbuildable(32)
    stage.submit([k4])
    ref = stage.claim(k4.key)  # an actor would take this reference as its argument
    assert ray.get(ref).key == k4.key and stage.take(k4.key) is None


def test_the_live_workbench_in_a_ray_actor_builds_from_the_stages_lowering(runtime, tmp_path):
    campaign = load_campaign_text(tmp_path, "cutlass")
    k = unbuildable(128)
    local = LiveWorkbench(campaign, tmp_path / "local")
    try:
        expect = local.build(k)
    finally:
        local.close()
    bench = RayWorkbench(functools.partial(LiveWorkbench, campaign, tmp_path / "ray"),
                         lowerer=CaptureLowerer("h200", 120.0, PREFETCH_LANGUAGES), num_gpus=0, actor_cpus=0)
    try:
        assert bench.kind == "live" and bench.lowering.parallel == 2
        bench.prefetch([k])
        assert bench.lowering.order == [k.key]
        built = bench.build(k)
        assert k.key in bench.lowering.waits  # the loop waited on the stage, the actor did not lower again
    finally:
        bench.close()
    assert (built.ok, built.reason_code, built.reason) == (expect.ok, expect.reason_code, expect.reason)
    assert "CUTLASS-COOP-TILE" in built.reason
    b = load_bundle(built.bundle)
    assert b.manifest["capture"]["status"] == "unbuildable" and b.manifest["mosaic_run"]["key"] == k.key


def load_campaign_text(tmp_path, target: str):
    toml = tmp_path / "campaign.toml"
    toml.write_text(f'source = "pallas"\ntarget = "{target}"\nfamily = "gemm"\nshape = "256x256x128"\n'
                    'dtype = "bf16"\nyardstick = false\n')
    return load_campaign(toml)


def _events(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in path.read_text().splitlines()]


def test_a_campaign_in_a_ray_actor_gives_the_sequential_runs_journal(runtime, tmp_path):
    src = rf.build_campaign(tmp_path / "c", ref_us=rf.UNREACHABLE_US, toml=rf.EXPLORE_TOML)
    campaign = load_campaign(src / "campaign.toml")
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    out_local = run_campaign(campaign, OfflineWorkbench(src, campaign.family, campaign.dtype),
                             Journal.create(local_dir), quiet=True)
    bench = RayWorkbench(functools.partial(OfflineWorkbench, src, campaign.family, campaign.dtype),
                         num_gpus=0, actor_cpus=1)
    out_ray = run_campaign(campaign, bench, Journal.create(ray_dir), quiet=True)  # closes the actor
    assert bench.actors == []
    local, remote = _events(local_dir / "journal.jsonl"), _events(ray_dir / "journal.jsonl")
    verdicts = [(e["step"], e["key"], e["decision"], e["reason_code"]) for e in local if e["event"] == "verdict"]
    assert len(verdicts) >= 12 and {"accepted", "rejected"} <= {v[2] for v in verdicts}
    assert remote == local  # every event, in the same order: the executor changes nothing the journal holds
    assert out_ray == out_local


def test_executor_names_are_checked():
    from mosaic.errors import BadInput

    assert check_executor("local") == "local" and check_executor(None) == "ray"
    with pytest.raises(BadInput, match="unknown executor 'threads'"):
        check_executor("threads")


def test_two_gpus_each_measure_their_noise_and_decide_on_the_gpu_that_timed(runtime, tmp_path):
    from types import SimpleNamespace

    import executor_fixture as ef
    from mosaic.plugins import host
    from mosaic.run.campaign import Campaign
    from mosaic.run.loop import Loop

    ray.cloudpickle.register_pickle_by_value(ef)  # the actors' workers cannot import the tests' directory
    campaign = Campaign(source="pallas", target="cute", family="gemm", shape={"m": 4096, "n": 4096, "k": 4096},
                        dtype="bf16", gpu="h200", beam=2, start_knobs={"name": "naive"}, yardstick=False)

    def loop(bench, path):
        return Loop(campaign, bench, ef.Ranked(), Journal.create(path), host().get("gpus", "h200"),
                    lift=lambda bundle: bundle,
                    diff=lambda ref, fp: SimpleNamespace(layers=(("all", ef.D[fp]),), rows=()))

    seq = loop(ef.SlotBench(0), tmp_path / "one")
    seq.run()
    bench = RayWorkbench(ef.SlotBench, lowerer=ef.ScriptedLowerer(), num_gpus=0, actor_cpus=0, gpus=2)
    try:
        par = loop(bench, tmp_path / "two")
        out = par.run()
        built = [ray.get(a.call.remote("built_keys")) for a in bench.actors]
        adopted = [ray.get(a.call.remote("adopted_keys")) for a in bench.actors]
    finally:
        bench.close()
    verdicts = lambda lp: [(e["step"], e["key"], e["decision"], e["reason_code"])  # noqa: E731
                           for e in lp.events if e["event"] == "verdict"]
    assert verdicts(par) == verdicts(seq)  # in the proposer's order, the same decisions
    assert [v[3] for v in verdicts(par)] == ["naive", "slower", "slower", "faster"] and out.stop == "converged"
    ref = next(e for e in par.events if e["event"] == "reference")
    noise = {u: v["noise"]["value_ns"] for u, v in ref["noise_by_gpu"].items()}
    assert set(noise) == {"slot-0", "slot-1"} and noise["slot-1"] > 3 * noise["slot-0"]
    assert noise["slot-0"] == ref["noise"]["value_ns"]  # the primary GPU's is the campaign's
    timed = [e for e in par.events if e["event"] == "timed"]
    slots = {e["key"]: e["gpu"]["slot"] for e in timed if e["against"] != "reference"}
    # the same candidates timed as one GPU timed (none lost or timed twice), and some of them on the second GPU,
    # where they were evaluated ahead (here all three: slot 0 was busy with the naive translation's pairing)
    assert sorted(slots) == sorted(e["key"] for e in seq.events if e["event"] == "timed" and e["against"] != "reference")
    assert len(timed) == len({(e["key"], e["against"]) for e in timed})
    # the second GPU's evaluations ahead were used: the candidates it built are exactly those timed on it, not none
    on_second = {k for k, slot in slots.items() if slot == 1}
    assert on_second and on_second == set(slots) & set(built[1])
    for e in timed:  # a comparison runs on the GPU that built the candidate: never across GPUs
        assert e["key"] in built[e["gpu"]["slot"]]
    names = {e["key"]: e["knobs"]["name"] for e in par.events if e["event"] == "proposal"}
    for slot in (0, 1):  # every candidate built on a GPU took the stage's lowering (shipped to that actor)
        assert {k: f"lowered {names[k]}" for k in built[slot]} == adopted[slot]
    for v in (e for e in par.events if e["event"] == "verdict" and e["step"] > 0):
        t = next(e for e in timed if e["key"] == v["key"] and e["against"] != "reference")
        assert v["gpu"] == t["gpu"]["uuid"] and v["noise_ns"] == noise[t["gpu"]["uuid"]]
    assert not (tmp_path / "one" / "journal.jsonl").read_text().count("noise_by_gpu")  # one GPU: unchanged
    stop = next(e for e in par.events if e["event"] == "stop")
    assert stop["ahead_unused_cost_s"] == 0.0  # the scripted GPUs cost nothing; said, not counted in the budget
