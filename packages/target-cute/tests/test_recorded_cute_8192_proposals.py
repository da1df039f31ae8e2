"""Today's knobs proposer on the recorded Pallas -> CuTe 8192^3 bundles (H200, 2026-12-02, session 10;
results/2026-12-02/session10/cute-8192/campaign.tar.xz), the journal left out: ``mosaic run --offline`` of the
campaign file alone, the proposer asked at every step, each step's times the bundles' own recordings.

The recorded run (not converged at its 270 s wall, 10 timed): persistent=true (rejected, slower), swizzle 2/4/8
(accepted), then at step 5 the COMPOUND tile_mn=[128, 256] + cluster_mn=[2, 1] (rule CUTE-MULTICAST; the
summary line printed only its first part), then two cluster edits, tile_mn=[64, 256] and stages 3/2, all lost.

persistent=true was rejected on the naive's 4096 128x128 tiles; with the retry rule reading only the CuTe
constructs (``knob: persistent`` names no other knob) it was barred for the rest of the campaign, although the
4096^3 winner is exactly 128x256 + persistent. The knob class now says persistence interacts with the tiling
(``metadata={"interacts": ("tile_mn", "cluster_mn")}``): on the 128x256 2x1 tiling it is proposed again (step 12,
after the tiling and cluster edits); on the naive's tiling it is still not retried.

Since the proposer goes round-robin over causes, the grid cause (persistent, swizzle) and the
loop.unroll cause (the compound tiling) alternate: the compound edit is asked for on the naive and on swizzle=2
(neither recorded: a device question, stepped over), and reaches the recorded final incumbent from swizzle=8 at
step 7, two steps later than the layer order did, because each unrecorded try costs a step offline that a device
run would have measured."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "results" / "2026-12-02" / "session10" / "cute-8192" / "campaign.tar.xz"
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]
FINAL = "ff7494c00e1f462c"  # the recorded run's final incumbent (step 5)


def campaign_toml(campaign: dict) -> str:
    shape = campaign["shape"]
    lines = [f'shape = "{shape["m"]}x{shape["n"]}x{shape["k"]}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in campaign.items()
              if k != "shape" and v is not None and v != [] and v != {}]
    return "\n".join(lines) + "\n"


def label(edit: dict) -> str:
    if edit.get("compound"):
        return " + ".join(f"{p['knob']}={p['value']}" for p in edit["parts"])
    return f"{edit['knob']}={edit['value']}"


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cute8192")
    with tarfile.open(RECORDED) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith("gemm-campaign/bundles/") or m.name == "gemm-campaign/campaign.json"]
        tar.extractall(tmp, members=members, filter="data")
    src = tmp / "gemm-campaign"
    (src / "campaign.toml").write_text(campaign_toml(json.loads((src / "campaign.json").read_text())))
    (src / "campaign.json").unlink()
    out = tmp / "out"
    p = subprocess.run([*MOSAIC, "run", "--offline", str(src), "--out", str(out), "--quiet"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, (p.stdout, p.stderr)
    return [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]


def test_the_recorded_steps_replay_and_the_compound_edit_reaches_the_final(replay):
    proposals = {e["step"]: e for e in replay if e["event"] == "proposal"}
    verdicts = {e["step"]: e["reason_code"] for e in replay if e["event"] == "verdict"}
    compound = "tile_mn=[128, 256] + cluster_mn=[2, 1]"
    assert [label(proposals[s]["edit"]) for s in range(1, 8)] == [
        "persistent=True", compound, "swizzle=2", compound, "swizzle=4", "swizzle=8", compound]
    # round-robin: the grid cause and the loop.unroll cause alternate, each cause's best edit first
    assert [proposals[s]["edit"]["row"]["key"] for s in (1, 2, 3)] == ["grid", "loop.unroll", "grid"]
    assert [verdicts[s] for s in (0, 1, 3, 5, 6, 7)] == ["naive", "slower", "faster", "faster", "faster", "faster"]
    assert 2 not in verdicts and 4 not in verdicts  # the compound on unrecorded parents: never timed offline
    seven = proposals[7]
    assert seven["key"] == FINAL and seven["parent"] == proposals[6]["key"]
    assert seven["edit"]["parts"][1]["rule"] == "CUTE-MULTICAST"
    stop = replay[-1]
    assert stop["event"] == "stop" and stop["incumbent"] == FINAL and stop["timed"] == 10


def test_persistent_comes_back_on_the_wide_tiling_and_not_on_the_naive_one(replay):
    from_final = [e for e in replay if e["event"] == "proposal" and e.get("parent") == FINAL and e.get("key")]
    order = [label(e["edit"]) for e in from_final]
    assert order[:5] == ["tile_mn=[64, 256]", "cluster_mn=[2, 2]", "stages=3", "cluster_mn=[1, 2]",
                         "persistent=True"], order
    persistent = from_final[4]
    final_knobs = next(e["knobs"] for e in replay if e["event"] == "proposal" and e.get("key") == FINAL)
    assert persistent["knobs"] == {**final_knobs, "persistent": True}
    assert persistent["knobs"]["tile_mn"] == [128, 256] and persistent["knobs"]["swizzle"] == 8
    build = next(e for e in replay if e["event"] == "build" and e["key"] == persistent["key"])
    assert not build["ok"] and "not recorded" in build["reason"]  # no session measured it: a device question
    naive_tiling = [e for e in replay if e["event"] == "proposal" and e.get("key")
                    and (e["edit"] or {}).get("knob") == "persistent"
                    and e["knobs"]["tile_mn"] == [128, 128] and e["knobs"]["cluster_mn"] == [1, 1]]
    assert [e["step"] for e in naive_tiling] == [1]  # rejected there once: never retried on the same tiling


def test_the_cute_knob_class_ties_persistence_to_the_tiling():
    from mosaic.catalog import catalog_from_host
    from mosaic.plugins import host
    from mosaic.proposers.knobs import KnobsProposer
    from mosaic.run.campaign import Campaign

    c = Campaign.from_json({"source": "pallas", "target": "cute", "family": "gemm", "dtype": "bf16", "gpu": "h200",
                            "shape": {"m": 8192, "n": 8192, "k": 8192}})
    p = KnobsProposer(c, host().get("languages", "cute").backend.knobs("gemm"), catalog_from_host(host()))
    got = p.interactions()
    assert {"tile_mn", "cluster_mn"} <= got["persistent"]
    assert "persistent" in got["tile_mn"] and "persistent" in got["cluster_mn"]
    assert "persistent" not in got.get("stages", set())  # a stage count says nothing of the tile loop
