"""The `mosaic amk` command group."""

import click


@click.group("amk")
def amk() -> None:
    """AutoMegaKernel: lower a Llama-family checkpoint to a validated megakernel schedule."""
