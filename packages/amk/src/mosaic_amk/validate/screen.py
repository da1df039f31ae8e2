"""The validator's accelerated path: the rule table restated over the columnar form as numpy checks.

The screen answers one question: "would the rule table (:mod:`mosaic_amk.validate.rules`) return no
diagnostic at all?". It reads a schedule through its columns (:mod:`mosaic_amk.columns`, or
:func:`read_records` straight from the records) as whole-column numpy checks, and may only answer True
when the exact rules would return nothing (each check below implies the absence of the diagnostics
named beside it); any doubt, any unusual shape (a buffer written after it is read, overlapping writes,
an exception) answers False and the exact rule table runs and names every problem. So the screen
decides nothing on its own about an unsafe schedule: it only lets safe ones skip the per-task walk, and
every diagnostic ``validate`` reports is the rule table's own. packages/amk/tests/test_validator_parity.py
and test_validate_fast_path.py (and benchmarks/amk_validate_parity.py) check verdict and diagnostics of
``validate`` against the rule table alone (``validate_rules``).

How it is laid out (each step whole-column; no loop over tasks in Python):

- operand names are resolved per *distinct* ``inputs`` / ``outputs`` tuple (a dict keyed by the tuple;
  the row tasks of one projection share one), into padded per-task operand matrices (task x slot:
  buffer id, element lo, element hi); ``ranges`` names likewise per distinct key tuple, and the operand
  slot each entry names once per distinct (ranges names, inputs, outputs);
- parameters are read per op group, one C-level ``map`` per parameter; plain row-split ops
  (``OpSpec.whole_prefix``) are vectorised from that declaration, the other ops call their declared
  ``footprint`` once per distinct (parameter values with their types, operand shapes), as the rule
  table memoises it;
- races are checked per buffer on sorted interval arrays (``argsort`` / ``searchsorted``), and
  happens-before of each read is shown per run of its writers: all on the reader's SM, or one counter
  the reader all-joins; the reads left are split into (writer, reader) pairs: the same SM, a direct
  all-join wait, a counter-level closure of all-join waits (Python-int bitsets over the distinct
  counter edges, a few hundred), else the exact vector clocks of the rule table's definition.

What it costs is mostly *reading* the records: ``benchmarks/amk_validate.py`` prints the read floor
(every value the rule table reads, touched once with C-level iteration and no checks) beside it.
"""

from __future__ import annotations

from itertools import chain, count, repeat
from operator import and_, itemgetter, rshift
from typing import Any

import numpy as np

from mosaic_amk import columns as _columns
from mosaic_amk.columns import Columns
from mosaic_amk.schedule import (
    BUFFER_KINDS,
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
# buffer kinds as codes: weight first, then the other kinds valid at launch, then the rest
_KIND = {k: i for i, k in enumerate(("weight", *sorted(_INIT_KINDS - {"weight"}),
                                     *sorted(set(BUFFER_KINDS) - _INIT_KINDS)))}
# the counter-level closure holds a bitset of counters per counter and per reader: only for few counters
_CLOSURE_COUNTERS = 4096


def screen(c: Any) -> bool:
    """True only if the rule table would find nothing (see the module docstring); never raises."""
    try:
        return _screen_checks(c)
    except Exception:  # noqa: BLE001 - any surprise: let the exact rules decide
        return False


def screen_records(s: Any) -> bool:
    """:func:`screen` of a :class:`~mosaic_amk.schedule.Schedule`, read by :func:`read_records`. False for a
    schedule with the page protocol: the screen does not restate the page rules, so the rule table decides (raw JSON
    with pages never reaches :func:`screen`: ``columns.from_raw`` does not read page fields and returns None)."""
    try:
        if s.has_pages():
            return False
        return _screen_checks(read_records(s))
    except Exception:  # noqa: BLE001
        return False


def read_records(s: Any) -> Columns:
    """The columns of a Schedule (``columns.from_schedule``: one C-level ``map`` per field; a multi-field
    getter would allocate a tuple per task, which costs more than the extra passes)."""
    return _columns.from_schedule(s)


def _distinct(seqs: Any, n: int) -> tuple[list, np.ndarray]:
    """The distinct sequences (first-use order) and, per item, the index of its distinct sequence."""
    d: dict = {}
    try:
        first = np.fromiter(map(d.setdefault, seqs, count()), np.int64, n)
    except TypeError:  # lists (raw JSON): hash them as tuples
        if not isinstance(seqs, list | tuple):
            raise
        d = {}
        first = np.fromiter(map(d.setdefault, map(tuple, seqs), count()), np.int64, n)
    where = np.empty(n, np.int64)
    where[np.fromiter(d.values(), np.int64, len(d))] = np.arange(len(d))
    return list(d), where[first]


def _operands(seqs: Any, n: int, cap: int, bid: dict) -> tuple[np.ndarray, list, np.ndarray, np.ndarray]:
    """Per task its operand buffer ids as a padded row (-1: no operand; as wide as the widest task), the
    distinct name tuples, each task's distinct index, and the operand count per task. KeyError: an
    unknown buffer name; OverflowError: more than ``cap`` operands (capacity: the exact rules report it)."""
    keys, inv = _distinct(seqs, n)
    u = len(keys)
    ulen = np.fromiter(map(len, keys), np.int64, u)
    width = int(ulen.max())
    if width > cap:
        raise OverflowError("capacity")
    flat = np.fromiter(map(bid.__getitem__, chain.from_iterable(keys)), np.int64, int(ulen.sum()))
    mat = np.full((u, max(width, 1)), -1, np.int64)
    mat[np.arange(max(width, 1)) < ulen[:, None]] = flat
    return mat[inv], keys, inv, ulen[inv]


def _take(seq: Any, idx: list) -> tuple:
    return itemgetter(*idx)(seq) if len(idx) > 1 else (seq[idx[0]],)


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
    if not bid.keys() >= set(c.outputs):
        return False
    if n == 0:
        return not c.outputs and (nb == 0 or _buffers(shapes, nb) is not None)  # unreachable-output otherwise
    got_b = _buffers(shapes, nb)
    if got_b is None:
        return False
    size, rows, rlen = got_b
    if len(set(c.ids)) != n:
        return False
    ar = np.arange(n)
    sm_a = np.fromiter(c.sms, np.int64, n)
    sig = np.fromiter(c.signals, np.int64, n)
    if sm_a.min() < 0 or sm_a.max() >= nsm or sig.min() < 0 or sig.max() >= ncnt:
        return False
    # -- unsatisfiable-wait, partial-join, cycle, queue-order, list-order ---------------------------------
    # every wait: 1 <= t <= #producers, t in {1, #producers}, and every producer earlier in the list
    # (then no producer is the waiter itself or later: no self-wait, no backward edge)
    wlen = np.fromiter(c.wait_len, np.int64, n)
    nw = int(wlen.sum())
    nprod = np.bincount(sig, minlength=ncnt)
    if nw:
        if int(wlen.max()) > MAX_WAITS:
            return False
        wc_a = np.fromiter(c.wait_counter, np.int64, nw)
        wt_a = np.fromiter(c.wait_threshold, np.int64, nw)
        if wc_a.min() < 0 or wc_a.max() >= ncnt:
            return False
        w_task = np.repeat(ar, wlen)
        last = np.full(ncnt, -1, np.int64)
        np.maximum.at(last, sig, ar)
        np_w = nprod[wc_a]
        if not ((wt_a >= 1) & (wt_a <= np_w) & ((wt_a == 1) | (wt_a == np_w)) & (last[wc_a] < w_task)).all():
            return False
    # -- malformed: references, weights written, op table, parameters, arity ------------------------------
    kind = np.fromiter(map(_KIND.get, kinds, repeat(-1)), np.int64, nb)
    is_weight = kind == 0
    op_in, in_keys, in_inv, in_len = _operands(c.inputs, n, MAX_INPUTS, bid)  # KeyError: unknown buffer
    op_out, out_keys, out_inv, out_len = _operands(c.task_outputs, n, MAX_OUTPUTS, bid)
    if is_weight[op_out].any() and is_weight[op_out[op_out >= 0]].any():
        return False  # a task writes a weight
    op_a = np.fromiter(map(_OPCODE.__getitem__, c.ops), np.int64, n)  # KeyError: unknown op
    # element intervals per operand slot: whole buffers unless the op's footprint says otherwise
    in_lo, in_hi = np.zeros(op_in.shape, np.int64), size[op_in]
    out_lo, out_hi = np.zeros(op_out.shape, np.int64), size[op_out]
    params = c.params
    order = np.argsort(op_a, kind="stable")
    per_op = np.bincount(op_a, minlength=len(_OPS))
    bounds = np.cumsum(per_op).tolist()
    slot_in = np.arange(op_in.shape[1])
    shape_sig = None
    for k in np.flatnonzero(per_op).tolist():
        spec = _SPECS[_OPS[k]]
        idx = order[(bounds[k - 1] if k else 0):bounds[k]]
        group = _take(params, idx.tolist())
        m = len(group)
        pv = {p: list(map(itemgetter(p), group)) for p in spec.params}  # KeyError: a missing parameter
        if "head_dim" in pv:
            hd = pv["head_dim"]
            if not set(map(type, hd)) <= _INT_ONLY or max(hd) > MAX_HEAD_DIM:
                return False
        want = len(spec.inputs)
        for flag, _ in spec.optional:  # every optional flag is a required parameter too
            vals = pv[flag]
            if any(vals):
                want = want + np.fromiter(map(bool, vals), np.int64, m)
        if not ((in_len[idx] == want).all() and (out_len[idx] == len(spec.outputs)).all()):
            return False
        if k in _ROW_OPS:  # y and every input role after the whole-read prefix: rows [row_start, row_end)
            rs, re = pv["row_start"], pv["row_end"]
            if not (set(map(type, rs)) <= _INT_ONLY and set(map(type, re)) <= _INT_ONLY):
                return False
            rs_a, re_a = np.fromiter(rs, np.int64, m), np.fromiter(re, np.int64, m)
            if not ((rs_a >= 0) & (rs_a < re_a)).all():
                return False
            b_in, b_o = op_in[idx], op_out[idx, 0]
            row_slot = (slot_in >= _ROW_OPS[k]) & (b_in >= 0)
            if not (np.where(row_slot, re_a[:, None] <= rows[b_in], True).all() and (re_a <= rows[b_o]).all()):
                return False
            rl = rlen[b_in]
            in_lo[idx] = np.where(row_slot, rs_a[:, None] * rl, 0)
            in_hi[idx] = np.where(row_slot, re_a[:, None] * rl, in_hi[idx])
            out_lo[idx, 0], out_hi[idx, 0] = rs_a * rlen[b_o], re_a * rlen[b_o]
        elif k in _PER_TASK_OPS:  # kv appends, attention, argmax, ...: the declared footprint function
            if spec.writes == "kv_slot" and not all(kinds[b] == "kv_cache" for b in set(op_out[idx, 0].tolist())):
                return False
            if shape_sig is None:  # buffers by distinct shape: the footprint depends on shapes, not names
                shape_sig = np.append(_distinct(shapes, nb)[1], -1)  # [-1]: no operand
            if not _footprints(spec, group, idx, shape_sig[op_in[idx]], shape_sig[op_out[idx]], c, bid,
                               (in_lo, in_hi, out_lo, out_hi)):
                return False
    # -- malformed: ranges (named operands only, within bounds, covering what the op touches) ------------
    rngs = c.ranges
    r_keys, r_inv = _distinct(map(tuple, rngs), n)  # the buffer names of each task's entries, per distinct tuple
    u_len = np.fromiter(map(len, r_keys), np.int64, len(r_keys))
    r_len = u_len[r_inv]
    n_r = int(r_len.sum())
    if n_r:
        u_b = np.fromiter(map(bid.__getitem__, chain.from_iterable(r_keys)), np.int64, int(u_len.sum()))  # unknown
        u_mat = np.full((len(r_keys), int(u_len.max())), -1, np.int64)
        u_mat[np.arange(u_mat.shape[1]) < u_len[:, None]] = u_b
        t_mat = u_mat[r_inv]
        r_b = t_mat[t_mat >= 0]  # entry order: task by task, each dict's own order
        lohi = np.fromiter(chain.from_iterable(chain.from_iterable(map(dict.values, rngs))), np.int64, 2 * n_r)
        r_lo, r_hi = lohi[0::2], lohi[1::2]
        if not ((r_lo >= 0) & (r_lo < r_hi) & (r_hi <= rows[r_b])).all():
            return False
        op_b = np.concatenate((op_in, op_out), axis=1)  # each task's operands in one row: inputs, then outputs
        lo = np.concatenate((in_lo, out_lo), axis=1)
        hi = np.concatenate((in_hi, out_hi), axis=1)
        slot = _range_slots(r_inv, in_inv, out_inv, t_mat, u_mat, op_b) if n_r * op_b.shape[1] > 8192 else None
        r_lo, r_hi = r_lo * rlen[r_b], r_hi * rlen[r_b]
        if slot is None:  # few entries, a buffer in two roles of one task, or too many distinct tuples: entry x slot
            r_t = np.repeat(ar, r_len)
            hit = op_b[r_t] == r_b[:, None]
            if not hit.any(axis=1).all():
                return False  # a ranges entry for a buffer the task does not name
            lo, hi = lo[r_t], hi[r_t]
            if (hit & (hi > lo) & ((lo < r_lo[:, None]) | (hi > r_hi[:, None]))).any():
                return False  # declared rows narrower than what the op touches
        elif isinstance(slot, bool):
            return False  # a ranges entry for a buffer the task does not name
        else:
            at = np.repeat(ar * op_b.shape[1], r_len) + slot
            lo, hi = lo.ravel()[at], hi.ravel()[at]
            if ((hi > lo) & ((lo < r_lo) | (hi > r_hi))).any():
                return False  # declared rows narrower than what the op touches
    # -- unordered-read, kv-order, write-race: per buffer, all writes (disjoint rows) before all reads ----
    tracked = ~is_weight
    m_in = op_in >= 0
    m_in[m_in] = tracked[op_in[m_in]]
    m_in &= in_hi > in_lo  # an empty interval is no access
    m_out = op_out >= 0
    m_out[m_out] = tracked[op_out[m_out]]
    m_out &= out_hi > out_lo
    r_t = np.nonzero(m_in)[0]
    r_b2, r_lo2, r_hi2 = op_in[m_in], in_lo[m_in], in_hi[m_in]
    w_t = np.nonzero(m_out)[0]
    w_b, w_lo, w_hi = op_out[m_out], out_lo[m_out], out_hi[m_out]
    if (r_lo2 < 0).any() or (r_hi2 > size[r_b2]).any() or (w_lo < 0).any() or (w_hi > size[w_b]).any():
        return False  # a footprint outside its buffer: leave it to the exact rules
    max_w = np.full(nb, -1, np.int64)
    np.maximum.at(max_w, w_b, w_t)
    min_r = np.full(nb, n, np.int64)
    np.minimum.at(min_r, r_b2, r_t)
    if not (max_w < min_r).all():
        return False  # a buffer read before (or by) one of its writers: the exact rules decide
    big = int(size.max()) + 1
    k_lo = w_b * big + w_lo
    order = np.argsort(k_lo, kind="stable")
    k_lo, st = k_lo[order], w_t[order]
    k_hi = (w_b * big + w_hi)[order]
    if len(k_lo) > 1 and (k_hi[:-1] > k_lo[1:]).any():
        return False  # overlapping writes of one buffer (keys of different buffers never overlap)
    a = np.searchsorted(k_hi, r_b2 * big + r_lo2, "right")
    b = np.searchsorted(k_lo, r_b2 * big + r_hi2, "left")
    cnt = b - a
    init = (kind >= 0) & (kind < len(_INIT_KINDS))
    need_cover = ~init[r_b2]
    if need_cover.any():
        cum = np.concatenate(([0], np.cumsum(k_hi - k_lo)))
        ac, bc = np.minimum(a, len(k_lo) - 1), np.maximum(b - 1, 0)
        base = r_b2 * big
        covered = np.where(cnt > 0, cum[b] - cum[a] - np.maximum(0, base + r_lo2 - k_lo[ac])
                           - np.maximum(0, k_hi[bc] - base - r_hi2), 0)
        if (need_cover & (covered != r_hi2 - r_lo2)).any():
            return False  # rows read that nothing earlier writes
    if len(k_lo) and not _reads_ordered(c, a, b, cnt, st, r_t, sm_a, sig, w_task if nw else None,
                                        wc_a if nw else None, wt_a if nw else None, nprod, wlen, ncnt):
        return False
    # -- unreachable-output ---------------------------------------------------------------------------
    if c.outputs:
        k_out = np.fromiter(map(bid.__getitem__, c.outputs), np.int64, len(c.outputs))
        n_w = np.bincount(w_b, minlength=nb)[k_out]
        rows_w = np.bincount(w_b, weights=(w_hi - w_lo), minlength=nb)[k_out]
        if not (n_w > 0).all() or not (init[k_out] | (rows_w == size[k_out])).all():
            return False  # writes are disjoint and inside the buffer: their sum is the coverage
    return True


def _range_slots(r_inv: np.ndarray, in_inv: np.ndarray, out_inv: np.ndarray, t_mat: np.ndarray, u_mat: np.ndarray,
                 op_b: np.ndarray) -> np.ndarray | bool | None:
    """For every ranges entry (task by task), the operand slot of the buffer it names, worked out once per
    distinct (ranges names, input names, output names) of a task. False: an entry names a buffer the task
    does not name; None: a buffer in two of one task's roles (or too many distinct tuples to combine)."""
    n = len(r_inv)
    u_r, u_i, u_o = int(r_inv.max()) + 1, int(in_inv.max()) + 1, int(out_inv.max()) + 1
    if u_r * u_i * u_o >= 1 << 62:
        return None
    key = (r_inv * u_i + in_inv) * u_o + out_inv
    order = np.argsort(key, kind="stable")
    ks = key[order]
    head = np.ones(n, bool)
    head[1:] = ks[1:] != ks[:-1]
    combo = np.cumsum(head) - 1  # distinct combination of each task, in key order
    of_task = np.empty(n, np.int64)
    of_task[order] = combo
    rep = order[head]
    names, ops = u_mat[r_inv[rep]], op_b[rep]  # per combination: entry buffer ids, operand buffer ids
    match = (ops[:, None, :] == names[:, :, None]) & (names >= 0)[:, :, None]
    hits = match.sum(axis=2)
    if ((names >= 0) & (hits == 0)).any():
        return False
    if (hits > 1).any():
        return None
    per = match.argmax(axis=2)[of_task]
    return per[t_mat >= 0]


def _reads_ordered(c: Any, a: np.ndarray, b: np.ndarray, cnt: np.ndarray, st: np.ndarray, r_t: np.ndarray,
                   sm_a: np.ndarray, sig: np.ndarray, w_task: Any, wc_a: Any, wt_a: Any, nprod: np.ndarray,
                   wlen: np.ndarray, ncnt: int) -> bool:
    """Whether every read (task ``r_t[j]``) happens after each write it overlaps (sorted writes ``a[j] ..
    b[j] - 1``, by tasks ``st``). Per read first, where its writers share one counter (the row tasks of one
    projection) or one SM: an all-join wait of the reader on that counter, or the reader's own SM. The
    reads left are split into (writer, reader) pairs: the same SM, a direct all-join wait, a counter-level
    closure of all-join waits, else the exact vector clocks."""
    last = len(st) - 1
    has = cnt > 0
    a0, b1 = np.minimum(a, last), np.maximum(b - 1, 0)
    w_sig, w_sm = sig[st], sm_a[st]
    run_sig = np.concatenate(([0], np.cumsum(w_sig[1:] != w_sig[:-1])))
    run_sm = np.concatenate(([0], np.cumsum(w_sm[1:] != w_sm[:-1])))
    done = ~has | ((run_sm[b1] == run_sm[a0]) & (w_sm[a0] == sm_a[r_t]))  # no writer, or all on its SM
    aj = None
    if w_task is not None:
        full = wt_a == nprod[wc_a]
        w_task, wc_a = w_task[full], wc_a[full]
        # per task, the counters it all-joins (a padded row; -1: none)
        aj = np.full((len(sm_a), int(wlen.max())), -1, np.int64)
        aj[w_task, (np.arange(len(full)) - np.repeat(np.cumsum(wlen) - wlen, wlen))[full]] = wc_a
        done |= (run_sig[b1] == run_sig[a0]) & (aj[r_t] == w_sig[a0][:, None]).any(axis=1)
    if done.all():
        return True
    rest = np.flatnonzero(~done)
    cnt_r = cnt[rest]
    total = int(cnt_r.sum())
    rd = np.repeat(rest, cnt_r)
    wpos = np.arange(total) + np.repeat(a[rest] - (np.cumsum(cnt_r) - cnt_r), cnt_r)
    wj, ri = st[wpos], r_t[rd]
    direct = sm_a[wj] == sm_a[ri]  # same SM, earlier (every writer precedes every reader)
    if aj is not None:
        direct |= (aj[ri] == sig[wj][:, None]).any(axis=1)
    if direct.all():
        return True
    wj, ri = wj[~direct], ri[~direct]
    if aj is not None and len(wc_a) and ncnt <= _CLOSURE_COUNTERS:
        mine = _counter_closure(w_task, wc_a, sig, ncnt, ri)
        if all(map(and_, map(rshift, mine, sig[wj].tolist()), repeat(1))):
            return True
    return _ordered(c, wj, ri, wlen)


def _buffers(shapes: Any, nb: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per buffer (elements, rows of axis 0, elements per row), or None for a bad or too large shape."""
    rank = np.fromiter(map(len, shapes), np.int64, nb)
    if rank.min() < 1 or rank.max() > MAX_RANK:
        return None
    ext = np.fromiter(chain.from_iterable(shapes), np.int64, int(rank.sum()))
    if ext.min() < 1 or ext.max() > MAX_ELEMENTS:
        return None
    start = np.cumsum(rank) - rank
    if np.multiply.reduceat(ext.astype(np.float64), start).max() > MAX_ELEMENTS:
        return None  # (in float: the int64 product of four extents could wrap)
    size = np.multiply.reduceat(ext, start)
    rows = ext[start]
    return size, rows, size // rows


def _footprints(spec: Any, group: tuple, idx: np.ndarray, sig_in: np.ndarray, sig_out: np.ndarray, c: Any,
                bid: dict, into: tuple) -> bool:
    """The op's declared footprint for each task of one op group, computed once per distinct (parameter
    names and values, their types, operand shapes) -- the rule table's memo key -- and written into the
    interval matrices. False when the declaration reports a problem (``malformed``)."""
    in_lo, in_hi, out_lo, out_hi = into
    m = len(group)
    if len(set(map(tuple, group))) == 1:  # the same parameter names in the same order: values suffice
        vals = list(map(tuple, map(dict.values, group)))
        uniform = all(len(set(map(type, col))) == 1 for col in zip(*vals, strict=True))
    else:
        vals, uniform = list(map(tuple, map(dict.items, group))), False
    memo: dict = {}
    try:
        if uniform:  # each position holds one type throughout: equal values are of one type too
            types: Any = repeat(None)
        else:
            types = map(tuple, map(map, repeat(type), map(dict.values, group)))  # 1, 1.0 and True differ
        keys = zip(vals, types, map(tuple, sig_in.tolist()), map(tuple, sig_out.tolist()), strict=False)  # repeat()
        first = list(map(memo.setdefault, keys, count()))
    except TypeError:  # unhashable values (raw JSON lists): every task on its own
        first = list(range(m))
    reps = [r for r, f in enumerate(first) if r == f]
    fp_in = np.zeros((len(reps), in_lo.shape[1], 2), np.int64)
    fp_out = np.zeros((len(reps), out_lo.shape[1], 2), np.int64)
    for u, r in enumerate(reps):
        i = int(idx[r])
        ins, outs = c.inputs[i], c.task_outputs[i]
        shapes = [tuple(c.buf_shapes[bid[x]]) for x in chain(ins, outs)]
        need = spec.footprint(group[r], shapes[:len(ins)], shapes[len(ins):])
        if isinstance(need, str):
            return False
        k = len(ins)
        if len(need) != k + len(outs):
            return False
        if k:
            fp_in[u, :k] = need[:k]
        fp_out[u, :len(outs)] = need[k:]
    where = dict(zip(reps, range(len(reps)), strict=True))
    pick = list(map(where.__getitem__, first))
    got_in, got_out = fp_in[pick], fp_out[pick]  # padding slots (no operand) are masked out later
    in_lo[idx], in_hi[idx] = got_in[..., 0], got_in[..., 1]
    out_lo[idx], out_hi[idx] = got_out[..., 0], got_out[..., 1]
    return True


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
    order = np.argsort(key, kind="stable")
    ks = key[order]
    head = np.ones(len(ks), bool)
    head[1:] = ks[1:] != ks[:-1]
    uniq = key[np.sort(order[head])]  # each edge once, in list order of its first waiter
    kc = [0] * ncnt
    for d, e in zip((uniq // ncnt).tolist(), (uniq % ncnt).tolist(), strict=True):
        kc[d] |= kc[e] | (1 << e)
    mark = np.zeros(len(sig), bool)
    mark[readers] = True
    sel = mark[w_task]
    known = [0] * len(sig)
    for i, e in zip(w_task[sel].tolist(), w_counter[sel].tolist(), strict=True):
        known[i] |= kc[e] | (1 << e)
    return list(map(known.__getitem__, readers.tolist()))


def _ordered(c: Any, wj: Any, ri: Any, wlen: Any) -> bool:
    """Whether every writer ``wj[k]`` happens before its reader ``ri[k]``: the exact happens-before of
    ``Facts.conflicts`` (vector clocks, :mod:`mosaic_amk.validate.clocks`) over columns, for a schedule whose
    waits passed the screen (every wait satisfiable, all its producers earlier)."""
    n, sms = c.n, list(c.sms)
    slot = slots_of(sms)
    if slot is None:
        return False
    wc, wt = list(c.wait_counter), list(c.wait_threshold)
    waits, k = [], 0
    for m in wlen.tolist():
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
    for i, clk in enumerate(inclusive_clocks(sms, list(c.signals), waits, c.num_counters, slot)):
        if i == readers[q]:
            a, b = start[q], ends[q]
            if not (clk[ws[a:b]] >= wj_s[a:b]).all():
                return False
            q += 1
            if q == nq:
                return True
    return q == nq
