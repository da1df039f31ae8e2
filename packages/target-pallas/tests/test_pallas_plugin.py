from mosaic.catalog import CONCEPTS
from mosaic.testing import LanguagePluginTests


class TestPallasPlugin(LanguagePluginTests):
    plugin = "pallas"
    languages = {"pallas"}
    promises = {"constructs": {f"{c.name}@pallas" for c in CONCEPTS}}


def test_capabilities_state_what_cannot_run():
    from mosaic_target_pallas.plugin import LANGUAGE

    assert LANGUAGE.families == ("gemm", "attention", "rmsnorm", "softmax")
    # the project's own attention lowers on the CPU and runs in the interpreter (test_attention_project.py)
    assert {"attention:cpu-lowering", "attention:interpreter", "attention:race-detection"} <= LANGUAGE.capabilities
    assert not {c for c in LANGUAGE.capabilities if c.startswith("attention:no-")}
    assert {"gemm:interpreter", "gemm:race-detection", "gemm:cpu-lowering"} <= LANGUAGE.capabilities
    for family in ("rmsnorm", "softmax"):
        assert {f"{family}:interpreter", f"{family}:race-detection", f"{family}:cpu-lowering"} <= LANGUAGE.capabilities
