#!/usr/bin/env bash
# Build (and with --run, run) the attention self-check: tools/attention_selfcheck.cu against the kernel template
# src/mosaic_target_cutlass/templates/attention_sm90.cuh, with nvcc for sm_90a and the CUDA runtime linked statically.
#
#   packages/target-cutlass/tools/attention_selfcheck.sh [--run | --host-only] [-o BINARY]
#
# CUTLASS headers: $MOSAIC_CUTLASS_INCLUDE (or $CUTLASS_INCLUDE), else those of pip's nvidia-cutlass found by
# $PYTHON (default: python3). The binary goes to packages/target-cutlass/tools/build/attention_selfcheck unless -o
# names another path. --run runs it after building (needs an sm_90 GPU: H100/H200); --host-only runs only its host
# checks (no GPU). Its exit status is the program's: 0 all passed, 1 a case failed, 2 no usable GPU.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/build/attention_selfcheck"
mode=build
while [ $# -gt 0 ]; do
  case "$1" in
    --run) mode=run ;;
    --host-only) mode=host ;;
    -o) out="$2"; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

inc="${MOSAIC_CUTLASS_INCLUDE:-${CUTLASS_INCLUDE:-}}"
if [ -z "$inc" ]; then
  inc="$("${PYTHON:-python3}" -c 'import cutlass_library, pathlib; print(pathlib.Path(cutlass_library.__file__).parent / "source" / "include")' 2>/dev/null || true)"
fi
if [ -z "$inc" ] || [ ! -f "$inc/cutlass/cutlass.h" ]; then
  echo "error: CUTLASS headers not found (set MOSAIC_CUTLASS_INCLUDE or pip install nvidia-cutlass)" >&2
  exit 2
fi
command -v nvcc >/dev/null || { echo "error: nvcc is not on PATH" >&2; exit 2; }

mkdir -p "$(dirname "$out")"
if [ ! -x "$out" ] || [ "$out" -ot "$here/attention_selfcheck.cu" ] || \
   [ "$out" -ot "$here/../src/mosaic_target_cutlass/templates/attention_sm90.cuh" ]; then
  echo "building $out (nvcc, about a minute on 2 cores)" >&2
  nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -cudart static \
    -I"$here/../src/mosaic_target_cutlass/templates" -I"$inc" -o "$out" "$here/attention_selfcheck.cu"
fi
case "$mode" in
  run) exec "$out" ;;
  host) exec "$out" --host-only ;;
  *) echo "built $out" ;;
esac
