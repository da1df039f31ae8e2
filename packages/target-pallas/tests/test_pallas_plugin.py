from mosaic.catalog import CONCEPTS
from mosaic.testing import LanguagePluginTests


class TestPallasPlugin(LanguagePluginTests):
    plugin = "pallas"
    languages = {"pallas"}
    promises = {"constructs": {f"{c.name}@pallas" for c in CONCEPTS}}


def test_capabilities_state_what_cannot_run():
    from mosaic_target_pallas.plugin import LANGUAGE

    assert LANGUAGE.families == ("gemm", "attention", "rmsnorm", "softmax")
    assert "attention:no-interpreter" in LANGUAGE.capabilities
    assert "attention:interpreter" not in LANGUAGE.capabilities
    assert {"gemm:interpreter", "gemm:race-detection", "gemm:cpu-lowering"} <= LANGUAGE.capabilities
    for family in ("rmsnorm", "softmax"):
        assert {f"{family}:interpreter", f"{family}:race-detection", f"{family}:cpu-lowering"} <= LANGUAGE.capabilities
