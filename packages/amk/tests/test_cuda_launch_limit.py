"""The dynamic shared-memory limit of the VM's kernel is shared by every Launcher of one cubin (cupy memoizes the
loaded module per path and device, so all of them hold one CUfunction). A Launcher created later with a smaller
buffer table must not lower it under an earlier one's launch size: that was the CUDA_ERROR_INVALID_VALUE of the
unfused bench candidates ("grid size will be reduced from 132 to 0") timed after the fused ones were created."""

from __future__ import annotations

import numpy as np
import pytest
from mosaic.plugins import host
from mosaic_amk.config import VM_FUSIONS, ScheduleConfig
from mosaic_amk.cuda import encode as E
from mosaic_amk.lowering import TOKEN, lower
from mosaic_amk.tiny_models import tiny_model


def _table_bytes(enc) -> int:  # launcher.Launcher's table size
    return -(-(len(enc.buffers) * (8 + 4 * E.BUF_META) + 4 * max(1, enc.num_counters)) // 16) * 16


def _encodings():
    spec = tiny_model("llama")
    gpu = host().get("gpus", "h200")
    unfused = E.encode(lower(spec, ScheduleConfig(kv_max_tokens=64), gpu, 0))
    fused = E.encode(lower(spec, ScheduleConfig(kv_max_tokens=64, fusion=VM_FUSIONS), gpu, 0))
    return spec, unfused, fused


def test_an_unfused_schedule_has_the_larger_table():
    _, unfused, fused = _encodings()
    assert _table_bytes(unfused) > _table_bytes(fused)


@pytest.mark.gpu
def test_a_later_launcher_with_a_smaller_table_does_not_break_an_earlier_one(cuda_device):
    from mosaic_amk.cuda.build import build
    from mosaic_amk.cuda.launcher import Launcher

    spec, unfused, fused = _encodings()
    cubin = str(build(512).cubin)
    token = {TOKEN: np.array([3], np.int32)}  # unbound int32 buffers are filled with -1: the VM refuses that id
    first = Launcher(unfused, cubin, threads=512, mode="f32")
    first.bind(spec.weights, token)
    second = Launcher(fused, cubin, threads=512, mode="f32")  # the same CUfunction, a smaller launch
    second.bind(spec.weights, token)
    first.launch()  # raises DeviceError (CUDA_ERROR_INVALID_VALUE) when the limit fell under its launch size
    assert int(first.fn.max_dynamic_shared_size_bytes) >= first.smem_bytes + first.ring_bytes + first.table_bytes
    first.check()
    second.launch()
    second.check()
