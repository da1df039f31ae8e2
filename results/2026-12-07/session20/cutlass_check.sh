# Device call C (session 20): the CUTLASS attention device runner's first GPU run (tools/attention_capture_check.sh:
# 6 configurations through `mosaic capture --lang cutlass --family attention`, float64 oracle then CUPTI), with one
# staging part .stagec (cupti-python, CUPTI, pyelftools, the CUTLASS 4.2 headers; no CuTe DSL) and the nvcc builds
# made on the development machine carried as .ccache (a cache miss rebuilds on the device).
set -u
bash .stagec/install.sh > /tmp/inst.log 2>&1 || { tail -20 /tmp/inst.log; exit 3; }
. /tmp/site/env.sh
export MOSAIC_CACHE_DIR="$PWD/.ccache" PYTHONUNBUFFERED=1 MOSAIC_LOAD_PLUGINS=hopper,cutlass
mkdir -p "$OUT"
nvidia-smi -L
timeout 420 bash packages/target-cutlass/tools/attention_capture_check.sh -o /tmp/cc 2>&1 | tee "$OUT/cutlass_check.log" | tail -20
cp /tmp/cc/summary.txt "$OUT/" 2>/dev/null
(cd /tmp/cc && tar cf - *.json *.err 2>/dev/null | xz -6 > "$OUT/cutlass_captures.tar.xz")
