"""The quantized GEMV/embedding paths are a build variant (AMK_QUANT=1), chosen from the model's weights; the bf16
builds keep their registers (no spills in the preload + attention-stage build)."""

import attrs
from mosaic_amk import quant
from mosaic_amk.cuda import build as B
from mosaic_amk.cuda.cuda_vm import quant_defines
from mosaic_amk.tiny_models import tiny_model


def test_quant_defines_follow_the_weights():
    model = tiny_model("llama")
    assert quant_defines(model) == ()
    name = next(k for k, v in model.weights.items() if v.ndim == 2 and k.endswith("q_proj.weight"))
    qmodel = attrs.evolve(model, weights={**model.weights, name: quant.quantize_int8(model.weights[name])})
    assert quant_defines(qmodel) == ("AMK_QUANT=1",)


def test_the_quant_build_compiles_and_the_bf16_build_does_not_spill():
    q = B.build(512, defines=("AMK_QUANT=1",))
    assert q.cubin.is_file() and q.spill_stores == 0, q.ptxas_log
    plain = B.build(512, defines=B.preload_defines(8) + ("AMK_ATT_STAGE=1",))
    assert plain.spill_stores == 0, plain.ptxas_log
    assert q.key != B.build(512).key
