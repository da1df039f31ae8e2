# Device calls B (session 20, issue 34): one live attention campaign, Pallas (jax's attention_mgpu, f16: its bf16
# does not lower in jax 0.11.2) -> the project's CuTe DSL attention, with the command users type (through
# benchmarks/gemm_campaign.py: `mosaic run` with no --gpu, then `mosaic run --offline`), then every attention
# yardstick alone at the same shape (benchmarks/family_yardsticks.py). Usage: campaign.sh STAGE SHAPE TOTAL_S BUDGET_MIN
set -u
stage=$1 shape=$2 total=$3 budget=$4
ls -a /tmp/stage 2>/dev/null | grep got | tr '\n' ' '; echo
if [ -n "$stage" ] && [ ! -f /tmp/site/.pythonpath ]; then
  bash "$stage/install.sh" > /tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 3; }
fi
. /tmp/site/env.sh
# core as committed (a copy of HEAD's packages/core/src carried as .clean/, first on the path): another engineer's
# uncommitted edits in the checkout's core travel with the tree and must not run in the campaign
[ -d .clean/packages/core/src/mosaic ] && export PYTHONPATH="$PWD/.clean/packages/core/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import mosaic, sys; print('mosaic from', mosaic.__file__)"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p "$OUT"
nvidia-smi -L
timeout $((total + 20)) python3 benchmarks/gemm_campaign.py --target cute --family attention --dtype f16 \
  --shape "$shape" --total "$total" --budget-min "$budget" --max-candidates 40 --offline-timeout 60 \
  --json "$OUT/gemm_campaign.json" > /tmp/campaign.out 2>&1
echo "campaign rc=$?"
grep -m3 -E "gpu:|error" "$OUT/run.log"; tail -30 /tmp/campaign.out
[ -n "${SKIP_YARDSTICKS:-}" ] && exit 0  # the campaign itself captures and pairs every yardstick (HEAD's core)
timeout 90 python3 benchmarks/family_yardsticks.py --family attention --shape "$shape" --dtype f16 --runs 10 --blocks 3 \
  --json "$OUT/yardsticks.json"
echo "yardsticks rc=$?"
