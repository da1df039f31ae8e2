"""Small schedules for testing the VM piece by piece: one op split over SMs (micro-kernel checks and
their bandwidth floors), a chain of counter hand-offs, and a planted deadlock. All are built as real
Schedules, so they go through the same validator gate, encoder and launcher as a model's schedule."""

from __future__ import annotations

from collections.abc import Sequence

from mosaic_amk.schedule import Buffer, Schedule, Task, Wait


def split_rows(n: int, parts: int, align: int = 8) -> list[tuple[int, int]]:
    """[lo, hi) row ranges covering n rows in at most ``parts`` pieces of a multiple of ``align`` rows."""
    per = -(-n // parts)
    step = -(-per // align) * align
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def op_schedule(op: str, buffers: Sequence[Buffer], inputs: Sequence[str], outputs: Sequence[str],
                params: dict, num_sms: int, rows: Sequence[tuple[int, int]] | None = None,
                row_buffers: Sequence[str] = (), extra_ranges: dict | None = None,
                argmax_of: str | None = None, position: int | None = None) -> Schedule:
    """One op, optionally split into row tasks (one per SM, round robin) that all signal counter 0;
    with ``argmax_of`` an argmax task on SM 0 waits for them all (an all-join) and signals counter 1."""
    tasks = []
    for i, (lo, hi) in enumerate(rows or [(None, None)]):
        p = dict(params)
        ranges = dict(extra_ranges or {})
        if lo is not None:
            p.update(row_start=lo, row_end=hi)
            ranges.update({b: (lo, hi) for b in row_buffers})
        tasks.append(Task(id=i, op=op, sm=i % num_sms, inputs=tuple(inputs), outputs=tuple(outputs), waits=(),
                          signal=0, params=p, ranges=ranges))
    counters = 1
    if argmax_of:
        tasks.append(Task(id=len(tasks), op="argmax", sm=0, inputs=(argmax_of,), outputs=("next_token",),
                          waits=(Wait(0, len(tasks)),), signal=1, params={}))
        counters = 2
    outs = tuple(dict.fromkeys(list(outputs) + (["next_token"] if argmax_of else [])))
    meta = {"position": position} if position is not None else {}
    return Schedule(num_sms=num_sms, buffers=tuple(buffers), num_counters=counters, tasks=tuple(tasks),
                    outputs=outs, meta=meta)


def handoff_chain(n: int, sms: Sequence[int], num_sms: int) -> Schedule:
    """n tiny ``add`` tasks in a chain (task i waits for task i-1's counter, signals its own), placed
    round robin on ``sms``: with one SM every hand-off stays on it; with two, every hand-off crosses SMs."""
    bufs = [Buffer("a", "f32", (1,), "input"), Buffer("b", "f32", (1,), "input")]
    bufs += [Buffer(f"y{i}", "f32", (1,), "output" if i == n - 1 else "activation") for i in range(n)]
    tasks = []
    for i in range(n):
        src = "a" if i == 0 else f"y{i - 1}"
        tasks.append(Task(id=i, op="add", sm=sms[i % len(sms)], inputs=(src, "b"), outputs=(f"y{i}",),
                          waits=(Wait(i - 1, 1),) if i else (), signal=i, params={}))
    return Schedule(num_sms=num_sms, buffers=tuple(bufs), num_counters=n, tasks=tuple(tasks), outputs=(f"y{n - 1}",))


def deadlock(num_sms: int) -> Schedule:
    """Two tasks on two SMs, each waiting for the other's counter: a cycle the validator rejects."""
    bufs = (Buffer("a", "f32", (4,), "input"), Buffer("b", "f32", (4,), "input"),
            Buffer("y0", "f32", (4,), "output"), Buffer("y1", "f32", (4,), "output"))
    tasks = (Task(id=0, op="add", sm=0, inputs=("a", "b"), outputs=("y0",), waits=(Wait(1, 1),), signal=0, params={}),
             Task(id=1, op="add", sm=1, inputs=("a", "b"), outputs=("y1",), waits=(Wait(0, 1),), signal=1, params={}))
    return Schedule(num_sms=num_sms, buffers=bufs, num_counters=2, tasks=tasks, outputs=("y0", "y1"))


def raise_threshold(schedule: Schedule, task_index: int) -> Schedule:
    """A copy of ``schedule`` with task ``task_index``'s first wait made unsatisfiable (threshold + 1)."""
    import attrs

    t = schedule.tasks[task_index]
    w = t.waits[0]
    bad = attrs.evolve(t, waits=(Wait(w.counter, w.threshold + 1), *t.waits[1:]))
    tasks = list(schedule.tasks)
    tasks[task_index] = bad
    return attrs.evolve(schedule, tasks=tuple(tasks))


def chain_schedule(buffers: Sequence[Buffer], stages: Sequence[dict], num_sms: int, outputs: Sequence[str],
                   position: int | None = None) -> Schedule:
    """Stages in order, each waiting for all tasks of the previous one (an all-join on its counter). A stage is
    a dict: ``op``, ``inputs``, ``outputs``, ``params``, optional ``rows`` (row tasks, placed round robin) with
    ``row_buffers`` (their ranges) and ``ranges`` (extra ranges of every task of the stage)."""
    tasks: list[Task] = []
    for k, st in enumerate(stages):
        prev = sum(1 for t in tasks if t.signal == k - 1)
        for lo, hi in st.get("rows") or [(None, None)]:
            p = dict(st["params"])
            ranges = dict(st.get("ranges") or {})
            if lo is not None:
                p.update(row_start=lo, row_end=hi)
                ranges.update({b: (lo, hi) for b in st.get("row_buffers", ())})
            tasks.append(Task(id=len(tasks), op=st["op"], sm=len(tasks) % num_sms, inputs=tuple(st["inputs"]),
                              outputs=tuple(st["outputs"]), waits=(Wait(k - 1, prev),) if k else (), signal=k,
                              params=p, ranges=ranges))
    meta = {"position": position} if position is not None else {}
    return Schedule(num_sms=num_sms, buffers=tuple(buffers), num_counters=len(stages), tasks=tuple(tasks),
                    outputs=tuple(outputs), meta=meta)


FUSED_GEMV_CASES = ("rmsnorm_gemv", "rmsnorm_gemv_silu_mul", "gemv_rope", "gemv_rope_append_k", "gemv_rope_append_v")


def fused_gemv_case(case: str, rng, *, hidden: int = 2048, rows: int = 4096, heads: int = 32, head_dim: int = 64,
                    bias: bool = True, num_sms: int = 132, position: int = 37, page: int = 16, pages: int = 8,
                    eps: float = 1e-5, inv_freq=None) -> dict:
    """One fused GEMV op on random data, with the unfused chain that computes the same thing (rmsnorm, then
    gemv / gemv_silu_mul, then rope / rope_append / kv_append): ``fused`` and ``unfused`` schedules over the same
    buffers, ``inputs`` and ``weights`` (float32, the weights bf16-representable), ``out`` (the buffer to
    compare), ``ref`` (ops.KERNELS of the fused op in float32) and ``parts`` (what a torch bf16 reference
    needs). ``gemv_rope_append_k`` rotates (the k projection), ``_v`` does not. The row tasks are split over
    ``num_sms`` SMs (whole heads for the RoPE ops)."""
    import numpy as np

    from mosaic_amk import ops
    from mosaic_amk.cuda.launcher import bf16_round

    def rnd(*shape, scale=1.0, offset=0.0):
        return bf16_round((offset + scale * rng.standard_normal(shape)).astype(np.float32))

    K, hd = hidden, head_dim
    x, nw = rnd(K, scale=3.0), rnd(K, scale=0.2, offset=1.0)
    if inv_freq is None:
        inv_freq = (1.0 / (10000.0 ** (np.arange(0, hd, 2, dtype=np.float64) / hd))).astype(np.float32)
    f32 = lambda name, shape, kind: Buffer(name, "f32", tuple(shape), kind)  # noqa: E731
    bufs = [f32("x", (K,), "input"), f32("nw", (K,), "weight"), f32("xn", (K,), "activation")]
    weights: dict = {"nw": nw}
    inputs: dict = {"x": x}
    norm_stage = {"op": "rmsnorm", "inputs": ["x", "nw"], "outputs": ["xn"], "params": {"eps": eps}}
    out_buffers: list[str] = []
    if case in ("rmsnorm_gemv", "rmsnorm_gemv_silu_mul"):
        N = rows
        split = split_rows(N, num_sms)
        if case == "rmsnorm_gemv":
            w, b, res = rnd(N, K, scale=0.02), rnd(N, scale=0.5), rnd(N)
            bufs += [f32("w", (N, K), "weight"), f32("res", (N,), "input"), f32("y", (N,), "output")]
            weights["w"], inputs["res"] = w, res
            extra = (["b"] if bias else []) + ["res"]
            if bias:
                bufs.append(f32("b", (N,), "weight"))
                weights["b"] = b
            p = {"bias": bias, "residual": True}
            rowb = ["w", *extra, "y"]
            fused = [{"op": case, "inputs": ["x", "nw", "w", *extra], "outputs": ["y"], "params": {**p, "eps": eps},
                      "rows": split, "row_buffers": rowb}]
            unfused = [norm_stage, {"op": "gemv", "inputs": ["xn", "w", *extra], "outputs": ["y"], "params": p,
                                    "rows": split, "row_buffers": rowb}]
            ref_ins = [x, nw, w, *([b] if bias else []), res]
            parts = {"w": w, "b": b if bias else None, "res": res}
        else:
            wg, wu = rnd(N, K, scale=0.02), rnd(N, K, scale=0.02)
            bg, bu = rnd(N, scale=0.5), rnd(N, scale=0.5)
            bufs += [f32("wg", (N, K), "weight"), f32("wu", (N, K), "weight"), f32("y", (N,), "output")]
            weights.update(wg=wg, wu=wu)
            extra = ["bg", "bu"] if bias else []
            if bias:
                bufs += [f32("bg", (N,), "weight"), f32("bu", (N,), "weight")]
                weights.update(bg=bg, bu=bu)
            p = {"bias": bias}
            rowb = ["wg", "wu", *extra, "y"]
            fused = [{"op": case, "inputs": ["x", "nw", "wg", "wu", *extra], "outputs": ["y"],
                      "params": {**p, "eps": eps}, "rows": split, "row_buffers": rowb}]
            unfused = [norm_stage, {"op": "gemv_silu_mul", "inputs": ["xn", "wg", "wu", *extra], "outputs": ["y"],
                                    "params": p, "rows": split, "row_buffers": rowb}]
            ref_ins = [x, nw, wg, wu, *([bg, bu] if bias else [])]
            parts = {"wg": wg, "wu": wu, "bg": bg if bias else None, "bu": bu if bias else None}
        out = "y"
        out_buffers = ["y"]
        ref = np.zeros(N, np.float32)
        ops.KERNELS[case](ref_ins, [ref], {**p, "eps": eps, "row_start": 0, "row_end": N})
    else:
        append = case.startswith("gemv_rope_append")
        rope = case != "gemv_rope_append_v"
        nh = heads
        N = nh * hd
        split = split_rows(N, num_sms, align=hd)
        w, b = rnd(N, K, scale=0.02), rnd(N, scale=0.5)
        bufs += [f32("w", (N, K), "weight"), f32("proj", (N,), "activation")]
        weights["w"] = w
        if rope:
            bufs.append(f32("rope.inv_freq", (hd // 2,), "weight"))
            weights["rope.inv_freq"] = inv_freq
        if bias:
            bufs.append(f32("b", (N,), "weight"))
            weights["b"] = b
        bb = ["b"] if bias else []
        rp = {"position": position, "head_dim": hd, "attention_scaling": 1.0}
        fp = {"bias": bias, "norm": True, "eps": eps, **rp}
        gemv_stage = {"op": "gemv", "inputs": ["xn", "w", *bb], "outputs": ["proj"],
                      "params": {"bias": bias, "residual": False}, "rows": split, "row_buffers": ["w", *bb, "proj"]}
        slot = {"cache": (position // page, position // page + 1)}
        if append:
            bufs.append(Buffer("cache", "f32", (pages, page, N), "kv_cache"))
            fp.update(rope=rope, page_tokens=page)
            fused = [{"op": "gemv_rope_append", "inputs": ["x", "w", *(["rope.inv_freq"] if rope else []), "nw", *bb],
                      "outputs": ["cache"], "params": fp, "rows": split, "row_buffers": ["w", *bb], "ranges": slot}]
            last = ({"op": "rope_append", "inputs": ["proj", "rope.inv_freq"], "outputs": ["cache"],
                     "params": {**rp, "num_heads": nh, "page_tokens": page}, "ranges": slot} if rope else
                    {"op": "kv_append", "inputs": ["proj"], "outputs": ["cache"],
                     "params": {"position": position, "page_tokens": page}, "ranges": slot})
            out = "cache"
            ref = np.zeros((pages, page, N), np.float32)
            ref_ins = [x, w, *([inv_freq] if rope else []), nw, *([b] if bias else [])]
            ops.KERNELS["gemv_rope_append"](ref_ins, [ref], {**fp, "row_start": 0, "row_end": N})
        else:
            bufs.append(f32("y", (N,), "output"))
            out_buffers = ["y"]
            fused = [{"op": "gemv_rope", "inputs": ["x", "w", "rope.inv_freq", "nw", *bb], "outputs": ["y"],
                      "params": fp, "rows": split, "row_buffers": ["w", *bb, "y"]}]
            last = {"op": "rope", "inputs": ["proj", "rope.inv_freq"], "outputs": ["y"], "params": {**rp, "num_heads": nh}}
            out = "y"
            ref = np.zeros(N, np.float32)
            ops.KERNELS["gemv_rope"]([x, w, inv_freq, nw, *([b] if bias else [])], [ref],
                                     {**fp, "row_start": 0, "row_end": N})
        unfused = [norm_stage, gemv_stage, last]
        parts = {"w": w, "b": b if bias else None, "rope": rope, "heads": nh, "append": append}
    used = lambda stages: {n for st in stages for n in (*st["inputs"], *st["outputs"])}  # noqa: E731
    fused_bufs = [bf for bf in bufs if bf.name in used(fused)]
    return {"case": case, "op": fused[0]["op"], "out": out, "ref": ref, "inputs": inputs, "weights": weights,
            "parts": {**parts, "x": x, "nw": nw, "eps": eps, "inv_freq": inv_freq, "position": position,
                      "head_dim": hd, "page": page},
            "fused": chain_schedule(fused_bufs, fused, num_sms, out_buffers, position=position),
            "unfused": chain_schedule(bufs, unfused, num_sms, out_buffers, position=position)}
