"""A small scripted agent for the `command` proposer tests (run as a subprocess, never imported by pytest).

Reads the discrepancy report on stdin, logs what it saw to $AGENT_LOG, waits $AGENT_DELAY seconds, and
answers with the next edit of its plan (indexed by how many edits the loop has tried), or a malformed reply
when $AGENT_MODE says so.
"""

import json
import os
import sys
import time

PLAN = [{"kernel": "hopper"}, {"cluster_mn": [2, 1]}, {"raster": "n", "swizzle": 2}, {"persistent": True},
        {"stages": 8}, {"stages": 5}]

req = json.load(sys.stdin)
with open(os.environ["AGENT_LOG"], "a") as log:
    log.write(json.dumps({"parent": req["parent"], "repair": req["repair"], "rows": [r["key"] for r in req["rows"]],
                          "history": len(req["history"]), "format": req["format"],
                          "outcomes": [[h["step"], h["outcome"], h["accepted"]] for h in req["history"]]}) + "\n")
time.sleep(float(os.environ.get("AGENT_DELAY", "0")))
mode = os.environ.get("AGENT_MODE", "plan")
n = len(req["history"])
if mode == "garbage" and n == 1:
    print("I think you should raise the stage count")
elif mode == "crash" and n == 1:
    sys.exit(3)
elif n >= len(PLAN):
    print(json.dumps({"done": True}))
else:
    print(json.dumps({"knobs": PLAN[n], "why": f"scripted step {n}"}))
