from mosaic.testing import CommandPluginTests


class TestAmkPlugin(CommandPluginTests):
    plugin = "amk"
    commands = {"amk"}
