# Device call A (session 20): the first GPU run of the project's CuTe DSL attention (kernels/hopper_attention.py,
# kernels/naive_attention.py) and of the CUTLASS attention template (its self-check binary, built here with nvcc
# and carried, run in call 1: call1.sh), each config captured through `mosaic capture` (float64 oracle, outputs kept in the bundle), then
# `mosaic amk bench` with no --gpu (issue 33's floor line on the detected GPU). Run after .stage1 and .stage2,
# in the call that carries .stage3.
set -u
bash .stage3/install.sh > /tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 3; }
. /tmp/site/env.sh
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p "$OUT" /tmp/a/cute
nvidia-smi -L | tee "$OUT/a.log"
# name|shape|knobs(space separated)|dtype
cat > /tmp/a/configs <<'CFG'
naive|batch=1,seq=256,heads=2,head_dim=128|kernel=naive|f16
default|batch=1,seq=512,heads=2,head_dim=128||f16
default-bf16|batch=1,seq=512,heads=2,head_dim=128||bf16
causal|batch=1,seq=512,heads=2,head_dim=128,causal=1||f16
gqa-causal|batch=2,seq=384,heads=4,head_dim=128,kv_heads=2,causal=1||f16
tail300|batch=1,seq=300,heads=2,head_dim=128||f16
causal-tail300|batch=1,seq=300,heads=2,head_dim=128,causal=1||f16
psmem-n64-s3|batch=1,seq=512,heads=2,head_dim=128,causal=1|p_in=smem block_n=64 stages=3|f16
pingpong|batch=1,seq=512,heads=2,head_dim=128|pingpong=true|f16
persistent|batch=2,seq=512,heads=4,head_dim=128,causal=1|persistent=true|f16
d64-1wg|batch=1,seq=512,heads=2,head_dim=64,kv_heads=1|consumer_warpgroups=1 block_m=128 block_n=64|f16
noskip-causal|batch=1,seq=512,heads=2,head_dim=128,causal=1|causal_skip=false|f16
CFG
one() {
  IFS='|' read -r name shape knobs dtype <<< "$1"
  args=(); for k in $knobs; do args+=(--knob "$k"); done
  timeout 200 mosaic capture --lang cute --family attention --shape "$shape" --dtype "$dtype" "${args[@]}" \
    --runs 5 --blocks 2 --timeout 180 --json -o "/tmp/a/cute/$name.bundle" > "/tmp/a/cute/$name.json" 2> "/tmp/a/cute/$name.err"
  rc=$?
  python3 - "$name" "$rc" <<'PY'
import json, sys
name, rc = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(f"/tmp/a/cute/{name}.json")); s = r.get("summary", {})
    o = (s.get("oracle") or {}).get("o") or {}
    print(f"{name:16s} rc={rc} status={r['status']:16s} pass={s.get('numerics_pass')} t_us={(s.get('time_ns') or 0)/1e3:.2f} "
          f"err/band={o.get('max_error_over_band')} failures={o.get('failures')} worst={o.get('worst_index')} msg={r.get('message','')[:300]}")
except Exception as e:
    print(f"{name:16s} rc={rc} no json ({e}); stderr: " + open(f'/tmp/a/cute/{name}.err').read()[-600:].replace(chr(10), ' | '))
PY
}
export -f one
echo "== cute attention captures ==" | tee -a "$OUT/a.log"
timeout 420 xargs -d '\n' -P 4 -I{} bash -c 'one "$@"' _ {} < /tmp/a/configs | tee -a "$OUT/a.log"
(cd /tmp/a && tar cf - cute | xz -T0 -6 > "$OUT/cute_attention.tar.xz")
echo "== mosaic amk bench --shape smollm2-135m (no --gpu) ==" >> "$OUT/amk.txt"
timeout 120 mosaic amk bench --shape smollm2-135m --rounds 2 --steps 32 --time-best 1 >> "$OUT/amk.txt" 2>&1
echo "amk bench rc=$?" >> "$OUT/amk.txt"
grep -E "gpu:|floor|amk\[|hf |rc=" "$OUT/amk.txt"
