"""The ``mosaic`` verbs, one module each; :mod:`mosaic.cli` registers :data:`VERBS` on the root group.

Each module imports only click (and :mod:`mosaic.commands.output`) at the top; what a verb needs is
imported inside its function, so ``mosaic --help`` stays light.
"""

from __future__ import annotations

from mosaic.commands.bundle import bundle
from mosaic.commands.cache import cache
from mosaic.commands.capture import capture
from mosaic.commands.catalog import catalog_cmd
from mosaic.commands.check import check
from mosaic.commands.diff import diff
from mosaic.commands.doctor import doctor
from mosaic.commands.families import families
from mosaic.commands.fuzz import fuzz
from mosaic.commands.gpus import gpus
from mosaic.commands.lift import lift
from mosaic.commands.mcp import mcp
from mosaic.commands.plugins import plugins
from mosaic.commands.run import run
from mosaic.commands.trust import trust

VERBS = (plugins, gpus, families, bundle, catalog_cmd, lift, diff, check, capture, run, doctor, mcp, cache, trust, fuzz)
