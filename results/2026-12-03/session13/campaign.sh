# Device call B (session 13): quack's CuTe DSL rmsnorm as the reference, Pallas as the target, 16384x8192 bf16.
# Needs the staged wheels (. /tmp/site/env.sh). The campaign directory comes back as a tarball without the oracle cache.
set -u
. /tmp/site/env.sh
BUDGET=${BUDGET:-8}
dir=/tmp/h200-quack-rmsnorm-to-pallas-16384
rm -rf "$dir"; mkdir -p "$OUT/campaign"
timeout 570 mosaic run --reference examples/kernels/cute/quack_rmsnorm.py --target pallas --family rmsnorm \
  --shape 16384x8192 --dtype bf16 --gpu h200 --budget-min "$BUDGET" --max-candidates 40 --executor local \
  --out "$dir" > "$OUT/campaign/run.stdout" 2> "$OUT/campaign/run.stderr"
echo "run rc=$?" >> "$OUT/campaign/run.stdout"
tail -30 "$OUT/campaign/run.stdout"; tail -5 "$OUT/campaign/run.stderr"
du -sh "$dir"; ls "$dir"
tar czf "$OUT/campaign/campaign.tgz" -C /tmp --exclude='*oracle*' "$(basename "$dir")"
ls -la "$OUT/campaign"
