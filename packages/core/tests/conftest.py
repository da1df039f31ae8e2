import pytest
from mosaic import plugins


@pytest.fixture(autouse=True)
def _fresh_plugin_host():
    """Each test sees a freshly loaded plugin host (MOSAIC_LOAD_PLUGINS may differ per test)."""
    plugins.reset()
    yield
    plugins.reset()
