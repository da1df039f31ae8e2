"""Quantized weights (mosaic_amk.quant): the defined float32 arithmetic against a scalar re-implementation, GGUF's
blocks against the gguf package's own dequantiser, the device planes, the ReferenceVM / lowering / encoder on a
quantized model, and the importer's int8 weight-only layout and refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mosaic_amk import quant
from mosaic_amk.quant import BLOCK, QuantizedTensor

F32 = np.float32


def _random(fmt: str, rows: int, cols: int, seed: int = 0) -> QuantizedTensor:
    rng = np.random.default_rng(seed)
    nb = cols // BLOCK
    if fmt == "int8":
        return QuantizedTensor("int8", (rows, cols), rng.integers(-127, 128, (rows, cols), dtype=np.int8),
                               rng.uniform(1e-3, 2e-2, rows).astype(F32))
    d = rng.uniform(1e-3, 3e-2, (rows, nb)).astype(np.float16)
    if fmt == "q8_0":
        return QuantizedTensor("q8_0", (rows, cols), rng.integers(-127, 128, (rows, cols), dtype=np.int8), d)
    m = (-rng.uniform(0, 0.2, (rows, nb))).astype(np.float16)
    return QuantizedTensor("q4_1", (rows, cols), rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8), d, m)


def _scalar_dot(w: QuantizedTensor, x: np.ndarray, r: int) -> np.float32:
    """The module docstring's steps 1-6, written out one float32 scalar operation at a time."""
    cols = w.shape[1]
    nb = cols // BLOCK
    block_sums = []
    for b in range(nb):
        p = []
        for e in range(BLOCK):
            i = b * BLOCK + e
            if w.format == "q4_1":
                byte = int(w.codes[r, b * 16 + (e % 16)])
                q = F32(byte & 15 if e < 16 else byte >> 4)
                wv = F32(F32(w.scales[r, b]) * q) + F32(w.mins[r, b])
            elif w.format == "q8_0":
                wv = F32(F32(w.scales[r, b]) * F32(w.codes[r, i]))
            else:
                wv = F32(w.codes[r, i])
            p.append(F32(wv * x[i]))
        while len(p) > 1:
            p = [F32(p[k] + p[k + 1]) for k in range(0, len(p), 2)]
        block_sums.append(p[0])
    lanes = [F32(0.0)] * 32
    for b, s in enumerate(block_sums):
        lanes[b % 32] = F32(lanes[b % 32] + s)
    for o in (16, 8, 4, 2, 1):
        lanes = [F32(lanes[k] + lanes[k ^ o]) for k in range(32)]
    out = lanes[0]
    return F32(w.scales[r] * out) if w.format == "int8" else out


@pytest.mark.parametrize("fmt", quant.FORMATS)
@pytest.mark.parametrize("cols", [96, 1088])  # 3 blocks (lanes 0-2), 34 blocks (lanes 0 and 1 take two)
def test_matvec_is_the_defined_order_bit_for_bit(fmt, cols):
    w = _random(fmt, 5, cols, seed=cols)
    x = np.random.default_rng(1).standard_normal(cols).astype(F32)
    got = quant.matvec(w, x, 1, 4)
    want = np.array([_scalar_dot(w, x, r) for r in range(1, 4)], F32)
    assert got.dtype == F32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), (got, want)
    # and it is a dot product of the dequantised weights (to float32 rounding)
    ref = w.dequantize(1, 4).astype(np.float64) @ x.astype(np.float64)
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt,kind", [("q8_0", "Q8_0"), ("q4_1", "Q4_1")])
def test_gguf_blocks_dequantise_exactly_as_the_gguf_package(fmt, kind):
    import gguf

    data = np.random.default_rng(2).standard_normal((7, 256)).astype(F32)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    raw = gguf.quants.quantize(data, qtype)
    t = quant.from_gguf_blocks(fmt, raw, data.shape)
    ref = gguf.quants.dequantize(raw, qtype).astype(F32)
    assert np.array_equal(t.dequantize().view(np.uint32), ref.view(np.uint32))
    # the 16-byte device planes hold the same codes and scales
    dev = t.device_bytes()
    assert dev.size == quant.device_nbytes(fmt, data.shape) and dev.size % 16 == 0
    code_bytes = t.codes.nbytes
    assert np.array_equal(dev[:code_bytes], t.codes.view(np.uint8).reshape(-1))
    at = -(-code_bytes // 16) * 16
    assert np.array_equal(dev[at:at + t.scales.nbytes].view(np.float16).reshape(t.scales.shape), t.scales)


def test_bad_layouts_and_formats_are_refused_with_one_line():
    from mosaic.errors import BadInput

    with pytest.raises(BadInput, match="multiple of the block size"):
        QuantizedTensor("q8_0", (2, 40), np.zeros((2, 40), np.int8), np.zeros((2, 1), np.float16))
    with pytest.raises(BadInput, match="scales must be float16"):
        QuantizedTensor("q8_0", (2, 32), np.zeros((2, 32), np.int8), np.zeros((2, 1), F32))
    with pytest.raises(BadInput, match="format 'q6_k'"):
        QuantizedTensor("q6_k", (2, 32), np.zeros((2, 32), np.int8), np.zeros((2, 1), np.float16))
    with pytest.raises(BadInput, match="not read natively"):
        quant.from_gguf_blocks("q6_k", np.zeros((1, 210), np.uint8), (1, 256))


def test_int8_quantization_round_trips_within_half_a_step():
    w = np.random.default_rng(3).standard_normal((6, 64)).astype(F32)
    w[2] = 0.0
    t = quant.quantize_int8(w)
    err = np.abs(t.dequantize() - w)
    assert np.all(err <= t.scales[:, None] * 0.5 + 1e-7)
    assert t.scales[2] == 1.0 and not t.codes[2].any()


# ------------------------------------------------------------------------------- a quantized model end to end

@pytest.fixture(scope="module")
def int8_dirs(tmp_path_factory):
    """A tiny Llama (every projection's in-features a multiple of 32) written as int8 weight-only, and the float32
    checkpoint of its dequantised weights."""
    from mosaic_amk.int8_checkpoint import quantize
    from mosaic_amk.tiny_models import make_checkpoint

    root = tmp_path_factory.mktemp("int8")
    src = make_checkpoint(root / "f32", "llama", intermediate_size=128)
    summary = quantize(src, root / "int8", dequantized=root / "deq")
    return root / "int8", root / "deq", summary


def test_int8_checkpoint_imports_with_quantized_projections(int8_dirs):
    from mosaic_amk.importer import import_checkpoint

    qdir, ddir, summary = int8_dirs
    spec = import_checkpoint(qdir)
    assert summary["quantized"] == 7 * spec.num_layers
    assert sorted(set(spec.quantized().values())) == ["int8"] and len(spec.quantized()) == 7 * spec.num_layers
    deq = import_checkpoint(ddir)
    for name, t in spec.weights.items():
        if isinstance(t, QuantizedTensor):
            assert np.array_equal(t.dequantize(), deq.weights[name])  # HF runs exactly scale * q
        else:
            assert np.array_equal(t, deq.weights[name]), name


def test_quantized_model_runs_on_the_reference_vm_close_to_its_dequantised_float_model(int8_dirs):
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.reference_vm import ReferenceVM

    qdir, ddir, _ = int8_dirs
    q, d = import_checkpoint(qdir), import_checkpoint(ddir)
    tq, lq = ReferenceVM(q).generate([3, 1, 4], 6)
    td, ld = ReferenceVM(d).generate([3, 1, 4], 6)
    assert tq == td
    err = max(float(np.max(np.abs(a - b))) for a, b in zip(lq, ld, strict=True))
    assert 0 < err < 1e-3  # another summation order (the scale after the sum), not another model


def test_quantized_weights_lower_and_encode_in_their_own_formats(int8_dirs):
    from mosaic.plugins import host
    from mosaic_amk.config import ScheduleConfig
    from mosaic_amk.cuda import decode as D
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.lowering import lower

    spec = import_checkpoint(int8_dirs[0])
    gpu = host().get("gpus", "h200")
    for fusion in (ScheduleConfig().fusion, ("residual", "gate_up_silu", "rope_append", "rmsnorm_gemv",
                                             "gemv_rope_append")):
        s = lower(spec, ScheduleConfig(fusion=fusion), gpu, 0)
        q_name = spec.layer(0, "self_attn.q_proj.weight")
        assert {b.name: b.dtype for b in s.buffers}[q_name] == "int8"
        enc = E.encode(s)
        b = enc.buffers[enc.buffer_id(q_name)]
        assert b.dtype == E.DT_INT8 and b.nbytes == quant.device_nbytes("int8", b.shape)
        assert enc.weight_bytes() < sum(w.size * 2 for w in spec.weights.values())  # below the bf16 bytes
        back = D.decode(enc)
        assert {x.name: x.dtype for x in back.buffers}[q_name] == "int8"


def test_the_encoder_refuses_a_quantized_weight_where_no_micro_kernel_reads_one(int8_dirs):
    from mosaic_amk.cuda import encode as E
    from mosaic_amk.schedule import Buffer, Schedule, Task

    bufs = (Buffer("x", "f32", (64,), "input"), Buffer("w", "int8", (64, 64), "weight"),
            Buffer("y", "f32", (64,), "output"))
    s = Schedule(num_sms=1, buffers=bufs, num_counters=1, outputs=("y",),
                 tasks=(Task(id=0, op="rmsnorm", sm=0, inputs=("x", "w"), outputs=("y",), waits=(), signal=0,
                             params={"eps": 1e-5}),))
    with pytest.raises(E.EncodeError, match="weight buffer w is int8 on the device"):
        E.encode(s)


def test_other_quantization_configs_are_refused_with_one_line(tmp_path, int8_dirs, capsys):
    from mosaic.cli import main

    qdir = int8_dirs[0]
    for qc, needle in (({"quant_method": "gptq", "bits": 4}, "quantization_config 'gptq'"),
                       ({**json.loads((qdir / "config.json").read_text())["quantization_config"],
                         "config_groups": {"g": {"targets": ["Linear"], "weights": {
                             "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}}}},
                        "num_bits 4")):
        d = tmp_path / qc["quant_method"]
        d.mkdir()
        cfg = json.loads((qdir / "config.json").read_text())
        cfg["quantization_config"] = qc
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(SystemExit) as exc:
            main(["amk", "lower", "--model", str(d), "-o", str(tmp_path / "s.json")])
        out = capsys.readouterr()
        assert exc.value.code == 2, (out.out, out.err)
        lines = [ln for ln in out.err.strip().splitlines() if ln and not ln.startswith("warning: ")]
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], out.err
        assert "Traceback" not in out.out + out.err


def test_floor_benchmark_table(tmp_path):
    """benchmarks/amk_quant_floor.py: per shape, bf16 > q8_0 > int8 > q4_1 bytes; the 4-bit floor falls far less than
    4x because the bf16 embedding / LM head stays wide; the bf16 Llama-3.2-1B floor is the bench's 0.515 ms."""
    import amk_quant_floor as F

    assert F.main(["--json", str(tmp_path / "f.json")]) == 0
    rows = {(r["shape"], r["format"]): r for r in json.loads((tmp_path / "f.json").read_text())["rows"]}
    for shape in F.SHAPES:
        t = {f: rows[(shape, f)]["total"] for f in F.FORMATS}
        assert t["bf16"] > t["q8_0"] > t["int8"] > t["q4_1"] > t["q4_1 as shipped"]
        # by hand: Q4_1 is 20 bytes per 32 projection weights (nibbles + an f16 scale and min per block), the tied
        # bf16 table and the norms stay 2 bytes a weight (every plane here is already 16-byte aligned)
        h, inter, layers, nh, nkv, hd, vocab, _ = F.SHAPES[shape]
        proj = layers * (2 * nh * hd * h + 2 * nkv * hd * h + 3 * inter * h)
        wide = vocab * h + (2 * layers + 1) * h
        want = (2 * proj + 2 * wide) / (proj * 20 / 32 + 2 * wide)
        assert rows[(shape, "q4_1")]["vs_bf16"] == pytest.approx(want, rel=1e-12)
        assert rows[(shape, "q4_1")]["vs_bf16"] < 2 / (20 / 32)  # below the projections' own 3.2x
    assert abs(rows[("llama-3.2-1b", "bf16")]["floor_ms"] - 0.515) < 1e-3


@pytest.mark.slow
def test_floor_table_equals_the_encoder_on_the_real_gguf(smollm2_checkpoint):
    import amk_quant_floor as F

    real = F.real_bytes()
    want = F.step_bytes(F.SHAPES["smollm2-135m"], "q4_1", "q8_0")["total"]
    assert real["total"] == want and real["formats"] == ["bf16", "q4_1", "q8_0"]


def test_amk_quantize_command_and_generate_on_its_output(tmp_path, capsys):
    from mosaic.cli import main
    from mosaic_amk.tiny_models import make_checkpoint

    src = make_checkpoint(tmp_path / "f32", "llama", intermediate_size=128)
    with pytest.raises(SystemExit) as exc:
        main(["amk", "quantize", "--model", str(src), "-o", str(tmp_path / "q"), "--dequantized", str(tmp_path / "d")])
    assert exc.value.code in (0, None) and "14 of 21 tensors int8 per row" in capsys.readouterr().out
    tokens = {}
    for name in ("q", "d"):
        with pytest.raises(SystemExit) as exc:
            main(["amk", "generate", "--model", str(tmp_path / name), "--prompt-ids", "1,2,3", "--tokens", "6"])
        assert exc.value.code in (0, None)
        tokens[name] = capsys.readouterr().out.strip().splitlines()[0]
    assert tokens["q"] == tokens["d"] and len(tokens["q"].split(",")) == 6
    with pytest.raises(SystemExit) as exc:  # an existing output: one line, exit 2
        main(["amk", "quantize", "--model", str(src), "-o", str(tmp_path / "q")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "output exists" in err[0]


def test_quantized_q_k_rows_move_with_their_blocks_in_the_blocked_rope_order(int8_dirs):
    """rope_order blocked binds q/k weights row-permuted (QuantizedTensor.take_rows): the same tokens as standard."""
    from mosaic_amk.config import VM_FUSIONS, ScheduleConfig
    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.reference_vm import ReferenceVM

    spec = import_checkpoint(int8_dirs[0])
    a = ReferenceVM(spec).generate([1, 2, 3], 5)
    b = ReferenceVM(spec, ScheduleConfig(fusion=VM_FUSIONS, rope_order="blocked", gemv_split="balanced")).generate(
        [1, 2, 3], 5)
    assert a[0] == b[0]
    assert max(float(np.max(np.abs(x - y))) for x, y in zip(a[1], b[1], strict=True)) < 1e-4


def test_a_damaged_gguf_is_one_line(tmp_path, capsys):
    from mosaic.cli import main

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(SystemExit) as exc:
        main(["amk", "lower", "--model", str(bad), "-o", str(tmp_path / "s.json")])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("warning: ")]
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and "GGUF" in err[0], err
