"""Entry point `amk`: adds the `mosaic amk` command group."""

from mosaic.plugins import hookimpl


@hookimpl
def register_commands(cli):
    from mosaic_amk.cli import amk  # imported only when the CLI is assembled

    cli.add_command(amk)
