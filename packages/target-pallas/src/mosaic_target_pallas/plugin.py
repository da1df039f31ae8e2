"""Entry point `pallas`: registers the pallas kernel language.

The language's families and capabilities are listed only as they are implemented, so
`mosaic plugins` never advertises a build or capture path that does not exist yet.
"""

from mosaic.plugins import hookimpl
from mosaic.records import Language

LANGUAGE = Language(
    name="pallas",
    summary="Pallas Mosaic GPU (jax.experimental.pallas, plgpu)",
    families=(),
    capabilities=frozenset(),
)


@hookimpl
def register_languages(register):
    register(LANGUAGE)
