"""Benchmark: how often the lifter reads real kernels right, against labels taken from their own sources.

The corpus is packages/core/tests/lift/corpus/truth/labels.json (written by make_labels.py there): plain CUDA
kernels compiled here by nvcc, jax's Pallas hopper matmul and CUTLASS GEMMs captured on the H200, CUTLASS
collective-builder GEMMs compiled here (build_cutlass.py), liger-kernel's Triton kernels (build_triton.py),
quack-kernels' and flash-attn-4's CuTe DSL kernels (build_quack.py, build_flash.py) and the project's CuTe
DSL GEMM (build_cute.py), all lowered for sm_90a on the CPU; compiled artifacts are stored xz-compressed and
unpacked into the cache. For each fingerprint key: labelled cases,
correct, accuracy; every miss is listed (case, label, what the lifter read). A case that fails to lift is a
parse failure, counted against every key it labels. Pairs that differ in one labelled way must rank that key
in the top 3 rows of its layer, and a kernel against itself must give no row. Goal: every key >= 95%, no
parse failure, every pair.

    .venv/bin/python benchmarks/lift_accuracy.py [--json PATH] [--cache DIR]

Labels are ``key`` (kernel-wide, or the ``all`` role's feature) or ``key@role``; a value is compared exactly
(sets as sorted lists), ``{"min": n}`` means at least n, and a map of such is compared per entry. The CUDA
kernels are compiled into ``--cache`` (default: a temporary directory) with the command each case records.
Exit status: 0 when every key meets the goal and nothing failed to parse, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shlex
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRUTH = ROOT / "packages" / "core" / "tests" / "lift" / "corpus" / "truth"
GOAL = 0.95


def load_cases() -> list[dict]:
    return json.loads((TRUTH / "labels.json").read_text())["cases"]


def load_pairs() -> list[dict]:
    return json.loads((TRUTH / "labels.json").read_text()).get("pairs", [])


def evaluate_pairs(pairs: list[dict], lifted: dict) -> list[dict]:
    """Each pair that differs in one labelled way must rank that key in the top 3 rows of its layer; a kernel
    compared with its own second compile must give no row."""
    from mosaic.lift.diff import diff_fingerprints

    out = []
    for pair in pairs:
        ref, cand = lifted.get(pair["ref"]), lifted.get(pair["cand"])
        if ref is None or cand is None:
            out.append({**pair, "ok": False, "why": "a side failed to lift"})
            continue
        rows = diff_fingerprints(ref, cand).rows
        if pair.get("same"):
            out.append({**pair, "ok": not rows, "why": "" if not rows else f"{len(rows)} row(s): "
                        + ", ".join(f"{r.layer}/{r.key}" for r in rows[:5])})
            continue
        layer, key = pair["differs"]
        in_layer = [r.key for r in rows if r.layer == layer]
        rank = in_layer.index(key) + 1 if key in in_layer else None
        out.append({**pair, "ok": rank is not None and rank <= 3,
                    "why": f"rank {rank} in {layer}" if rank else f"no {key} row (layer rows: {in_layer[:5]})"})
    return out


def compile_cuda(case: dict, cache: Path) -> Path:
    out = cache / f"{case['id']}.cubin"
    if not out.exists():
        arch = [] if any(f.startswith("-arch") for f in case["flags"]) else ["-arch=sm_90a"]
        cmd = ["nvcc", "-cubin", *arch, "-O3", *case["flags"], "-o", str(out), str(TRUTH / case["src"])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise RuntimeError(f"{shlex.join(cmd)}: {proc.stderr.strip()[:300]}")
    return out


def artifact(case: dict, cache: Path) -> Path:
    if case["source"] == "cuda":
        return compile_cuda(case, cache)
    from mosaic.bundle import member_path

    path = ROOT / case["artifact"]
    if path.suffix != ".xz":
        return member_path(path)  # a bundle's member, whatever its storage (plain, or packed as NAME.xz)
    out = cache / "xz" / path.with_suffix("").name  # an xz-compressed cubin or PTX, unpacked once
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(out.suffix + ".part")
        tmp.write_bytes(lzma.decompress(path.read_bytes()))
        tmp.replace(out)
    return out


def lift_case(path: Path):
    from mosaic.lift.inputs import lift_bundle, lift_path

    return lift_bundle(path) if path.is_dir() else lift_path(path)


def read(fp, key: str):
    name, _, role = key.partition("@")
    if name == "roles" and not role:
        return fp.get("roles").value
    if role:
        feat = fp.get(name, role)
        return None if feat is None else _plain(feat.value)
    feat = fp.get(name, "") or fp.get(name, "all")
    if feat is not None:
        return _plain(feat.value)
    # a per-role feature labelled for the kernel: every role must read the label (pipeline.stages)
    values = {f.role: _plain(f.value) for f in fp.features if f.key == name}
    if not values:
        return None
    first = next(iter(values.values()))
    return first if all(v == first for v in values.values()) else values


def _plain(v):
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def matches(label, value) -> bool:
    if isinstance(label, dict) and set(label) == {"min"}:
        return isinstance(value, int | float) and not isinstance(value, bool) and value >= label["min"]
    if isinstance(label, dict):
        return isinstance(value, dict) and set(label) == set(value) and all(matches(label[k], value[k]) for k in label) \
            if not any(isinstance(x, dict) for x in label.values()) else \
            isinstance(value, dict) and all(matches(label[k], value.get(k)) for k in label)
    if isinstance(label, list) and isinstance(value, list):
        return sorted(map(json.dumps, label)) == sorted(map(json.dumps, value))
    return label == value


def evaluate(cases: list[dict], cache: Path, pairs: list[dict] | None = None) -> dict:
    per_key: dict[str, dict] = defaultdict(lambda: {"cases": 0, "correct": 0, "misses": []})
    per_source: dict[str, int] = defaultdict(int)
    failures = []

    def one(case):
        try:
            return case, lift_case(artifact(case, cache)), None
        except Exception as exc:  # a parse failure is a result, not a crash of the benchmark
            return case, None, f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, cases))
    for case, fp, err in results:
        per_source[case["source"]] += 1
        if err:
            failures.append({"case": case["id"], "source": case["source"], "error": err})
        for key, label in case["labels"].items():
            rec = per_key[key]
            rec["cases"] += 1
            value = read(fp, key) if fp is not None else "parse failure"
            if fp is not None and matches(label, value):
                rec["correct"] += 1
            else:
                rec["misses"].append({"case": case["id"], "source": case["source"], "label": label, "lifted": value})
    keys = {k: {**v, "accuracy": round(v["correct"] / v["cases"], 4)} for k, v in sorted(per_key.items())}
    paired = evaluate_pairs(pairs or [], {case["id"]: fp for case, fp, _ in results})
    total = sum(v["cases"] for v in keys.values())
    correct = sum(v["correct"] for v in keys.values())
    return {"cases": len(cases), "per_source": dict(sorted(per_source.items())), "parse_failures": failures,
            "labels": total, "correct": correct, "keys": keys, "goal": GOAL, "pairs": paired,
            "meets_goal": not failures and all(v["accuracy"] >= GOAL for v in keys.values())
            and all(p["ok"] for p in paired)}


def table(result: dict) -> str:
    lines = [f"corpus: {result['cases']} cases (" + ", ".join(f"{s} {n}" for s, n in result["per_source"].items())
             + f"), {result['labels']} labels, parse failures {len(result['parse_failures'])}", ""]
    w = max(len(k) for k in result["keys"]) if result["keys"] else 3
    lines.append(f"{'key':<{w}}  cases  correct  accuracy")
    for k, v in result["keys"].items():
        flag = "" if v["accuracy"] >= GOAL else "  < goal"
        lines.append(f"{k:<{w}}  {v['cases']:>5}  {v['correct']:>7}  {v['accuracy'] * 100:>7.1f}%{flag}")
    lines.append(f"{'all':<{w}}  {result['labels']:>5}  {result['correct']:>7}  "
                 f"{result['correct'] / max(result['labels'], 1) * 100:>7.1f}%")
    misses = [(k, m) for k, v in result["keys"].items() for m in v["misses"]]
    lines.append("")
    lines.append(f"misses: {len(misses)}" + ("" if misses else " (none)"))
    for k, m in misses:
        lines.append(f"  {m['case']} [{m['source']}] {k}: label {json.dumps(m['label'])}, lifted {json.dumps(m['lifted'])}")
    for f in result["parse_failures"]:
        lines.append(f"  PARSE FAILURE {f['case']} [{f['source']}]: {f['error']}")
    pairs = result.get("pairs", [])
    if pairs:
        lines.append("")
        lines.append(f"pairs: {sum(p['ok'] for p in pairs)}/{len(pairs)} (one labelled difference -> a top-3 row of "
                     "its layer; the same kernel twice -> no row)")
        for p in pairs:
            what = "same" if p.get("same") else "/".join(p["differs"])
            lines.append(f"  {'ok  ' if p['ok'] else 'MISS'} {p['ref']} -> {p['cand']}: {what} ({p['why'] or 'no rows'})")
    lines.append("")
    lines.append("meets the goal (every key >= 95%, no parse failure, every pair)" if result["meets_goal"]
                 else "MISSES the goal")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the result as JSON here")
    ap.add_argument("--cache", type=Path, help="directory for the CUDA cubins (default: a temporary one)")
    args = ap.parse_args(argv)
    cases = load_cases()
    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache or Path(tmp)
        cache.mkdir(parents=True, exist_ok=True)
        result = evaluate(cases, cache, load_pairs())
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["meets_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
