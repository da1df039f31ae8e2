# Device call (session 14; session 13's campaign.sh with the tar fixed): quack's CuTe DSL rmsnorm as the reference, Pallas as the target, 16384x8192 bf16.
# Needs the staged wheels (. /tmp/site/env.sh). The campaign directory comes back as a tarball without its work dir (.work: the float64 oracle cache, gate scratch, worker logs) and lock; the bundles keep their oracle.json.
set -u
. /tmp/site/env.sh
BUDGET=${BUDGET:-8}
TIMEOUT=${TIMEOUT:-570}
FAMILY=${FAMILY:-rmsnorm}   # rmsnorm or softmax: quack's kernel file examples/kernels/cute/quack_$FAMILY.py
C=${C:-campaign}
dir=/tmp/h200-quack-$FAMILY-to-pallas-16384
rm -rf "$dir"; mkdir -p "$OUT/$C"
timeout "$TIMEOUT" mosaic run --reference examples/kernels/cute/quack_$FAMILY.py --target pallas --family $FAMILY \
  --shape 16384x8192 --dtype bf16 --gpu h200 --budget-min "$BUDGET" --max-candidates 40 --executor local \
  --out "$dir" > "$OUT/$C/run.stdout" 2> "$OUT/$C/run.stderr"
echo "run rc=$?" >> "$OUT/$C/run.stdout"
tail -30 "$OUT/$C/run.stdout"; tail -5 "$OUT/$C/run.stderr"
du -sh "$dir"; ls "$dir"
tar czf "$OUT/$C/campaign.tgz" -C /tmp --exclude=.work --exclude=.mosaic-run.lock "$(basename "$dir")"
ls -la "$OUT/$C"
