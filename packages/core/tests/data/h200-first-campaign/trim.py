"""Copy the bundles of the first live Pallas -> CuTe campaign (H200, 2026-11-30) that the replay test needs,
keeping only what lifting reads: the SASS, the CUPTI launch record, the ptxas log and the lowering record
(role ``metrics``, the first one lift_bundle reads). Cubins (cuobjdump), PTX, sources, timings and oracle
records are dropped; each manifest is written fresh by ``mosaic.bundle.save_bundle`` with the original
kernel spec, GPU, toolchain and extra keys (``capture``, ``mosaic_run``, ``lowering``).

    .venv/bin/python packages/core/tests/data/h200-first-campaign/trim.py /tmp/campaign-run1/campaign
"""

import json
import shutil
import sys
from pathlib import Path

from mosaic.bundle import load_bundle, save_bundle

KEEP = ("kernel.sass", "launch.json", "ptxas.log", "lowering.json")
BUNDLES = ("reference", "cand-60070b15b65cfb56", "cand-bd67d5c7f402f91e")  # reference, naive, incumbent
RESERVED = {"format", "schema_version", "created", "kernel", "language", "gpu", "toolchain", "files"}


def main(campaign: Path, out: Path) -> None:
    for name in BUNDLES:
        src = load_bundle(campaign / "bundles" / f"{name}.bundle")
        files = {rel: (meta["role"], src.root / rel) for rel, meta in src.manifest["files"].items() if rel in KEEP}
        save_bundle(out / f"{name}.bundle", kernel=src.kernel, language=src.language, files=files,
                    gpu=src.manifest.get("gpu"), toolchain=src.manifest.get("toolchain"),
                    extra={k: v for k, v in src.manifest.items() if k not in RESERVED}, overwrite=True)
    shutil.copyfile(campaign / "journal.jsonl", out / "journal.jsonl")
    (out / "campaign.json").write_text(json.dumps(json.loads((campaign / "campaign.json").read_text()), indent=2)
                                       + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parent)
