"""The built-in proposers: knobs (row -> catalog -> knob) and command (an agent in a subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from mosaic.catalog import catalog_from_host
from mosaic.plugins import host
from mosaic.proposers import Request, proposers
from mosaic.proposers.command import CommandProposer, parse_reply
from mosaic.proposers.knobs import KnobsProposer, construct_knobs
from mosaic.records import Discrepancy
from mosaic.run.campaign import Campaign

sys.path.insert(0, str(Path(__file__).parent))
import run_fixture as rf  # noqa: E402

HERE = Path(__file__).parent
MOSAIC = str(Path(sys.executable).parent / "mosaic")


def campaign(**kw):
    return Campaign(source="pallas", target="cute", family="gemm", shape=rf.SHAPE, dtype="bf16", **kw)


def request(knobs, rows, **kw):
    return Request(campaign={}, parent="p", knobs=knobs, rows=rows, layers=(), incumbent={}, reference={},
                   tried=frozenset(), **kw)


def test_builtins_are_registered_directly():
    assert {"knobs", "command"} <= set(proposers())


def test_construct_knob_parsing():
    assert construct_knobs("x; knobs: raster, swizzle") == [("raster", None), ("swizzle", None)]
    assert construct_knobs("plain loads; knob: kernel='naive'") == [("kernel", "naive")]
    assert construct_knobs("knob: kernel='jax-hopper' (warp-specialised) vs 'pipelined' (not)") == [
        ("kernel", "jax-hopper")]
    assert construct_knobs("no knob here") == []


def test_knobs_proposer_maps_rows_through_the_catalog():
    knob_cls = host().get("languages", "cute").backend.knobs("gemm")
    p = KnobsProposer(campaign(), knob_cls, catalog_from_host(host()))
    rows = [Discrepancy("instruction", "transfer.form", ["tma"], ["ld.global"], 1, "rewrite"),
            Discrepancy("launch", "smem.dynamic", 167936, 0, 2, "knob")]
    out = p.propose(request(rf.NAIVE, rows))
    # the knob row comes first but no stage count is legal for the naive kernel; the rewrite row's
    # plain-global-load concept is pinned to kernel='naive' in cute's catalog: leave it for the default
    assert [(e.edit["knob"], e.edit["value"]) for e in out] == [("kernel", "hopper")]
    assert out[0].edit["concept"] == "plain-global-load" and out[0].knobs["kernel"] == "hopper"
    rows = [Discrepancy("launch", "cluster", [2, 1, 1], [1, 1, 1], 1, "knob"),
            Discrepancy("control", "pipeline.stages", 5, 4, 2, "knob")]
    out = p.propose(request(rf.HOPPER, rows))
    edits = [(e.edit["knob"], e.edit["value"]) for e in out]
    assert edits[0] == ("cluster_mn", [2, 1])  # the reference's value first
    assert ("stages", 5) in edits and edits.index(("stages", 5)) < edits.index(("stages", 8))
    assert all(knob_cls(**e.knobs) for e in out)  # every proposal is legal for the knob class


def test_knobs_proposer_puts_knob_rows_before_rewrite_rows():
    knob_cls = host().get("languages", "cute").backend.knobs("gemm")
    p = KnobsProposer(campaign(), knob_cls, catalog_from_host(host()))
    rows = [Discrepancy("control", "persistent", True, False, 1, "rewrite"),
            Discrepancy("control", "pipeline.stages", 5, 4, 2, "knob")]
    out = p.propose(request(rf.HOPPER, rows))
    edits = [(e.edit["knob"], e.edit["value"]) for e in out]
    assert edits[0] == ("stages", 5) and edits.index(("persistent", True)) > edits.index(("stages", 5))
    # 8 stages of a 128x128x64 bf16 tile (262144 B) do not fit the H200's 232448 B and no partner change mends
    # it (the edit sets the stages): the CPU predicate refuses it, so it comes last, after the rewrite row's
    # edit, marked with the rule it breaks (the build still decides, if the loop gets that far)
    assert edits[-1] == ("stages", 8) and out[-1].edit["violates"] == ["smem-per-block"]
    assert not any("violates" in e.edit for e in out[:-1])


@pytest.mark.parametrize("text, reason", [
    ("", "printed nothing"),
    ("raise the stage count", "not JSON"),
    ("[1, 2]", "JSON list"),
    ('{"knobs": {"stages": 4}, "rm": "-rf"}', "unknown field(s) rm"),
    ('{"knobs": [1]}', "'knobs' must be an object"),
    ('{"knobs": {"stages": {"deep": 1}}}', "type dict"),
    ('{"source": 7}', "full text"),
    ('{}', "changes nothing"),
    ('{"parent": "nope", "knobs": {"stages": 5}}', "not a kernel the proposer was offered"),
])
def test_malformed_replies_are_recorded_rejections(text, reason):
    p = parse_reply(text, request(rf.HOPPER, []), {"p"})
    assert not p.ok and reason in p.reason


def test_good_replies():
    p = parse_reply('{"knobs": {"stages": 5}, "why": "ref has 5 stages"}', request(rf.HOPPER, []), {"p"})
    assert p.ok and p.knobs["stages"] == 5 and p.knobs["kernel"] == "hopper" and p.edit["knob"] == "stages"
    src = parse_reply(json.dumps({"source": "kernel text", "name": "gemm.py"}), request(rf.HOPPER, []), {"p"})
    assert src.ok and src.edit["kind"] == "source" and len(src.edit["sha256"]) == 64
    assert parse_reply('{"done": true}', request(rf.HOPPER, []), {"p"}).done


def test_command_timeout_exit_status_and_missing_program(tmp_path):
    slow = campaign(proposer="command", command=[sys.executable, "-c", "import time; time.sleep(5)"],
                    command_timeout_s=0.5)
    out = CommandProposer(slow).propose(request(rf.HOPPER, []))
    assert not out[0].ok and "within 0.5 s" in out[0].reason
    bad = campaign(proposer="command", command=[sys.executable, "-c", "import sys; sys.exit(4)"])
    assert "status 4" in CommandProposer(bad).propose(request(rf.HOPPER, []))[0].reason
    gone = campaign(proposer="command", command=[str(tmp_path / "no-such-agent")])
    assert "could not be started" in CommandProposer(gone).propose(request(rf.HOPPER, []))[0].reason


def agent_command() -> str:
    """The agent's command line, as a user names it: an offline run or a resume runs only what the user names."""
    import shlex

    return shlex.join([sys.executable, str(HERE / "agent_script.py")])


def agent_campaign(root, mode="plan", delay=0.0):
    toml = rf.CAMPAIGN_TOML.replace('beam = 3', 'beam = 3\nproposer = "command"\ncommand_timeout_s = 30\n'
                                    f'command = ["{sys.executable}", "{HERE / "agent_script.py"}"]')
    extra = [{**rf.HOPPER, "cluster_mn": [2, 1], "raster": "n", "swizzle": 2}]
    return rf.build_campaign(root, toml=toml, sets=rf.knob_sets() + extra)


def run_agent(src, log, mode="plan", delay=0.0, out=None):
    env = {"AGENT_LOG": str(log), "AGENT_MODE": mode, "AGENT_DELAY": str(delay), "PATH": "/usr/bin:/bin"}
    args = [MOSAIC, "run", "--offline", str(src), "--quiet", "--command", agent_command()]
    args += ["--out", str(out)] if out else []
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)


def test_the_agent_drives_the_loop_and_numerics_failures_go_back_for_repair(tmp_path):
    src = agent_campaign(tmp_path / "c")
    log = tmp_path / "agent.log"
    done = run_agent(src, log)
    assert done.returncode == 0, done.stderr
    ev = [json.loads(x) for x in (src / "offline" / "journal.jsonl").read_text().splitlines()]
    verdicts = [(e["step"], e["reason_code"]) for e in ev if e["event"] == "verdict"]
    assert verdicts == [(0, "naive"), (1, "faster"), (2, "faster"), (3, "numerics"), (4, "faster"), (6, "faster")]
    timed_keys = {e["key"] for e in ev if e["event"] == "timed"}
    failed = next(e["key"] for e in ev if e["event"] == "verdict" and e["reason_code"] == "numerics")
    assert failed not in timed_keys  # a failing candidate is never timed
    seen = [json.loads(x) for x in log.read_text().splitlines()]
    assert seen[0]["format"] == "mosaic-proposal-request" and seen[0]["rows"]
    assert seen[3]["repair"]["key"] == failed and "differ" in seen[3]["repair"]["reason"]
    # the agent is told every built edit's outcome (converge.proposer_history)
    assert seen[3]["outcomes"] == [[1, "faster", True], [2, "faster", True], [3, "numerics", False]]
    assert ev[-1]["stop"] == "converged"


@pytest.mark.parametrize("mode, reason", [("garbage", "not JSON"), ("crash", "status 3")])
def test_a_misbehaving_agent_is_a_recorded_rejection_not_a_crash(tmp_path, mode, reason):
    src = agent_campaign(tmp_path / "c")
    done = run_agent(src, tmp_path / "agent.log", mode=mode)
    assert done.returncode == 0, done.stderr
    ev = [json.loads(x) for x in (src / "offline" / "journal.jsonl").read_text().splitlines()]
    rejected = [e for e in ev if e["event"] == "proposal" and not e["ok"]]
    assert rejected and reason in rejected[0]["reason"]
    assert ev[-1]["event"] == "stop"


@pytest.mark.parametrize("language, tile_knobs", [("cute", ["tile_mn", "tile_k"]),
                                                  ("cutlass", ["tile_n", "tile_m", "tile_k"]),
                                                  ("pallas", ["tile_m", "tile_n", "tile_k", "block_rows", "blocks_per_cta"])])
def test_every_construct_knob_is_a_field_and_cta_tile_names_the_tile(language, tile_knobs):
    """Every knob a catalog construct names is a field of one of the language's knob classes (any family)."""
    import attrs

    lang = host().get("languages", language)
    fields = {f.name for family in lang.families for cls in [lang.backend.knobs(family)] if attrs.has(cls)
              for f in attrs.fields(cls)}
    cat = catalog_from_host(host())
    for entry in cat.for_language(language):
        for knob, _ in construct_knobs(entry.construct.expression if entry.construct else ""):
            assert knob in fields, f"{entry.concept.name}@{language}: {knob!r} is not a {language} knob field"
    assert [k for k, _ in construct_knobs(cat.entry("cta-tile", language).construct.expression)] == tile_knobs


def test_tile_rows_move_the_cta_tile_and_concepts_more_rows_agree_on_come_first():
    knob_cls = host().get("languages", "cute").backend.knobs("gemm")
    p = KnobsProposer(campaign(), knob_cls, catalog_from_host(host()))
    rows = [Discrepancy("launch", "smem.dynamic", 229440, 148480, 1, "knob"),
            Discrepancy("instruction", "hot_loop.mix", {"mma": 1.0, "wgmma.sync": 0.25},
                        {"mma": 1.0, "wgmma.sync": 0.5}, 2, "knob")]
    out = p.propose(request(rf.HOPPER, rows))
    # cta-tile is named by both rows, pipeline-stage and the epilogue by one: the tile comes first
    assert [e.edit["concept"] for e in out[:3]] == ["cta-tile"] * 3
    assert (out[0].edit["knob"], out[0].edit["value"]) == ("tile_mn", [128, 256])  # (256, 128) is not legal
    assert {e.edit["concept"] for e in out[3:]} == {"pipeline-stage", "epilogue-tma-store"}
    only_mix = p.propose(request(rf.HOPPER, rows[1:]))
    assert {e.edit["concept"] for e in only_mix} == {"cta-tile"}


def test_a_grid_row_is_a_lead_to_persistence_only_when_one_side_is_persistent():
    from mosaic.proposers.knobs import row_concepts

    h200 = host().get("gpus", "h200")  # 132 SMs
    shape_only = Discrepancy("launch", "grid", [132, 1, 1], [1, 132, 1], 1, "knob")  # both persistent
    names = [c for c, _ in row_concepts(shape_only, h200)]
    assert "persistent-tile-loop" not in names and names == ["tile-raster-swizzle"]
    waves = Discrepancy("launch", "grid", [132, 1, 1], [1, 1, 4096], 1, "knob")  # 4096 CTAs: not persistent
    assert [c for c, _ in row_concepts(waves, h200)] == ["persistent-tile-loop", "tile-raster-swizzle"]
    # the test reads the GPU record: on 114 SMs a 114-CTA grid is persistent and a 132-CTA one is not
    small = attrs.evolve(h200, sm_count=114)
    assert "persistent-tile-loop" not in [c for c, _ in row_concepts(shape_only, small)]  # neither is
    one_side = Discrepancy("launch", "grid", [114, 1, 1], [1, 132, 1], 1, "knob")
    assert "persistent-tile-loop" in [c for c, _ in row_concepts(one_side, small)]
    assert "persistent-tile-loop" not in [c for c, _ in row_concepts(one_side, h200)]
    # no GPU record: it cannot be told, the row keeps the concept
    assert "persistent-tile-loop" in [c for c, _ in row_concepts(shape_only)]
