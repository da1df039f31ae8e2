# One device call (session 17, issue 33): CUPTI, cupti-python and the CUTLASS headers staged in one part
# (.stage1c, 26 MB beside the 17 MB tree), then everything with no --gpu anywhere: a Pallas -> CUTLASS GEMM
# campaign at 4096^3 bf16 through benchmarks/gemm_campaign.py (it runs `mosaic run` without --gpu; the first
# progress line names the detected record) and `mosaic amk bench` (its floor names the record and bandwidth).
# The CuTe DSL target needs two more staging parts (CuTe DSL's 64 MB of wheels): device time was too short.
set -u
bash .stage1c/install.sh > /tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 3; }
. /tmp/site/env.sh
mkdir -p "$OUT"
{ nvidia-smi -L; echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-<unset>}"; } > "$OUT/amk.txt" 2>&1
timeout 400 python3 benchmarks/gemm_campaign.py --target cutlass --shape 4096x4096x4096 --total 380 \
  --json "$OUT/gemm_campaign.json" > /tmp/campaign.out 2>&1
echo "gemm_campaign rc=$?" >> /tmp/campaign.out
grep -m3 -E "gpu:|error" "$OUT/run.log" "$OUT/run.stdout"; tail -25 /tmp/campaign.out
echo "== mosaic amk bench --shape smollm2-135m (no --gpu) ==" >> "$OUT/amk.txt"
timeout 120 mosaic amk bench --shape smollm2-135m --rounds 2 --steps 32 --time-best 1 >> "$OUT/amk.txt" 2>&1
echo "amk bench rc=$?" >> "$OUT/amk.txt"
cat "$OUT/amk.txt"
