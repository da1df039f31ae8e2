"""Today's knobs proposer on a recorded H200 campaign's bundles, the journal left out (``mosaic run --offline`` of
the campaign file alone: first decisions from the bundles, the proposer asked at every step).

examples/h200-pallas-to-cutlass-gemm-4096 (2026-12-01) converged at step 5 through ping-pong, tma-ws, persistent
and a stream-K compound; its step 5, the compound tile_n=256 + cooperative + tma-cooperative epilogue + a 2x1
cluster, reached the naive translation's knobs plus tile_n=256 and cluster_m=2. Its grid row ([132, 1, 1] vs
[1, 132, 1]: both persistent) is no lead to the schedules any more, so that compound is the first edit and the
campaign converges on its first timed candidate. (Offline, a comparison no session recorded is answered from
each bundle's own recorded blocks: the step's times are those recordings, not an interleaved session.)"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "h200-pallas-to-cutlass-gemm-4096"
MOSAIC = [sys.executable, "-c", "from mosaic.cli import main; main()"]


def campaign_toml(campaign: dict) -> str:
    shape = campaign["shape"]
    lines = [f'shape = "{shape["m"]}x{shape["n"]}x{shape["k"]}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in campaign.items()
              if k != "shape" and v is not None and v != [] and v != {}]
    return "\n".join(lines) + "\n"


def test_the_cutlass_4096_bundles_converge_on_the_first_edit(tmp_path):
    src = tmp_path / "c"
    shutil.copytree(EXAMPLE / "bundles", src / "bundles")
    (src / "campaign.toml").write_text(campaign_toml(json.loads((EXAMPLE / "campaign.json").read_text())))
    out = tmp_path / "out"
    p = subprocess.run([*MOSAIC, "run", "--offline", str(src), "--out", str(out), "--quiet"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, (p.stdout, p.stderr)
    events = [json.loads(x) for x in (out / "journal.jsonl").read_text().splitlines()]
    first = next(e for e in events if e["event"] == "proposal" and e["step"] == 1)
    # aimed at a row of the CTA tile (its shared memory per stage or its k-loop unroll: the causes-first ranking
    # puts either first)
    assert first["edit"]["compound"] is True and first["edit"]["concept"] == "cta-tile"
    assert first["edit"]["row"]["key"] in ("smem.dynamic", "loop.unroll")
    assert [(x["knob"], x["value"]) for x in first["edit"]["parts"]] == [("tile_n", 256), ("cluster_m", 2)]
    recorded = [json.loads(x) for x in (EXAMPLE / "journal.jsonl").read_text().splitlines()]
    winner = next(e for e in recorded if e["event"] == "stop")["incumbent"]
    assert first["key"] == winner  # the recorded campaign's final incumbent, reached there at step 5
    stop = events[-1]
    assert stop["event"] == "stop" and stop["stop"] == "converged" and stop["timed"] == 1
    assert [(e["step"], e["reason_code"]) for e in events if e["event"] == "verdict"] == [(0, "naive"), (1, "faster")]
    assert next(e for e in recorded if e["event"] == "stop")["timed"] == 5
