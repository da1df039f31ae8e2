"""The launch a CuTe DSL kernel file's host code makes, read from the compiled program's host IR (no GPU).

A CuTe DSL file launches its kernel inside its own ``@cute.jit`` function (``kernel(...).launch(grid=, block=,
smem=, cluster=)``, or a launch the DSL sizes itself: the dynamic shared memory of a third-party kernel is the
size of its shared-storage struct, known only once the DSL has laid it out). ``cute.compile`` lowers that host
function to LLVM IR (``compiled.ir_module``) which fills a ``cudaLaunchConfig_t`` for ``cudaLaunchKernelEx``:

    llvm.getelementptr %cfg[0, 0, 1] : ... !llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>

grid (field 0), block (field 1), dynamic shared memory bytes (field 2), and an attribute array whose entries
``struct<(i32 id, array<4 x i8>, array<64 x i8> value)>`` carry the cluster shape (id 4,
``cudaLaunchAttributeClusterDimension``, its value three i32). With static shapes (the contract's fake
tensors) every one of those is an ``llvm.mlir.constant``; :func:`read_launches` returns the launches whose
fields are all constants, one per ``cudaLaunchKernelEx`` configuration, and leaves out any it cannot read.
"""

from __future__ import annotations

import re

import attrs

CONFIG = "!llvm.struct<(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32)>"
ATTRIBUTE = "!llvm.struct<(i32, array<4 x i8>, array<64 x i8>)>"
DIM3 = "!llvm.struct<(i32, i32, i32)>"
CLUSTER_DIMENSION = 4  # cudaLaunchAttributeClusterDimension

_FUNC = re.compile(r"^\s*llvm\.func\b")
_CONST = re.compile(r"^\s*(%[\w.]+) = llvm\.mlir\.constant\((-?\d+) : i(?:32|64)\)")
_GEP = re.compile(r"^\s*(%[\w.]+) = llvm\.getelementptr (?:inbounds )?(%[\w.]+)\[([^\]]*)\] : \([^)]*\) -> "
                  r"!llvm\.ptr, (.+?)\s*$")
_STORE = re.compile(r"^\s*llvm\.store (%[\w.]+), (%[\w.]+) : i(?:32|64), !llvm\.ptr")


@attrs.frozen
class HostLaunch:
    """One launch configuration of the host code: grid, block, cluster, dynamic shared memory (bytes)."""

    grid: tuple
    block: tuple
    cluster: tuple
    dynamic_smem: int


def _launches_of(lines: list[str]) -> list[HostLaunch]:
    consts: dict[str, int] = {}
    geps: dict[str, tuple[str, tuple[str, ...], str]] = {}
    config: dict[str, dict] = {}  # config base -> {(field, index): value}
    attr_id: dict[str, int | None] = {}  # attribute entry -> its id
    attr_val: dict[str, str] = {}  # value pointer -> attribute entry
    dims: dict[str, dict] = {}  # attribute entry -> {index: value}
    for line in lines:
        m = _CONST.match(line)
        if m:
            consts[m[1]] = int(m[2])
            continue
        m = _GEP.match(line)
        if m:
            idx = tuple(i.strip() for i in m[3].split(","))
            geps[m[1]] = (m[2], idx, m[4])
            if m[4] == ATTRIBUTE and idx == ("0", "2"):
                attr_val[m[1]] = m[2]
            continue
        m = _STORE.match(line)
        if not m or m[2] not in geps:
            continue
        base, idx, typ = geps[m[2]]
        value = consts.get(m[1])
        if typ == CONFIG and idx[0] == "0" and len(idx) in (2, 3):
            field = int(idx[1]) if idx[1].isdigit() else None
            if field in (0, 1) and len(idx) == 3 and idx[2].isdigit():
                config.setdefault(base, {})[(field, int(idx[2]))] = value
            elif field == 2 and len(idx) == 2:
                config.setdefault(base, {})[(2, 0)] = value
        elif typ == ATTRIBUTE and idx == ("0", "0"):
            attr_id[base] = value
        elif typ == DIM3 and base in attr_val and len(idx) == 2 and idx[1].isdigit():
            dims.setdefault(attr_val[base], {})[int(idx[1])] = value
    cluster = (1, 1, 1)
    for entry, d in dims.items():
        vals = tuple(d.get(i) for i in range(3))
        if attr_id.get(entry) == CLUSTER_DIMENSION and None not in vals:
            cluster = vals
    out = []
    for f in config.values():
        grid, block = tuple(f.get((0, i)) for i in range(3)), tuple(f.get((1, i)) for i in range(3))
        smem = f.get((2, 0))
        if None in grid or None in block or smem is None:
            continue
        out.append(HostLaunch(grid, block, cluster, smem))
    return out


def read_launches(ir_text: str) -> list[HostLaunch]:
    """The constant launch configurations of every host function in ``ir_text`` (``str(compiled.ir_module)``)."""
    out, func = [], []
    for line in ir_text.splitlines():
        if _FUNC.match(line):
            out.extend(_launches_of(func))
            func = []
        func.append(line)
    out.extend(_launches_of(func))
    return out
