# Device call (session 14, the second loan): the last staging part, then quack's CuTe DSL softmax as the reference,
# Pallas as the target (16384x8192 bf16, budget 3.5 device minutes, cut at 430 s of wall).
set -u
bash .stage13/install.sh > /tmp/inst.log 2>&1 && bash .stage13/setup.sh || { tail -20 /tmp/inst.log; exit 3; }
FAMILY=softmax BUDGET=3.5 TIMEOUT=430 C=softmax bash results/2026-12-03/session14/campaign.sh
