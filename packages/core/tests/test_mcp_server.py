"""`mosaic mcp`: the MCP SDK's own client drives an offline campaign over stdio — reads the report, the
structural diff, the catalog and the parent's source, submits knob, source and diff candidates and gets the
harness's verdicts; hostile submissions are refused with a reason and never crash the campaign; the
finished campaign is re-decided by `mosaic run --offline`."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

mcp = pytest.importorskip("mcp", reason="the MCP Python SDK (pip install mcp==2.3.0)")
anyio = pytest.importorskip("anyio")

sys.path.insert(0, str(Path(__file__).parent))
import test_command_proposer_protocol as cp  # noqa: E402
from mosaic.unified_diff import make_unified_diff  # noqa: E402

MOSAIC = str(Path(sys.executable).parent / "mosaic")


def child_env() -> dict:
    """The server's environment: a plain PATH plus this run's PYTHON* and MOSAIC_* settings (a source tree on
    PYTHONPATH, MOSAIC_LOAD_PLUGINS), nothing else of the caller's."""
    import os

    return {"PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "MOSAIC_"))}}


async def _drive(src: Path, out: Path, script):
    from mcp import ClientSession, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=MOSAIC, args=["mcp", "--campaign", str(src), "--offline", "--out", str(out),
                                                         "--quiet"], env=child_env())
    with open(out.parent / "server.err", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()

                async def call(tool, timeout=None, **args):
                    try:
                        res = await session.call_tool(tool, args, read_timeout_seconds=timeout)
                    except mcp.MCPError as exc:  # the SDK's own refusal (a message it cannot read)
                        return {"sdk_error": str(exc)}
                    text = res.content[0].text if res.content else ""
                    if res.is_error if hasattr(res, "is_error") else res.isError:
                        return {"tool_error": text}
                    return json.loads(text)

                tools = {t.name for t in (await session.list_tools()).tools}
                return tools, await script(call)


def drive(src, out, script):
    return anyio.run(_drive, src, out, script)


def test_an_mcp_client_drives_an_offline_campaign_to_convergence_by_source_edits(tmp_path):
    src = cp.source_campaign(tmp_path / "c")
    out = tmp_path / "mcp"

    async def script(call):
        seen = {"report0": await call("campaign_report"), "diff0": await call("structural_diff"),
                "source0": await call("parent_source"), "catalog": await call("catalog", concept="tma-load"),
                "request0": await call("proposal_request")}
        seen["v1"] = await call("submit_candidate", knobs={"kernel": "hopper"}, why="TMA and wgmma, as the reference")
        seen["v8"] = await call("submit_candidate", knobs={"stages": 8}, why="deeper pipeline")
        seen["request8"] = await call("proposal_request")
        seen["v2"] = await call("submit_candidate", source=cp.SOURCE_BAD, name=cp.NAME, why="persistent tile loop")
        seen["request2"] = await call("proposal_request")
        repair = seen["request2"]["repair"]
        seen["v3"] = await call("submit_candidate", parent=repair["key"],
                                diff=make_unified_diff(cp.SOURCE_BAD, cp.SOURCE_V1, cp.NAME), why="operands swapped")
        seen["source3"] = await call("parent_source")
        seen["v4"] = await call("submit_candidate", diff=make_unified_diff(seen["source3"]["text"], cp.SOURCE_V2,
                                                                           cp.NAME), why="five stages")
        seen["after"] = await call("submit_candidate", knobs={"stages": 6})
        seen["report"] = await call("campaign_report")
        return seen

    tools, seen = drive(src, out, script)
    assert tools == {"campaign_report", "proposal_request", "structural_diff", "catalog", "parent_source",
                     "submit_candidate"}
    assert seen["report0"]["state"]["waiting_for_edit_of"] and seen["report0"]["report"]["reference"]["time_ns"]
    assert seen["diff0"]["rows"] and all("concepts" in r for r in seen["diff0"]["rows"])
    assert seen["source0"]["kind"] == "knobs" and seen["source0"]["knobs"]["kernel"] == "naive"
    [tma] = seen["catalog"]["concepts"]
    assert tma["name"] == "tma-load" and "cute" in tma["languages"]
    assert seen["request0"]["protocol"] == 2 and seen["request0"]["reply"]["limits"]["nesting_depth"] == 64
    # the verdicts are the harness's: gate, timing, the one rule
    assert (seen["v1"]["decision"], seen["v1"]["reason_code"]) == ("accepted", "faster")
    assert seen["v8"]["decision"] == "unbuildable" and "smem-per-block" in seen["v8"]["reason"]
    assert seen["request8"]["repair"]["gate"] == "build" and "smem-per-block" in seen["request8"]["repair"]["reason"]
    assert seen["v2"]["decision"] == "rejected" and seen["v2"]["gate"] == "numerics"
    assert seen["v2"]["key"] == cp.source_key(cp.SOURCE_BAD) and seen["v2"]["t_candidate"] is None
    assert seen["request2"]["repair"]["gate"] == "numerics" and seen["request2"]["repair"]["reason"]
    assert (seen["v3"]["decision"], seen["v3"]["key"]) == ("accepted", cp.source_key(cp.SOURCE_V1))
    assert seen["source3"]["kind"] == "source" and seen["source3"]["text"] == cp.SOURCE_V1
    assert seen["v4"]["decision"] == "accepted" and seen["v4"]["edit"]["origin"] == "diff"
    assert seen["v4"]["t_candidate"] < seen["v4"]["t_incumbent"]
    assert seen["v4"]["state"]["stop"]["code"] == "converged"
    assert seen["after"]["decision"] == "refused" and "finished" in seen["after"]["reason"]
    assert seen["report"]["report"]["stop"]["code"] == "converged"
    # the campaign directory: journal and report, re-decided offline with its proposals replayed
    ev = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    assert ev[0]["proposer"] == "mcp" and ev[-1]["stop"] == "converged"
    assert json.loads((out / "report.json").read_text())["stop"]["code"] == "converged"
    again = tmp_path / "again"
    shutil.copytree(src / "bundles", again / "bundles")
    shutil.copy(out / "journal.jsonl", again / "journal.jsonl")
    re = subprocess.run([MOSAIC, "run", "--offline", str(again), "--quiet"], capture_output=True, text=True,
                        timeout=300)
    assert re.returncode == 0, re.stdout + re.stderr
    assert "all 5 recorded verdicts and the stop reproduced" in re.stdout


def test_hostile_submissions_are_refused_and_the_campaign_goes_on(tmp_path):
    src = cp.source_campaign(tmp_path / "c")
    out = tmp_path / "mcp"
    deep: dict = {}
    cur = deep
    for _ in range(100):  # deeper than mosaic's limit (64), within what the SDK's JSON reader takes
        cur["x"] = {}
        cur = cur["x"]

    deeper: dict = {}
    cur = deeper
    for _ in range(200):
        cur["x"] = {}
        cur = cur["x"]

    async def script(call):
        seen = {}
        # too deep for the SDK's own JSON reader: the server drops the message (no answer) and stays up
        seen["too_deep"] = await call("submit_candidate", timeout=5, knobs={"stages": deeper})
        seen["state0"] = (await call("campaign_report"))["state"]
        seen["wrong_type"] = await call("submit_candidate", knobs="stages=5")  # the SDK's schema refuses it
        seen["deep"] = await call("submit_candidate", knobs={"stages": deep})
        seen["binary"] = await call("submit_candidate", source="\x00\x01ELF\x02")
        seen["ok"] = await call("submit_candidate", knobs={"kernel": "hopper"})  # resets the failure count
        seen["huge"] = await call("submit_candidate", source="x" * (cp.REPLY_LIMITS["source_bytes"].value + 10))
        seen["nodiff"] = await call("submit_candidate", diff="@@ -1 +1 @@\n-not there\n+x\n")
        seen["traversal"] = await call("submit_candidate", source="k", name="../../x.py")
        seen["report"] = await call("campaign_report")
        return seen

    _, seen = drive(src, out, script)
    assert "timed out" in seen["too_deep"]["sdk_error"]
    assert seen["state0"]["step"] == 0 and seen["state0"]["waiting_for_edit_of"] and not seen["state0"]["finished"]
    assert "tool_error" in seen["wrong_type"]
    assert seen["deep"]["decision"] == "refused" and "levels is over the limit" in seen["deep"]["reason"]
    assert seen["binary"]["decision"] == "refused" and "binary data" in seen["binary"]["reason"]
    assert seen["ok"]["decision"] == "accepted"
    assert "over the limit" in seen["huge"]["reason"]
    assert "does not apply" in seen["nodiff"]["reason"] or "knob set" in seen["nodiff"]["reason"]
    assert "plain file name" in seen["traversal"]["reason"]
    # three refusals in a row exhaust the hopper member (the campaign's own rule); the loop goes on with the
    # next beam member, nothing crashed
    state = seen["report"]["state"]
    assert state["error"] is None and state["stop"] is None and state["waiting_for_edit_of"]
    ev = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    refused = [e["reason"] for e in ev if e["event"] == "proposal" and not e["ok"] and not e.get("done")]
    assert len(refused) == 5 and "binary data" in refused[1]  # what the SDK refused never reached the loop
    assert [e["reason_code"] for e in seen["report"]["report"]["edits"]].count("proposal") == 5
    # when the client goes, the session ends: every further request is 'done' and the campaign stops
    assert ev[-1]["event"] == "stop" and ev[-1]["stop"] == "exhausted"
    assert json.loads((out / "report.json").read_text())["stop"]["code"] == "exhausted"


def test_mosaic_mcp_bad_input_is_one_line(tmp_path):
    p = subprocess.run([MOSAIC, "mcp", "--campaign", str(tmp_path / "none")], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [f"error: no such campaign directory ({tmp_path / 'none'})"]
    (tmp_path / "empty").mkdir()
    p = subprocess.run([MOSAIC, "mcp", "--campaign", str(tmp_path / "empty"), "--offline"], capture_output=True,
                       text=True)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "campaign.toml" in p.stderr


LIVE_TOML = """\
source = "pallas"
target = "cute"
family = "gemm"
shape = "4096x4096x4096"
dtype = "bf16"
gpu = "h200"
budget_min = 3.0
max_candidates = 3
start_knobs = {kernel = "naive"}
"""


@pytest.mark.gpu
def test_an_mcp_client_drives_a_live_campaign_on_the_gpu(tmp_path):
    """On the H200: the SDK's client drives `mosaic mcp` on a live Pallas -> CuTe campaign (three knob edits the
    agent reads off the structural diff); the verdicts it gets are the journal's, and `mosaic run --offline`
    reproduces them from the bundles."""
    import importlib

    pytest.importorskip("jax", minversion="0.11.2", reason="needs jax >= 0.11.2 (Python >= 3.12) for the Pallas plugin")
    pytest.importorskip("cutlass.cute", reason="needs nvidia-cutlass-dsl for the CuTe plugin")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a CUDA device")
    from mcp import ClientSession, StdioServerParameters, stdio_client

    gc = importlib.import_module("gemm_campaign")  # benchmarks/ is on pytest's pythonpath
    env = gc.environment("cute")
    d = tmp_path / "campaign"
    d.mkdir()
    (d / "campaign.toml").write_text(LIVE_TOML)
    plan = [{"kernel": "hopper"}, {"persistent": True}, {"cluster_mn": [2, 1]}]

    async def main():
        params = StdioServerParameters(command=MOSAIC, args=["mcp", "--campaign", str(d)], env=env)
        with open(tmp_path / "server.err", "w") as errlog, anyio.fail_after(560):
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                verdicts = []
                for knobs in plan:
                    rows = json.loads((await s.call_tool("structural_diff", {})).content[0].text)
                    if rows.get("finished"):
                        break
                    res = await s.call_tool("submit_candidate", {"knobs": knobs, "why": "live MCP test"})
                    verdicts.append(json.loads(res.content[0].text))
                return verdicts

    verdicts = anyio.run(main)
    assert verdicts, (tmp_path / "server.err").read_text()[-3000:]
    ev = [json.loads(x) for x in (d / "journal.jsonl").read_text().splitlines() if x.strip()]
    recorded = {e["step"]: e for e in ev if e["event"] == "verdict"}
    for v in verdicts:
        if v["decision"] in ("accepted", "rejected"):
            assert recorded[v["step"]]["decision"] == v["decision"]
            assert recorded[v["step"]]["reason_code"] == v["reason_code"]
    assert ev[0]["proposer"] == "mcp" and ev[-1]["event"] == "stop"
    off = subprocess.run(gc.offline_command(d), capture_output=True, text=True, env=env, timeout=300)
    assert off.returncode == 0, off.stdout[-2000:] + off.stderr[-2000:]
    assert "recorded verdicts and the stop reproduced" in off.stdout
    print("\n".join(gc.summary_lines(d)))
    print(json.dumps(verdicts, indent=1)[:4000])


def test_a_campaign_that_stops_on_an_error_is_said_and_the_server_stays_up(tmp_path):
    import run_fixture as rf
    from mosaic.records import KernelSpec
    from mosaic.run.loop import full_knobs
    from mosaic.run.workbench import candidate_key, save_kernel_bundle

    src = cp.source_campaign(tmp_path / "c")
    # the hopper candidate's bundle without its timings: the offline workbench cannot time it (a BundleError)
    spec = KernelSpec("gemm", rf.SHAPE, "bf16", "cute", full_knobs(cp.knob_cls(), rf.HOPPER))
    key = candidate_key(spec)
    _, lau, _, _, _, _ = rf.model(rf.HOPPER)
    save_kernel_bundle(src / "bundles" / f"cand-{key}.bundle", spec=spec, key=key, role="candidate",
                       files=rf._sass("tma", lau), outputs=rf.small_problem()[1], cost_s=6.0, gpu="h200")
    out = tmp_path / "mcp"

    async def script(call):
        return {"v": await call("submit_candidate", knobs={"kernel": "hopper"}),
                "report": await call("campaign_report"), "late": await call("submit_candidate", knobs={"stages": 5})}

    _, seen = drive(src, out, script)
    assert seen["v"]["decision"] == "unfinished" and "no recorded timing" in seen["v"]["reason"]
    assert seen["report"]["state"]["finished"] and "no recorded timing" in seen["report"]["state"]["error"]
    assert seen["late"]["decision"] == "refused" and "finished" in seen["late"]["reason"]
    rep = json.loads((out / "report.json").read_text())  # what was decided before the error, reported
    assert rep["stop"] is None and [e["step"] for e in rep["edits"]] == [0, 1]
    err = (tmp_path / "server.err").read_text().strip().splitlines()
    assert err and err[-1].startswith("error: ") and "no recorded timing" in err[-1] and "Traceback" not in "".join(err)
