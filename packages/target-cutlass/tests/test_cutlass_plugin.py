from mosaic.testing import LanguagePluginTests


class TestCutlassPlugin(LanguagePluginTests):
    plugin = "cutlass"
    languages = {"cutlass"}
