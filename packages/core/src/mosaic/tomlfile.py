"""Reading a user's TOML file (a campaign, a schedule config): one clear error line for bad input."""

from __future__ import annotations

import tomllib
from pathlib import Path

from mosaic.errors import BadInput


def read_toml(path: str | Path) -> dict:
    """The parsed TOML document at ``path``; BadInput (exit 2) when it is missing, not text or not TOML."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise BadInput("no such file", str(p)) from None
    except IsADirectoryError:
        raise BadInput("is a directory, not a TOML file", str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"not valid TOML: {exc}", str(p)) from None
    except UnicodeDecodeError:
        raise BadInput("not valid TOML: not UTF-8 text", str(p)) from None
