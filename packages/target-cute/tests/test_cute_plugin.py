from mosaic.testing import LanguagePluginTests


class TestCutePlugin(LanguagePluginTests):
    plugin = "cute"
    languages = {"cute"}
