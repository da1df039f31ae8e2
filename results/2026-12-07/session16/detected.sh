# Device call 3 of 3 (session 16, issue 33): the last staging part, then everything with no --gpu anywhere:
# the front door's GEMM campaign (Pallas -> CuTe, 4096^3 bf16; benchmarks/gemm_campaign.py runs `mosaic run` without
# --gpu, its first progress line names the detected record) and `mosaic amk bench` (its floor names the record and
# bandwidth it used). Calls 1 and 2 were `bash .stage1/install.sh` and `bash .stage2/install.sh`.
set -u
bash .stage3/install.sh > /tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 3; }
. /tmp/site/env.sh
mkdir -p "$OUT"
{ nvidia-smi -L; echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<unset>}"; } > "$OUT/amk.txt" 2>&1
timeout 410 python3 benchmarks/gemm_campaign.py --target cute --shape 4096x4096x4096 --total 390 \
  --json "$OUT/gemm_campaign.json" > /tmp/campaign.out 2>&1
echo "gemm_campaign rc=$?" >> /tmp/campaign.out
grep -m3 -E "gpu:|error" "$OUT/run.log" "$OUT/run.stdout"; tail -25 /tmp/campaign.out
echo "== mosaic amk bench --shape smollm2-135m (no --gpu) ==" >> "$OUT/amk.txt"
timeout 140 mosaic amk bench --shape smollm2-135m --rounds 2 --steps 32 --time-best 1 >> "$OUT/amk.txt" 2>&1
echo "amk bench rc=$?" >> "$OUT/amk.txt"
cat "$OUT/amk.txt"
