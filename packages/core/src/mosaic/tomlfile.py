"""Reading a user's TOML file (a campaign, a schedule config): one clear error line for bad input."""

from __future__ import annotations

import tomllib
from pathlib import Path

from mosaic import limits
from mosaic.errors import BadInput


def read_toml(path: str | Path) -> dict:
    """The parsed TOML document at ``path``; BadInput (exit 2) when it is missing, not text, not TOML, or over
    the limits of :mod:`mosaic.limits` (size, nesting depth, integer length)."""
    p = Path(path)
    where = str(p)
    data = limits.read_bytes(p, "toml_bytes", where)
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadInput("not valid TOML: not UTF-8 text", where) from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"not valid TOML: {exc}", where) from None
    except RecursionError:
        raise BadInput(f"nested too deep to parse (the limit is {limits.limit('nesting_depth')} levels)",
                       where) from None
    except ValueError:  # an integer past Python's own digit limit
        raise BadInput(f"an integer has more digits than the limit of {limits.limit('int_digits')}", where) from None
    limits.check_tree(doc, where)
    return doc
