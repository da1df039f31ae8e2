"""The ``mosaic`` command line: the root group, its error handling, and the verbs registered on it.

Each verb is a module of :mod:`mosaic.commands` (heavy imports stay inside the command functions, so
start-up stays light); plugins add commands through ``register_commands``. Errors a user can cause print
one line, ``error: <what> (<where>)``, and exit 2 (a failed verify exits 1); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import os
import sys

import click

from mosaic import __version__
from mosaic.commands import VERBS
from mosaic.errors import MosaicError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="mosaic", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def cli(debug: bool) -> None:
    """Mosaicist: port GPU kernels between kernel languages by convergence, and build validated
    megakernels. Run `mosaic plugins` to see what is installed."""


for _verb in VERBS:
    cli.add_command(_verb)


def _add_plugin_commands() -> None:
    from mosaic.plugins import host

    host().add_commands(cli)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one-line errors with exit 2, tracebacks only with --debug (or MOSAIC_DEBUG=1)."""
    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args or os.environ.get("MOSAIC_DEBUG") == "1"
    try:
        _add_plugin_commands()
        rv = cli.main(args=args, prog_name="mosaic", standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) else 0)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:  # bad arguments: one line, exit 2
        if debug:
            raise
        where = f" (try 'mosaic {exc.ctx.command_path.partition(' ')[2]} --help')".replace("  ", " ") \
            if getattr(exc, "ctx", None) is not None else ""
        click.echo(f"error: {exc.format_message()}{where}", err=True)
        sys.exit(2)
    except MosaicError as exc:
        if debug:
            raise
        click.echo(f"error: {exc.line()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # an unreadable or missing file named by the user
        if debug:
            raise
        click.echo(f"error: {exc.strerror or exc} ({exc.filename or 'file system'})", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
