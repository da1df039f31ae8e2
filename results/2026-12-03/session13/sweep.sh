# Device call A (session 13): the row-wise copy ceiling with copy='tma_in' configurations, then the Pallas row-wise
# SASS test on the tma_in and default configurations. Needs the staged wheels (. /tmp/site/env.sh).
set -u
. /tmp/site/env.sh
mkdir -p "$OUT/sweep"
(cd benchmarks && timeout 300 python3 pallas_copy_ceiling.py --time-budget 230 --json "$OUT/sweep/pallas_copy_ceiling.json" \
  --only "block_rows=2,vector=4,blocks_per_cta=2,out_slots=0;copy=tma_in,block_rows=2,vector=4,blocks_per_cta=2;copy=tma_in,block_rows=2,vector=4;copy=tma_in,block_rows=2,vector=4,blocks_per_cta=8,max_concurrent_steps=3;copy=tma_in,block_rows=2,vector=4,blocks_per_cta=4,max_concurrent_steps=3;copy=tma_in,block_rows=4,vector=4,blocks_per_cta=2;copy=tma_in;copy=tma_in,block_rows=2,vector=4,blocks_per_cta=1,max_concurrent_steps=1") \
  > "$OUT/sweep/copy_ceiling.txt" 2>&1
echo "sweep rc=$?" >> "$OUT/sweep/copy_ceiling.txt"
tail -25 "$OUT/sweep/copy_ceiling.txt"
timeout 180 python3 -m pytest -m gpu -rA -p no:cacheprovider packages/target-pallas/tests/test_rmsnorm_gpu.py \
  -k "ptx_and_sass and (copy=tma_in or copy=direct or rmsnorm-block_rows)" > "$OUT/sweep/tests.txt" 2>&1
echo "tests rc=$?" >> "$OUT/sweep/tests.txt"
tail -15 "$OUT/sweep/tests.txt"
