"""``mosaic gpus``: the registered GPU records and the device(s) detected here."""

from __future__ import annotations

import click

from mosaic.commands.output import echo_json, table


@click.command("gpus")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def gpus(as_json: bool) -> None:
    """List registered GPU targets and detect the device(s) present."""
    from mosaic.gpus import detect
    from mosaic.plugins import host

    targets = host().items("gpus")
    detection = detect(targets.values())
    if as_json:
        echo_json({"targets": [t.to_json() for t in targets.values()],
                    "devices": [d.to_json() for d in detection.devices], "reason": detection.reason})
        return
    if targets:
        rows = [[t.name, t.display_name, t.arch, str(t.sm_count), f"{t.smem_per_block // 1024} KiB",
                 f"{t.l2_bytes / 2**20:.0f} MiB", f"{t.hbm_bandwidth_gbs:.0f} GB/s",
                 f"{t.peak_bf16_tflops:.0f}", str(t.max_cluster_size)] for t in targets.values()]
        click.echo(table(rows, ["name", "model", "arch", "SMs", "smem/block", "L2", "DRAM BW",
                                 "bf16 TFLOP/s", "cluster"]))
    else:
        click.echo("No GPU records are registered: pip install mosaic-gpu-hopper or mosaic-gpu-blackwell.")
    click.echo("")
    if not detection.devices:
        click.echo(f"Detected: none ({detection.reason})")
    for d in detection.devices:
        what = f"matches '{d.target.name}'" if d.target else "matches no registered record"
        click.echo(f"Detected: device {d.index}: {d.name}, sm_{d.compute_capability[0]}{d.compute_capability[1]}, "
                   f"{d.sm_count} SMs — {what}")
