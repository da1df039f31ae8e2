#!/usr/bin/env bash
# Issue 4 on the lent H200, from the repository root, after staging cupti-python and the CUTLASS headers:
#   bash ../shared/device/stage-gpu-wheels.sh                     (here, once)
#   run(carry=[".stage1"], command="bash .stage1/install.sh")
#   run(carry=[".stage2"], command="bash .stage2/install.sh && bash scripts/device/issue4.sh")
# Writes $OUT/issue4.json and $OUT/bundles.tar.gz and prints a summary table.
set -uo pipefail
export PYTHONPATH="$(cat /tmp/site/.pythonpath 2>/dev/null || true)${PYTHONPATH:+:$PYTHONPATH}"
export MOSAIC_CUTLASS_INCLUDE=${MOSAIC_CUTLASS_INCLUDE:-/tmp/site/cutlass_library/source/include}
export MOSAIC_CACHE_DIR=${MOSAIC_CACHE_DIR:-$PWD/.mosaic-cache}
export MOSAIC_LOAD_PLUGINS=${MOSAIC_LOAD_PLUGINS:-hopper,cutlass}
[ -f "$MOSAIC_CUTLASS_INCLUDE/cutlass/cutlass.h" ] || echo "warning: no CUTLASS headers at $MOSAIC_CUTLASS_INCLUDE (run the staging)"
python3 -m pip install -q --no-deps --no-build-isolation -e packages/core -e packages/gpu-hopper -e packages/target-cutlass 2>&1 | tail -2
python3 scripts/device/issue4.py --out "${OUT:-/tmp/issue4-out}" "$@"
