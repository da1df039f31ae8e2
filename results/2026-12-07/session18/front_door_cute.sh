# Device call 2 of 2 (session 18, issue 33): the README's front door, Pallas -> CuTe DSL 4096^3 bf16, with no
# --gpu anywhere, after `bash .stage1/install.sh` in call 1. The staging is two parts this time (CuTe DSL 4.8.1,
# cupti-python, CUPTI; no CUTLASS headers: the CuTe target builds none), 44.7 + 42.9 MB beside the 17.6 MB tree.
set -u
bash .stage2/install.sh > /tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 3; }
. /tmp/site/env.sh
mkdir -p "$OUT"
{ nvidia-smi -L; echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<unset>}"; } > "$OUT/amk.txt" 2>&1
timeout 270 python3 benchmarks/gemm_campaign.py --target cute --shape 4096x4096x4096 --total 260 \
  --budget-min 2.5 --max-candidates 40 --offline-timeout 40 --json "$OUT/gemm_campaign.json" > /tmp/campaign.out 2>&1
echo "gemm_campaign rc=$?" >> /tmp/campaign.out
grep -m3 -E "gpu:|error" "$OUT/run.log" "$OUT/run.stdout"; tail -25 /tmp/campaign.out
echo "== mosaic amk bench --shape smollm2-135m (no --gpu) ==" >> "$OUT/amk.txt"
timeout 45 mosaic amk bench --shape smollm2-135m --rounds 1 --steps 16 --time-best 1 >> "$OUT/amk.txt" 2>&1
echo "amk bench rc=$?" >> "$OUT/amk.txt"
grep -E "gpu:|floor|amk\[|hf " "$OUT/amk.txt"
