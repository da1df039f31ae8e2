"""quack-kernels' CuTe DSL softmax forward (Tri Dao et al., ``pip install quack-kernels``) behind Mosaicist's
kernel-file contract (docs/kernel-files.md). An adapter, not a kernel: its entry builds quack's own
``quack.softmax.Softmax`` from the installed package and calls it; no quack code is copied here.

    mosaic capture --file examples/kernels/cute/quack_softmax.py --lang cute --family softmax \\
        --shape 16384x8192 --dtype bf16 --lower-only -o quack-softmax.bundle

quack lets a caller choose one thing for its softmax: ``online_softmax`` (one pass with a running maximum and
sum, the default; or two reductions, max then sum). Its launch (threads per CTA and per row, the cluster
split of a row) is quack's own heuristic from the row width and the compile target's arch, not an argument,
so it is no knob here.
"""

import dataclasses

import cutlass
import cutlass.cute as cute
from quack.softmax import Softmax

ENTRY = "softmax"
INPUTS = {"x": ("rows", "cols")}
OUTPUTS = {"y": ("rows", "cols")}


@dataclasses.dataclass(frozen=True)
class Knobs:
    online_softmax: bool = True  # quack's default: one pass, running max and sum; False: max, then sum


@cute.jit
def softmax(x: cute.Tensor, y: cute.Tensor, knobs: cutlass.Constexpr, stream):
    op = Softmax(x.element_type, cute.size(x, mode=[1]), online_softmax=knobs.online_softmax)
    op(x, y, stream)  # quack's Softmax.__call__(mX, mO, stream)
