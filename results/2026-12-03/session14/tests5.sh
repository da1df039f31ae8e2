# Device call (session 14, after softmax.sh on the same warm machine): the SASS test's configs that tests2 did not reach.
set -u
. /tmp/site/env.sh
mkdir -p "$OUT/tests"
timeout 150 python3 -m pytest -m gpu -rA -p no:cacheprovider packages/target-pallas/tests/test_rmsnorm_gpu.py \
  -k "ptx_and_sass and not (tma_in or direct or block_rows)" > "$OUT/tests/tests5.txt" 2>&1
echo "tests5 rc=$?" >> "$OUT/tests/tests5.txt"
grep -E "FAILED|ERROR|passed|failed|rc=" "$OUT/tests/tests5.txt" | tail -12
