from mosaic.testing import LanguagePluginTests


class TestPallasPlugin(LanguagePluginTests):
    plugin = "pallas"
    languages = {"pallas"}
