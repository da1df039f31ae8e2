"""The ``--gpu`` option of the ``mosaic amk`` commands: core's :func:`mosaic.gpus.resolve_gpu` (the detected device's
record by default, h200 without a GPU), the record it names and the schedule config for it.

A command that runs on the device (the CUDA VM: ``generate --vm cuda``, ``bench``, ``parity --criterion bf16`` or
``--vm cuda``, ``tune --vm cuda``) refuses a named record that is not the device's; one that only lowers or runs the
ReferenceVM on the CPU lowers for any named record. The record and why it is that one are said on stderr before the
command's first output (``gpu: h100-sxm (detected: NVIDIA H100 80GB HBM3)``), or carried by its JSON."""

from __future__ import annotations

import click


def gpu_config(gpu_name: str | None, config_path: str | None, *, on_device: bool, default=None):
    """(GpuTarget, ScheduleConfig for it, GpuChoice) for ``--gpu`` and ``--config``; ``default``: the config when
    ``--config`` is not given (the ScheduleConfig defaults when None)."""
    from mosaic.gpus import resolve_gpu
    from mosaic.plugins import host

    from mosaic_amk.config import load_config

    choice = resolve_gpu(gpu_name, on_device=on_device)
    gpu = host().get("gpus", choice.name)
    return gpu, load_config(config_path, default).for_gpu(gpu), choice


def announce(choice, as_json: bool = False) -> None:
    """The ``gpu: ...`` line on stderr (a JSON output carries :func:`json_fields` instead)."""
    if not as_json:
        click.echo(f"gpu: {choice.line()}", err=True)


def json_fields(choice) -> dict:
    return {"gpu": choice.name, "gpu_provenance": choice.provenance}


#: the option itself, the same on every command that takes it
option = click.option("--gpu", "gpu_name", default=None,
                      help="GPU record (mosaic gpus); default: the detected device's record, h200 without a GPU.")
