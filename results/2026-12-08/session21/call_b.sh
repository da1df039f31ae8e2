# Device call B (session 21, issue 34), on a machine already staged (. /tmp/site/env.sh): the CUTLASS attention
# runner's first GPU run (its 6 captures; nvcc builds carried as .ccache, a miss rebuilds here), the attention GPU
# tests of the CuTe and CUTLASS plugins and core's yardstick test, then the project's own Pallas attention in bf16
# (jax's attention_mgpu does not lower in bf16) captured against the float64 oracle.
set -u
. /tmp/site/env.sh || exit 3
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p "$OUT"; nvidia-smi -L | tee "$OUT/b.log"
echo "== cutlass attention captures ==" | tee -a "$OUT/b.log"
MOSAIC_CACHE_DIR="$PWD/.ccache" timeout 200 bash packages/target-cutlass/tools/attention_capture_check.sh -o /tmp/cc -j 8 \
  > /tmp/cc.log 2>&1; echo "cutlass check rc=$?" | tee -a "$OUT/b.log"
cat /tmp/cc/summary.txt 2>/dev/null | tee -a "$OUT/b.log"; tail -3 /tmp/cc.log >> "$OUT/b.log"
(cd /tmp/cc 2>/dev/null && tar cf - *.json *.err 2>/dev/null | xz -6 > "$OUT/cutlass_captures.tar.xz")
echo "== pallas project attention bf16 ==" | tee -a "$OUT/b.log"
for spec in "batch=1,seq=512,heads=2,head_dim=128" "batch=2,seq=384,heads=4,head_dim=128,kv_heads=2,causal=1"; do
  timeout 150 mosaic capture --lang pallas --family attention --shape "$spec" --dtype bf16 --knob kernel=project \
    --runs 5 --blocks 2 --timeout 140 --json -o /tmp/pp.bundle > /tmp/pp.json 2> /tmp/pp.err
  echo "rc=$? $spec" | tee -a "$OUT/b.log"
  python3 -c "import json;r=json.load(open('/tmp/pp.json'));s=r.get('summary',{});o=(s.get('oracle') or {}).get('o') or {};print(r['status'],'pass',s.get('numerics_pass'),'t_us',(s.get('time_ns') or 0)/1e3,'err/band',o.get('max_error_over_band'),r.get('message','')[:300])" 2>&1 | tee -a "$OUT/b.log" || tail -5 /tmp/pp.err | tee -a "$OUT/b.log"
done
echo "== GPU tests ==" | tee -a "$OUT/b.log"
timeout 240 python3 -m pytest -q -p no:cacheprovider packages/target-cute/tests/test_attention_gpu.py \
  packages/target-cutlass/tests/test_attention_gpu.py packages/core/tests/test_families_yardsticks.py 2>&1 | tail -15 | tee -a "$OUT/b.log"
