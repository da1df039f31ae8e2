"""Entry point `cute`: registers the cute kernel language.

The language's families and capabilities are listed only as they are implemented, so
`mosaic plugins` never advertises a build or capture path that does not exist yet.
"""

from mosaic.plugins import hookimpl
from mosaic.records import Language

LANGUAGE = Language(
    name="cute",
    summary="CuTe DSL (Python, cutlass.cute; compiled ahead of time)",
    families=(),
    capabilities=frozenset(),
)


@hookimpl
def register_languages(register):
    register(LANGUAGE)
