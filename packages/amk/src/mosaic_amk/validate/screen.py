"""The validator's accelerated path: the rule table restated over the columnar form as numpy checks.

The screen answers one question: "would the rule table (:mod:`mosaic_amk.validate.rules`) return no
diagnostic at all?". It reads a schedule through its columns (:mod:`mosaic_amk.columns`) as
whole-column numpy checks, and may only answer True when the exact rules would return nothing (each
check below implies the absence of the diagnostics named beside it); any doubt, any unusual shape (a
buffer written after it is read, overlapping writes, an exception) answers False and the exact rule
table runs and names every problem. So the screen decides nothing on its own about an unsafe schedule:
it only lets safe ones skip the per-task walk. packages/amk/tests/test_validator_parity.py (and
benchmarks/amk_validate_parity.py) check verdict and diagnostics of ``validate`` against the rule table
alone (``validate_rules``).
"""

from __future__ import annotations

from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from mosaic_amk.footprints import numel
from mosaic_amk.schedule import (
    MAX_COUNTERS,
    MAX_ELEMENTS,
    MAX_HEAD_DIM,
    MAX_INPUTS,
    MAX_OUTPUTS,
    MAX_RANK,
    MAX_SMS,
    MAX_WAITS,
)
from mosaic_amk.validate.clocks import inclusive_clocks, slots_of
from mosaic_amk.validate.facts import INIT_KINDS as _INIT_KINDS
from mosaic_amk.validate.facts import SPECS as _SPECS
from mosaic_amk.validate.facts import WHOLE_OPS as _WHOLE_OPS

_OPS = tuple(_SPECS)
_OPCODE = {name: k for k, name in enumerate(_OPS)}
# plain row-split ops, vectorised from their declaration: opcode -> leading input roles read whole
_ROW_OPS = {k: _SPECS[name].whole_prefix() for k, name in enumerate(_OPS) if _SPECS[name].whole_prefix() is not None}
_PER_TASK_OPS = frozenset(k for k, name in enumerate(_OPS) if name not in _WHOLE_OPS and k not in _ROW_OPS)
_INT_ONLY = frozenset((int,))
# the counter-level closure holds a bitset of counters per counter and per reader: only for few counters
_CLOSURE_COUNTERS = 4096


class _BufView:
    __slots__ = ("name", "shape", "kind")

    def __init__(self, name: str, shape: Any, kind: str):
        self.name, self.shape, self.kind = name, shape, kind


def screen(c: Any) -> bool:
    """True only if the rule table would find nothing (see the module docstring); never raises."""
    try:
        return _screen_checks(c)
    except Exception:  # noqa: BLE001 - any surprise: let the exact rules decide
        return False


def _screen_checks(c: Any) -> bool:  # noqa: C901, PLR0911, PLR0912, PLR0915 - one straight pass
    n, nsm, ncnt = c.n, c.num_sms, c.num_counters
    # -- malformed/capacity (schedule and buffers) ------------------------------------------------------
    if nsm < 1 or ncnt < 0 or nsm > MAX_SMS or ncnt > MAX_COUNTERS:
        return False
    names, shapes, kinds = c.buf_names, c.buf_shapes, c.buf_kinds
    nb = len(names)
    bid = dict(zip(names, range(nb), strict=True))
    if len(bid) != nb:
        return False  # duplicate buffer name
    if nb and (min(map(len, shapes)) < 1 or max(map(len, shapes)) > MAX_RANK or min(map(min, shapes)) < 1):
        return False
    if not bid.keys() >= set(c.outputs):
        return False
    if n == 0:
        return not c.outputs  # unreachable-output otherwise
    if len(set(c.ids)) != n:
        return False
    sms, sigs = c.sms, c.signals
    if min(sms) < 0 or max(sms) >= nsm or min(sigs) < 0 or max(sigs) >= ncnt:
        return False
    ins, outs, wlen = c.inputs, c.task_outputs, c.wait_len
    in_len, out_len = list(map(len, ins)), list(map(len, outs))
    if max(in_len) > MAX_INPUTS or max(out_len) > MAX_OUTPUTS or max(wlen) > MAX_WAITS:
        return False
    wc, wt = c.wait_counter, c.wait_threshold
    if wc and (min(wc) < 0 or max(wc) >= ncnt):
        return False
    # -- unsatisfiable-wait, partial-join, cycle, queue-order, list-order ---------------------------------
    # every wait: 1 <= t <= #producers, t in {1, #producers}, and every producer earlier in the list
    # (then no producer is the waiter itself or later: no self-wait, no backward edge)
    ar = np.arange(n)
    sig = np.fromiter(sigs, np.int64, n)
    nprod = np.bincount(sig, minlength=ncnt)
    wc_a, wt_a = np.fromiter(wc, np.int64, len(wc)), np.fromiter(wt, np.int64, len(wt))
    w_task = np.repeat(ar, wlen)
    if len(wc):
        last = np.full(ncnt, -1, np.int64)
        np.maximum.at(last, sig, ar)
        np_w = nprod[wc_a]
        if not ((wt_a >= 1) & (wt_a <= np_w) & ((wt_a == 1) | (wt_a == np_w)) & (last[wc_a] < w_task)).all():
            return False
    # -- malformed: references, weights written, op table, parameters, arity ------------------------------
    rows = np.fromiter(map(itemgetter(0), shapes), np.int64, nb)
    if nb and max(map(numel, shapes)) > MAX_ELEMENTS:
        return False
    size = np.fromiter(map(numel, shapes), np.int64, nb)  # elements
    rlen = size // rows  # elements per row of axis 0 (extents checked >= 1 above)
    is_weight = np.fromiter((k == "weight" for k in kinds), bool, nb)
    n_in, n_out = sum(in_len), sum(out_len)
    in_b = np.fromiter(map(bid.__getitem__, chain.from_iterable(ins)), np.int64, n_in)  # KeyError: unknown
    out_b = np.fromiter(map(bid.__getitem__, chain.from_iterable(outs)), np.int64, n_out)
    if is_weight[out_b].any():
        return False
    op_a = np.fromiter(map(_OPCODE.__getitem__, c.ops), np.int64, n)  # KeyError: unknown op
    in_len_a, out_len_a = np.fromiter(in_len, np.int64, n), np.fromiter(out_len, np.int64, n)
    in_task, out_task = np.repeat(ar, in_len_a), np.repeat(ar, out_len_a)
    in_off = np.cumsum(in_len_a) - in_len_a
    in_slot = np.arange(n_in) - in_off[in_task]
    in_lo, in_hi = np.zeros(n_in, np.int64), size[in_b]
    out_lo, out_hi = np.zeros(n_out, np.int64), size[out_b]
    params = c.params
    present = np.bincount(op_a, minlength=len(_OPS))
    rows_task = np.zeros(n, bool)
    prefix = np.zeros(n, np.int64)
    rs_all, re_all = np.zeros(n, np.int64), np.zeros(n, np.int64)
    per_task: list[int] = []
    for k in np.flatnonzero(present).tolist():
        spec = _SPECS[_OPS[k]]
        idx = np.flatnonzero(op_a == k)
        group = list(map(params.__getitem__, idx.tolist()))
        if spec.params:
            got = list(map(itemgetter(*spec.params), group))  # KeyError: a missing parameter
            if len(spec.params) == 1:
                got = [(v,) for v in got]
        if "head_dim" in spec.params:
            hd = list(map(itemgetter(spec.params.index("head_dim")), got))
            if not set(map(type, hd)) <= _INT_ONLY or max(hd) > MAX_HEAD_DIM:
                return False
        want = len(spec.inputs)
        for flag, _ in spec.optional:  # every optional flag is a required parameter too
            vals = list(map(itemgetter(spec.params.index(flag)), got))
            if any(vals):
                want = want + np.fromiter(map(bool, vals), np.int64, len(vals))
        if not ((in_len_a[idx] == want).all() and (out_len_a[idx] == len(spec.outputs)).all()):
            return False
        if k in _ROW_OPS:
            p_rs, p_re = spec.params.index("row_start"), spec.params.index("row_end")
            rs = list(map(itemgetter(p_rs), got))
            re = list(map(itemgetter(p_re), got))
            if not (set(map(type, rs)) <= _INT_ONLY and set(map(type, re)) <= _INT_ONLY):
                return False
            rs_a, re_a = np.fromiter(rs, np.int64, len(rs)), np.fromiter(re, np.int64, len(re))
            if not ((rs_a >= 0) & (rs_a < re_a)).all():
                return False
            rows_task[idx] = True
            prefix[idx] = _ROW_OPS[k]
            rs_all[idx], re_all[idx] = rs_a, re_a
        elif k in _PER_TASK_OPS:
            per_task.extend(idx.tolist())
    if rows_task.any():  # y and every input role after the whole-read prefix: rows [row_start, row_end)
        sel = rows_task[in_task] & (in_slot >= prefix[in_task])
        t_sel = in_task[sel]
        b_sel = in_b[sel]
        sel_o = rows_task[out_task]  # arity checked: exactly one output
        t_o = out_task[sel_o]
        b_o = out_b[sel_o]
        if not ((re_all[t_sel] <= rows[b_sel]).all() and (re_all[t_o] <= rows[b_o]).all()):
            return False
        in_lo[sel], in_hi[sel] = rs_all[t_sel] * rlen[b_sel], re_all[t_sel] * rlen[b_sel]
        out_lo[sel_o], out_hi[sel_o] = rs_all[t_o] * rlen[b_o], re_all[t_o] * rlen[b_o]
    if per_task:  # kv appends, attention, argmax, ...: the declared footprint function, task by task
        recs = c.records
        if recs is not None:
            bufs = recs.buffer_map()
        else:
            bufs = {nm: _BufView(nm, sh, kd) for nm, sh, kd in zip(names, shapes, kinds, strict=True)}
        in_start = in_off.tolist()
        out_start = (np.cumsum(out_len_a) - out_len_a).tolist()
        pos_i, pos_o, need_i, need_o = [], [], [], []
        memo: dict = {}  # the layers repeat the same (op, params, shapes): one footprint call each
        for i in per_task:
            op, t_in, t_out, tp = c.ops[i], ins[i], outs[i], params[i]
            spec = _SPECS[op]
            if spec.writes == "kv_slot" and bufs[t_out[0]].kind != "kv_cache":
                return False
            shp = [bufs[nm].shape for nm in chain(t_in, t_out)]
            try:
                key = (op, *tp.items(), *map(type, tp.values()), *shp)  # types: 1, 1.0 and True differ
                need = memo.get(key)
            except TypeError:  # unhashable values (raw JSON lists): no memo
                key = need = None
            if need is None:
                need = spec.footprint(tp, shp[:len(t_in)], shp[len(t_in):])
                if isinstance(need, str):
                    return False
                if key is not None:
                    memo[key] = need
            m = in_len[i]
            pos_i.extend(range(in_start[i], in_start[i] + m))
            pos_o.extend(range(out_start[i], out_start[i] + out_len[i]))
            need_i.extend(need[:m])
            need_o.extend(need[m:])
        in_lo[pos_i] = [x[0] for x in need_i]
        in_hi[pos_i] = [x[1] for x in need_i]
        out_lo[pos_o] = [x[0] for x in need_o]
        out_hi[pos_o] = [x[1] for x in need_o]
    # -- malformed: ranges (named operands only, within bounds, covering what the op touches) ------------
    rngs = c.ranges
    r_len = np.fromiter(map(len, rngs), np.int64, n)
    n_r = int(r_len.sum())
    if n_r:
        r_b = np.fromiter(map(bid.get, chain.from_iterable(rngs), repeat(-1)), np.int64, n_r)
        lohi = np.fromiter(chain.from_iterable(chain.from_iterable(map(dict.values, rngs))), np.int64, 2 * n_r)
        r_lo, r_hi = lohi[0::2], lohi[1::2]
        if (r_b < 0).any() or not ((r_lo >= 0) & (r_lo < r_hi) & (r_hi <= rows[r_b])).all():
            return False
        r_lo, r_hi = r_lo * rlen[r_b], r_hi * rlen[r_b]
        # each task's operands as a padded row (inputs, then outputs): buffer id and the rows it needs
        mi = int(in_len_a.max())
        width = mi + int(out_len_a.max())
        op_b = np.full((n, width), -1, np.int64)
        op_lo, op_hi = np.zeros((n, width), np.int64), np.zeros((n, width), np.int64)
        out_slot = np.arange(n_out) - (np.cumsum(out_len_a) - out_len_a)[out_task] + mi
        op_b[in_task, in_slot], op_lo[in_task, in_slot], op_hi[in_task, in_slot] = in_b, in_lo, in_hi
        op_b[out_task, out_slot], op_lo[out_task, out_slot], op_hi[out_task, out_slot] = out_b, out_lo, out_hi
        r_t = np.repeat(ar, r_len)
        hit = op_b[r_t] == r_b[:, None]
        if not hit.any(axis=1).all():
            return False  # a ranges entry for a buffer the task does not name
        lo_t, hi_t = op_lo[r_t], op_hi[r_t]
        if (hit & (hi_t > lo_t) & ((lo_t < r_lo[:, None]) | (hi_t > r_hi[:, None]))).any():
            return False  # declared rows narrower than what the op touches
    # -- unordered-read, kv-order, write-race: per buffer, all writes (disjoint rows) before all reads ----
    tracked = ~is_weight
    wsel, rsel = tracked[out_b] & (out_hi > out_lo), tracked[in_b] & (in_hi > in_lo)  # empty: no access
    w_t, w_b, w_lo, w_hi = out_task[wsel], out_b[wsel], out_lo[wsel], out_hi[wsel]
    r_t, r_b2, r_lo2, r_hi2 = in_task[rsel], in_b[rsel], in_lo[rsel], in_hi[rsel]
    max_w = np.full(nb, -1, np.int64)
    np.maximum.at(max_w, w_b, w_t)
    min_r = np.full(nb, n, np.int64)
    np.minimum.at(min_r, r_b2, r_t)
    if not (max_w < min_r).all():
        return False  # a buffer read before (or by) one of its writers: the exact rules decide
    order = np.lexsort((w_lo, w_b))
    sb, slo, shi, st = w_b[order], w_lo[order], w_hi[order], w_t[order]
    if len(sb) > 1 and ((sb[1:] == sb[:-1]) & (shi[:-1] > slo[1:])).any():
        return False  # overlapping writes of one buffer
    big = int(size.max()) + 1
    k_hi, k_lo = sb * big + shi, sb * big + slo
    a = np.searchsorted(k_hi, r_b2 * big + r_lo2, "right")
    b = np.searchsorted(k_lo, r_b2 * big + r_hi2, "left")
    cnt = b - a
    init = np.fromiter((k in _INIT_KINDS for k in kinds), bool, nb)
    need_cover = ~init[r_b2]
    if need_cover.any():
        cum = np.concatenate(([0], np.cumsum(shi - slo)))
        has = cnt > 0
        ac, bc = np.minimum(a, len(sb) - 1), np.maximum(b - 1, 0)
        covered = np.where(has, cum[b] - cum[a] - np.maximum(0, r_lo2 - slo[ac]) - np.maximum(0, shi[bc] - r_hi2), 0)
        if (need_cover & (covered != r_hi2 - r_lo2)).any():
            return False  # rows read that nothing earlier writes
    total = int(cnt.sum())
    if total:
        rd = np.repeat(np.arange(len(r_t)), cnt)
        starts = np.cumsum(cnt) - cnt
        wpos = a[rd] + (np.arange(total) - starts[rd])
        wj, ri = st[wpos], r_t[rd]
        sm_a = np.fromiter(sms, np.int64, n)
        direct = sm_a[wj] == sm_a[ri]  # same SM, earlier (every writer precedes every reader)
        if len(wc):  # an all-join wait of the reader on the writer's counter
            full = wt_a == nprod[wc_a]
            aj = np.unique(w_task[full] * ncnt + wc_a[full])
            key = ri * ncnt + sig[wj]
            p = np.minimum(np.searchsorted(aj, key), max(len(aj) - 1, 0))
            if len(aj):
                direct |= aj[p] == key
        if not direct.all():  # transitive: through chains of all-join waits (counter level), else exact
            wj, ri = wj[~direct], ri[~direct]
            mine = _counter_closure(w_task[full], wc_a[full], sig, ncnt, ri) if ncnt <= _CLOSURE_COUNTERS else None
            if (mine is None or not all(map(_has_bit, mine, sig[wj].tolist()))) and not _ordered(c, wj, ri):
                return False
    # -- unreachable-output ---------------------------------------------------------------------------
    if c.outputs:
        n_w = np.bincount(w_b, minlength=nb)
        rows_w = np.bincount(w_b, weights=(w_hi - w_lo), minlength=nb)
        for name in c.outputs:
            k = bid[name]
            if not n_w[k] or (not init[k] and rows_w[k] != size[k]):
                return False
    return True


def _has_bit(bits: int, k: int) -> bool:
    return bool((bits >> k) & 1)


def _counter_closure(w_task: Any, w_counter: Any, sig: Any, ncnt: int, readers: Any) -> list[int]:
    """For each task in ``readers``, the bitset of counters all of whose producers are guaranteed to
    finish before it starts, following all-join waits only (``w_task``/``w_counter``: every all-join
    wait). An under-approximation of ``pred``: SM order and first-of-N waits are left out, so a pair it
    cannot show ordered goes to the exact ``_ordered``.

    ``kc[d]``: counters complete before *every* task that all-joins ``d`` starts. A producer ``p`` of
    ``d`` that all-joins ``e`` knows ``e`` and ``kc[e]``; a task that all-joins ``d`` knows all of
    ``d``'s producers, so (``pred`` is transitive) everything any of them knows: ``kc[d] |= bit(e) |
    kc[e]``. Edges are taken once each, in list order of their first waiter, so ``kc[e]`` is final
    when used (every producer of ``e`` precedes every waiter on ``e``)."""
    key = sig[w_task] * ncnt + w_counter  # edge: producer of sig -> all-joins w_counter
    uniq, first = np.unique(key, return_index=True)
    uniq = uniq[np.argsort(first, kind="stable")]
    kc = [0] * ncnt
    for d, e in zip((uniq // ncnt).tolist(), (uniq % ncnt).tolist(), strict=True):
        kc[d] |= kc[e] | (1 << e)
    r_uniq, r_inv = np.unique(readers, return_inverse=True)
    sel = np.isin(w_task, r_uniq)
    known = dict.fromkeys(r_uniq.tolist(), 0)
    for i, e in zip(w_task[sel].tolist(), w_counter[sel].tolist(), strict=True):
        known[i] |= kc[e] | (1 << e)
    per = [known[i] for i in r_uniq.tolist()]
    return [per[k] for k in r_inv.tolist()]


def _ordered(c: Any, wj: Any, ri: Any) -> bool:
    """Whether every writer ``wj[k]`` happens before its reader ``ri[k]``: the exact happens-before of
    ``Facts.conflicts`` (vector clocks, :mod:`mosaic_amk.validate.clocks`) over columns, for a schedule whose
    waits passed the screen (every wait satisfiable, all its producers earlier)."""
    n, sms = c.n, c.sms
    slot = slots_of(sms)
    if slot is None:
        return False
    wc, wt, wlen = c.wait_counter, c.wait_threshold, c.wait_len
    waits, k = [], 0
    for m in wlen:
        waits.append(list(zip(wc[k:k + m], wt[k:k + m], strict=True)))
        k += m
    order = np.argsort(ri, kind="stable")
    ri_s, wj_s = ri[order], wj[order]
    task_slot = np.fromiter(map(slot.__getitem__, sms), np.int64, n)
    ws = task_slot[wj_s]
    readers, start = np.unique(ri_s, return_index=True)
    ends = np.append(start[1:], len(ri_s)).tolist()
    readers, start = readers.tolist(), start.tolist()
    q, nq = 0, len(readers)
    for i, clk in enumerate(inclusive_clocks(sms, c.signals, waits, c.num_counters, slot)):
        if i == readers[q]:
            a, b = start[q], ends[q]
            if not (clk[ws[a:b]] >= wj_s[a:b]).all():
                return False
            q += 1
            if q == nq:
                return True
    return q == nq
