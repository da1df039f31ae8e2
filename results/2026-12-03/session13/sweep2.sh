# Device call C (session 13): the second copy-ceiling sweep (small blocks: direct loads, one-stage tma_in, registers
# held) and the Pallas row-wise SASS test on the tma_in, direct and block_rows configurations.
set -u
. /tmp/site/env.sh
mkdir -p "$OUT/sweep2"
(cd benchmarks && timeout 320 python3 pallas_copy_ceiling.py --time-budget 250 --json "$OUT/sweep2/pallas_copy_ceiling.json" \
  --only "copy=direct,block_rows=2,vector=4,blocks_per_cta=1;copy=direct,block_rows=2,vector=4,blocks_per_cta=1,hold=registers;copy=direct,block_rows=4,vector=4,blocks_per_cta=1,hold=registers;copy=direct,block_rows=2,vector=4,blocks_per_cta=2,hold=registers;copy=tma_in,block_rows=2,vector=2,blocks_per_cta=1,max_concurrent_steps=1;copy=tma_in,block_rows=2,vector=4,blocks_per_cta=1,max_concurrent_steps=1,hold=registers;copy=tma_in,block_rows=2,vector=2,blocks_per_cta=1,max_concurrent_steps=1,tma_cols=128;block_rows=2,vector=4,blocks_per_cta=2,out_slots=0,hold=registers;copy=tma_in,block_rows=2,vector=4,blocks_per_cta=1,max_concurrent_steps=1,approx_math=true") \
  > "$OUT/sweep2/copy_ceiling.txt" 2>&1
echo "sweep rc=$?" >> "$OUT/sweep2/copy_ceiling.txt"
tail -14 "$OUT/sweep2/copy_ceiling.txt"
timeout 200 python3 -m pytest -m gpu -rA -p no:cacheprovider packages/target-pallas/tests/test_rmsnorm_gpu.py \
  -k "ptx_and_sass and (tma_in or direct or block_rows)" > "$OUT/sweep2/tests.txt" 2>&1
echo "tests rc=$?" >> "$OUT/sweep2/tests.txt"
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" "$OUT/sweep2/tests.txt" | tail -30
