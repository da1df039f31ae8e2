"""Global alignment (Needleman-Wunsch, unit costs) of two operation-class sequences.

Rows of the DP are computed with numpy: with unit gap costs the in-row recurrence
``D[i][j] = min(T[j], D[i][j-1] + 1)`` is ``j + cummin(T[k] - k)``, so each row is a handful of vector
operations. Sequences longer than ``MAX_LEN`` are compared on their first ``MAX_LEN`` elements (said in the
result).
"""

from __future__ import annotations

import numpy as np

MAX_LEN = 20_000


def alignment_cost(a: list[str], b: list[str]) -> tuple[int, bool]:
    """Edit cost (substitutions, insertions, deletions) of the best global alignment, and whether cut."""
    cut = len(a) > MAX_LEN or len(b) > MAX_LEN
    a, b = a[:MAX_LEN], b[:MAX_LEN]
    if not a or not b:
        return max(len(a), len(b)), cut
    vocab = {s: n for n, s in enumerate(dict.fromkeys(a + b))}
    av = np.array([vocab[s] for s in a], dtype=np.int32)
    bv = np.array([vocab[s] for s in b], dtype=np.int32)
    m = len(bv)
    ar = np.arange(m + 1, dtype=np.int64)
    prev = ar.copy()
    for i in range(1, len(av) + 1):
        sub = prev[:-1] + (bv != av[i - 1])
        t = np.empty(m + 1, dtype=np.int64)
        t[0] = i
        t[1:] = np.minimum(sub, prev[1:] + 1)
        prev = np.minimum.accumulate(t - ar) + ar
    return int(prev[-1]), cut
