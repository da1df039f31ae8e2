#!/usr/bin/env bash
# Capture the CUTLASS attention through the plugin's device runner: every configuration of
# tools/attention_capture_configs.txt by `mosaic capture --lang cutlass --family attention ... --json` (the float64
# oracle on the family's seeded inputs, then CUPTI timing), one line each:
#   NAME rc= status= pass= t_us= err/band= failures= grid= block= smem= msg=
#
#   packages/target-cutlass/tools/attention_capture_check.sh [--build-only] [-o DIR] [-j JOBS]
#
# First every configuration is lowered with --lower-only, JOBS (default 6) nvcc builds at a time (about 30-60 s each;
# cached under $MOSAIC_CACHE_DIR, default ~/.cache/mosaic), then each is captured in turn, alone on the GPU (so its
# timing is not disturbed by the others). --build-only stops after the builds (no GPU needed). Bundles, each capture's
# JSON and stderr, and summary.txt (the lines) go to DIR (default /tmp/cutlass_attention_check). $PYTHON (default
# python3) runs mosaic; the CUTLASS headers come from $MOSAIC_CUTLASS_INCLUDE or pip's nvidia-cutlass, as for every
# cutlass build. On the lent device, after staging: . /tmp/site/env.sh && bash packages/target-cutlass/tools/...
# Exit status: 0 every capture passed the oracle, 1 one did not, 2 a setup problem or a failed build.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir=/tmp/cutlass_attention_check
jobs=6
build_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) build_only=1 ;;
    -o) dir="$2"; shift ;;
    -j) jobs="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
export PYTHON="${PYTHON:-python3}" PYTHONUNBUFFERED=1 DIR="$dir"
command -v nvcc >/dev/null || { echo "error: nvcc is not on PATH" >&2; exit 2; }
mkdir -p "$dir"
grep -v '^#' "$here/attention_capture_configs.txt" | grep -v '^[[:space:]]*$' > "$dir/configs"

# one configuration: lower (--lower-only) or capture; $1 = the table's line, $2 = lower|capture
one() {
  IFS='|' read -r name shape knobs dtype <<< "$1"
  args=(); for k in $knobs; do args+=(--knob "$k"); done
  if [ "$2" = lower ]; then
    "$PYTHON" -c "from mosaic.cli import main; main()" capture --lang cutlass --family attention --shape "$shape" \
      --dtype "$dtype" "${args[@]}" --lower-only --force -o "$DIR/$name.lowered.bundle" > "$DIR/$name.lower.out" 2>&1
    rc=$?
    echo "built $name rc=$rc $(tail -1 "$DIR/$name.lower.out" | cut -c1-300)"
    return $rc
  fi
  timeout 900 "$PYTHON" -c "from mosaic.cli import main; main()" capture --lang cutlass --family attention \
    --shape "$shape" --dtype "$dtype" "${args[@]}" --runs 5 --blocks 2 --timeout 600 --json --force \
    -o "$DIR/$name.bundle" > "$DIR/$name.json" 2> "$DIR/$name.err"
  rc=$?
  "$PYTHON" - "$DIR" "$name" "$rc" <<'PY'
import json, sys
d, name, rc = sys.argv[1:]
try:
    r = json.load(open(f"{d}/{name}.json")); s = r.get("summary") or {}
    o = (s.get("oracle") or {}).get("o") or {}
    la = s.get("launch") or {}
    band = o.get("max_error_over_band")
    print(f"{name:14s} rc={rc} status={r['status']:16s} pass={s.get('numerics_pass')} "
          f"t_us={(s.get('time_ns') or 0) / 1e3:.2f} err/band={band if band is None else round(band, 3)} "
          f"failures={o.get('failures')} grid={la.get('grid')} block={la.get('block')} smem={la.get('dynamic_smem')} "
          f"msg={(r.get('message') or '')[:300]}")
except Exception as exc:  # no JSON: the child's stderr says why
    tail = open(f"{d}/{name}.err").read()[-600:].replace(chr(10), " | ")
    print(f"{name:14s} rc={rc} no json ({exc}); stderr: {tail}")
PY
  return $rc
}
export -f one

nvidia-smi -L 2>/dev/null || echo "(nvidia-smi: no GPU listed)"
echo "== lowering $(wc -l < "$dir/configs") configurations, $jobs at a time ==" | tee "$dir/summary.txt"
xargs -d '\n' -P "$jobs" -I{} bash -c 'one "$1" lower' _ {} < "$dir/configs" | tee -a "$dir/summary.txt"
built=$(grep -c ' rc=0 ' "$dir/summary.txt" || true)
if [ "$built" -ne "$(wc -l < "$dir/configs")" ]; then
  echo "FAIL: a configuration did not lower (see $dir/NAME.lower.out)" | tee -a "$dir/summary.txt"
  exit 2
fi
[ "$build_only" = 1 ] && { echo "built all (--build-only)"; exit 0; }

echo "== captures (oracle + timing), one at a time ==" | tee -a "$dir/summary.txt"
status=0
while IFS= read -r line; do
  one "$line" capture < /dev/null | tee -a "$dir/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done < "$dir/configs"
passed=$(grep -c ' status=ok .*pass=True ' "$dir/summary.txt" || true)
echo "$passed of $(wc -l < "$dir/configs") captures pass the oracle: $([ $status = 0 ] && echo ALL PASS || echo SOME FAILED)" \
  | tee -a "$dir/summary.txt"
exit $status
