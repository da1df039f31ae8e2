#!/usr/bin/env bash
# Issue 6 on the lent H200: ONE live convergence campaign, Pallas -> CuTe (TARGET=cutlass for CUTLASS), bf16 GEMM
# (SHAPE, default 4096x4096x4096), with the command users type (`mosaic run ...`), then `mosaic run --offline` on
# its directory, which must reproduce every verdict from the bundles alone.
#
# From the repository root, after ../shared/device/stage-gpu-wheels.sh (cupti-python + CUTLASS headers):
#   run(carry=[".stage1"], command="bash .stage1/install.sh")
#   run(carry=[".stage2"], command="bash .stage2/install.sh && bash scripts/device/issue6.sh")
# (a machine still warm from the staging needs only: run(command="bash scripts/device/issue6.sh")).
#
# ISOLATION=step runs the one-process-per-request workbench instead of the persistent worker (for comparison).
# Wall time: about 4-5 minutes (pip ~20 s; campaign capped by WALL=270 s, budget 3 device minutes, 5 timed
# candidates; offline re-decision ~15 s). Writes under $OUT:
#   campaign.tar.gz  the campaign directory: report.md/.html/.json, journal.jsonl, campaign.json,
#                    bundles/*.bundle (4096^3 outputs kept by SHA-256), offline/ (the re-decision)
#   report.md, report.json, offline-report.json, run.log (progress lines), offline.txt, summary.txt
set -uo pipefail
export PYTHONPATH="$(cat /tmp/site/.pythonpath 2>/dev/null || true)${PYTHONPATH:+:$PYTHONPATH}"
export MOSAIC_CUTLASS_INCLUDE=${MOSAIC_CUTLASS_INCLUDE:-/tmp/site/cutlass_library/source/include}
export MOSAIC_CACHE_DIR=${MOSAIC_CACHE_DIR:-/tmp/mosaic-cache}
TARGET=${TARGET:-cute}     # or cutlass
SHAPE=${SHAPE:-4096x4096x4096}
export MOSAIC_LOAD_PLUGINS=${MOSAIC_LOAD_PLUGINS:-hopper,pallas,$TARGET}
export MOSAIC_NVCC_TIMEOUT=${MOSAIC_NVCC_TIMEOUT:-240}
OUT=${OUT:-/tmp/issue6-out}
DIR=${ISSUE6_DIR:-/tmp/issue6-campaign}
BUDGET_MIN=${BUDGET_MIN:-3}
MAX_CAND=${MAX_CAND:-5}
WALL=${WALL:-270}
ISOLATION=${ISOLATION:-worker}  # worker: one persistent process for gates and timings; step: one per request
mkdir -p "$OUT"
rm -rf "$DIR"
T0=$(date +%s)
MOSAIC=(python3 -c "from mosaic.cli import main; main()")

[ -f "$MOSAIC_CUTLASS_INCLUDE/cutlass/cutlass.h" ] || echo "warning: no CUTLASS headers at $MOSAIC_CUTLASS_INCLUDE (run the staging)"
python3 -c "import cupti" 2>/dev/null || echo "warning: cupti-python is not importable: timings fall back to CUDA events (each bundle says so)"
python3 -m pip install -q --no-deps --no-build-isolation -e packages/core -e packages/gpu-hopper \
  -e packages/target-pallas -e packages/target-cutlass -e packages/target-cute 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader

echo "== live campaign: mosaic run --source pallas --target $TARGET ... (wall cap ${WALL} s) =="
timeout -s INT -k 30 "$WALL" "${MOSAIC[@]}" run --source pallas --target "$TARGET" --family gemm \
  --shape "$SHAPE" --dtype bf16 --gpu h200 --budget-min "$BUDGET_MIN" --max-candidates "$MAX_CAND" \
  --isolation "$ISOLATION" --out "$DIR" > "$OUT/run.stdout" 2> "$OUT/run.log"
rc=$?
cat "$OUT/run.log" "$OUT/run.stdout"
echo "live campaign: exit $rc after $(( $(date +%s) - T0 )) s"

echo "== offline re-decision from the bundles =="
"${MOSAIC[@]}" run --offline "$DIR" --out "$DIR/offline" --quiet > "$OUT/offline.txt" 2>&1
orc=$?
cat "$OUT/offline.txt"
echo "offline: exit $orc"

[ -f "$DIR/journal.jsonl" ] && [ ! -f "$DIR/report.md" ] && python3 -c \
  "from mosaic.run.report import write_report; write_report('$DIR')" 2>&1 | tail -1  # stopped by the wall cap
for f in report.md report.json; do [ -f "$DIR/$f" ] && cp "$DIR/$f" "$OUT/$f"; done
[ -f "$DIR/offline/report.json" ] && cp "$DIR/offline/report.json" "$OUT/offline-report.json"
python3 - "$DIR" > "$OUT/summary.txt" <<'EOF'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
try:
    events = [json.loads(x) for x in (d / "journal.jsonl").read_text().splitlines() if x.strip()]
except OSError as exc:
    print(f"no journal: {exc}"); sys.exit(0)
us = lambda v: f"{v / 1e3:.2f}" if isinstance(v, (int, float)) else "-"
for e in events:
    if e["event"] == "reference":
        print(f"reference: {us(e['time_ns'])} us, noise {us(e['noise']['value_ns'])} us; floor {us(e['floor_ns'])} us; cost {e['cost_s']:.0f} s")
    elif e["event"] == "yardstick":
        print(f"cuBLAS (same run): {us(e['time_ns'])} us")
    elif e["event"] == "build":
        print(f"  build {e['key']} step {e['step']}: {'ok' if e['ok'] else e['reason_code'] + ': ' + e['reason'][:160]} ({e['cost_s']:.0f} s)")
    elif e["event"] == "verdict":
        edit = e.get("edit") or {}
        what = f"{edit.get('knob')}={edit.get('value')}" if edit.get("kind") == "knob" else edit.get("kind", "naive")
        print(f"step {e['step']} {e['key']} {what}: {e['decision']} ({e['reason_code']}) "
              f"{us(e.get('t_candidate'))} vs {us(e.get('t_incumbent'))} us")
    elif e["event"] == "stop":
        print(f"stop: {e['reason']}; incumbent {e['incumbent']} {us(e['t_incumbent_ns'])} us vs reference "
              f"{us(e['t_reference_ns'])} us; {e['timed']} timed; {e['cost_s'] / 60:.2f} device minutes counted")
        print(f"  knobs: {e['incumbent_knobs']}")
        print(f"  remaining differences: {', '.join(r['key'] for r in e['remaining'])}")
# per kernel: what its cost was spent on, and which process ran its gate and timings (isolation records)
for b in sorted((d / "bundles").glob("cand-*.bundle")) if (d / "bundles").is_dir() else []:
    m = json.loads((b / "manifest.json").read_text())
    cap, run = m.get("capture") or {}, m.get("mosaic_run") or {}
    iso = cap.get("isolation") or {}
    ref = ((cap.get("summary") or {}).get("oracle_reference") or {}).get("source", "-")
    t = json.loads((b / "timings.json").read_text()) if (b / "timings.json").is_file() else {}
    sess = [f"{s.get('wall_s', 0):.1f} s ({(s.get('isolation') or {}).get('mode', '-')} pid "
            f"{(s.get('isolation') or {}).get('pid', '-')} req {(s.get('isolation') or {}).get('request', '-')})"
            for s in t.get("sessions") or []]
    print(f"  cost {b.name[5:-7]}: total {run.get('cost_s', 0):.1f} s; gate {cap.get('wall_s', 0):.1f} s "
          f"({iso.get('mode', '-')} pid {iso.get('pid', '-')} req {iso.get('request', '-')}, "
          f"reference {ref}{', RETRIED' if iso.get('first_attempt') else ''}); timings {', '.join(sess) or '-'}")
EOF
cat "$OUT/summary.txt"

tar czf "$OUT/campaign.tar.gz" -C "$(dirname "$DIR")" --exclude=.work "$(basename "$DIR")"
size=$(stat -c %s "$OUT/campaign.tar.gz")
if [ "$size" -gt 16000000 ]; then  # keep the return under 16 MiB: drop PTX (SASS, cubin and logs stay)
  tar czf "$OUT/campaign.tar.gz" -C "$(dirname "$DIR")" --exclude=.work --exclude='*.ptx' "$(basename "$DIR")"
  echo "campaign.tar.gz without PTX (was $size bytes)"
fi
echo "wrote $OUT/campaign.tar.gz ($(stat -c %s "$OUT/campaign.tar.gz") bytes); total $(( $(date +%s) - T0 )) s"
