# Device call 3 of 3 (session 17, issue 33): the README's front door target (Pallas -> CuTe DSL) with no --gpu,
# after `bash .stage1/install.sh` and `bash .stage2/install.sh` (CuTe DSL 4.8.1 and cupti-python in three parts).
set -u
bash .stage3/install.sh > /tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 3; }
. /tmp/site/env.sh
mkdir -p "$OUT"
{ nvidia-smi -L; echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<unset>}"; } > "$OUT/amk.txt" 2>&1
timeout 380 python3 benchmarks/gemm_campaign.py --target cute --shape 4096x4096x4096 --total 360 \
  --json "$OUT/gemm_campaign.json" > /tmp/campaign.out 2>&1
echo "gemm_campaign rc=$?" >> /tmp/campaign.out
grep -m3 -E "gpu:|error" "$OUT/run.log" "$OUT/run.stdout"; tail -25 /tmp/campaign.out
echo "== mosaic amk bench --shape smollm2-135m (no --gpu) ==" >> "$OUT/amk.txt"
timeout 80 mosaic amk bench --shape smollm2-135m --rounds 1 --steps 16 --time-best 1 >> "$OUT/amk.txt" 2>&1
echo "amk bench rc=$?" >> "$OUT/amk.txt"
grep -E "gpu:|floor|contender|amk\[|hf " "$OUT/amk.txt"
