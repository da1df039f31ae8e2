# Device call 1 (session 20): staging part 1, then the CUTLASS attention self-check (packages/target-cutlass/tools/
# attention_selfcheck.sh, built here with nvcc 13.0 for sm_90a, static cudart; carried as tools/build): 4 configs x
# 5 problems against a float64 CPU reference, one PASS/FAIL line each. Its first run on a GPU.
set -u
bash .stage1/install.sh > /tmp/inst1.log 2>&1 || { tail -20 /tmp/inst1.log; exit 3; }
nvidia-smi -L
timeout 120 packages/target-cutlass/tools/build/attention_selfcheck; echo "selfcheck rc=$?"
