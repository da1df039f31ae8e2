"""The CUDA VM's synchronisation variants on the CPU: the launcher's sync_flags agree with vm.cu's SYNC_*
defines, the config refuses unknown modes, and the bench names and configures one candidate per variant
(test_cuda_build checks the VM, variants included, builds for sm_90a without spills)."""

from __future__ import annotations

import re

import pytest
from mosaic.errors import BadInput
from mosaic_amk.bench.bench import SYNC_VARIANTS, sync_candidates
from mosaic_amk.config import PREFETCH_MODES, SIGNAL_MODES, WAIT_MODES, ScheduleConfig
from mosaic_amk.cuda import launcher as L
from mosaic_amk.cuda.build import SOURCE_DIR


def _defines() -> dict[str, int]:
    src = (SOURCE_DIR / "vm.cu").read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define (SYNC_\w+|SIGNAL_\w+) (\d+)", src)}


def test_sync_flags_match_vm_cu():
    d = _defines()
    assert L.WAIT_FLAGS == {"acquire": 0, "relaxed": d["SYNC_WAIT_RELAXED"]}
    shift = d["SYNC_SIGNAL_SHIFT"]
    assert L.SIGNAL_FLAGS == {"inline": d["SIGNAL_INLINE"] << shift, "merged": d["SIGNAL_MERGED"] << shift,
                              "side": d["SIGNAL_SIDE"] << shift}
    assert max(L.SIGNAL_FLAGS.values()) >> shift <= d["SYNC_SIGNAL_MASK"]
    assert L.PREFETCH_FLAGS == {"inline": 0, "side": d["SYNC_PREFETCH_SIDE"]}
    # the three fields do not overlap: every combination is a distinct flag word
    words = {L.sync_flags(w, s, p) for w in WAIT_MODES for s in SIGNAL_MODES for p in PREFETCH_MODES}
    assert len(words) == len(WAIT_MODES) * len(SIGNAL_MODES) * len(PREFETCH_MODES)
    assert L.sync_flags() == 0  # the v0 path


def test_sync_flags_refuse_unknown_mode():
    with pytest.raises(L.DeviceError, match="signal_mode must be one of"):
        L.sync_flags(signal_mode="async")


@pytest.mark.parametrize("field,value", [("wait_mode", "spin"), ("signal_mode", "warp"), ("prefetch_mode", "tma")])
def test_config_refuses_unknown_sync_mode(field, value):
    with pytest.raises(BadInput, match=field):
        ScheduleConfig.from_mapping({field: value})


def test_config_defaults_are_v0_and_round_trip():
    c = ScheduleConfig()
    assert (c.wait_mode, c.signal_mode, c.prefetch_mode) == SYNC_VARIANTS["v0"]
    side = ScheduleConfig.from_mapping({"wait_mode": "relaxed", "signal_mode": "side", "prefetch_mode": "side"})
    assert ScheduleConfig.from_mapping(side.to_json()) == side


def test_sync_candidates_one_per_variant():
    base = [("rows32-lm", ScheduleConfig(gemv_rows_per_task=32)), ("rows16-lm", ScheduleConfig(gemv_rows_per_task=16))]
    out = sync_candidates(base)
    assert [n for n, _ in out] == [f"{b}/{v}" for b, _ in base for v in SYNC_VARIANTS]
    for name, cfg in out:
        b, v = name.split("/")
        assert (cfg.wait_mode, cfg.signal_mode, cfg.prefetch_mode) == SYNC_VARIANTS[v]
        assert cfg.gemv_rows_per_task == dict(base)[b].gemv_rows_per_task
    assert len({L.sync_flags(*SYNC_VARIANTS[v]) for v in SYNC_VARIANTS}) == len(SYNC_VARIANTS)
