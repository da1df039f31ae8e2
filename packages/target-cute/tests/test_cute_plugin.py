from mosaic.catalog import CONCEPTS
from mosaic.testing import LanguagePluginTests


class TestCutePlugin(LanguagePluginTests):
    plugin = "cute"
    languages = {"cute"}
    promises = {"constructs": {f"{c.name}@cute" for c in CONCEPTS}}
