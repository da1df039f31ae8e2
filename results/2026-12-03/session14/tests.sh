# Device call (session 14, after the last staging part): the Pallas row-wise GPU tests touched in sessions 13-14.
# tests1: the SASS test on the copy='tma_in' / 'direct' / block_rows configurations (expectations fixed from session
# 13's SASS: generic ST.E stores); tests2: the whole SASS test plus every oracle test of copy='tma_in' and 'direct'.
set -u
. /tmp/site/env.sh
mkdir -p "$OUT/tests"
timeout 130 python3 -m pytest -m gpu -rA -p no:cacheprovider packages/target-pallas/tests/test_rmsnorm_gpu.py \
  -k "ptx_and_sass and (tma_in or direct or block_rows)" > "$OUT/tests/tests1.txt" 2>&1
echo "tests1 rc=$?" >> "$OUT/tests/tests1.txt"
grep -E "memory opcodes|PASSED|FAILED|ERROR|passed|failed|rc=" "$OUT/tests/tests1.txt" | tail -40
timeout 330 python3 -m pytest -m gpu -rA -p no:cacheprovider packages/target-pallas/tests/test_rmsnorm_gpu.py \
  -k "(ptx_and_sass and not (tma_in or direct or block_rows)) or ((tma_in or direct) and not ptx_and_sass)" > "$OUT/tests/tests2.txt" 2>&1
echo "tests2 rc=$?" >> "$OUT/tests/tests2.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$OUT/tests/tests2.txt" | tail -20
