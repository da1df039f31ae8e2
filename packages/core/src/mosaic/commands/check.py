"""``mosaic check``: compare a kernel's outputs with the float64 oracle (a public contract).

Exit 0: pass. Exit 1: fail, with the reason. Exit 2: bad input (a file that is not a pickle-free .npz,
missing arrays, values not representable in --dtype, shape mismatch between inputs).
"""

from __future__ import annotations

import json

import click


def _load_npz(path: str, what: str) -> dict:
    from mosaic.limits import load_npz

    return load_npz(path, what)  # each array's header checked (dtype, element count) before any data is read


@click.command("check")
@click.option("--family", required=True, help="Kernel family: gemm, rmsnorm, softmax, attention.")
@click.option("--inputs", "inputs_path", required=True, type=click.Path(dir_okay=False),
              help="IN.npz with the kernel's inputs (gemm: a M×K, b K×N; optional scale, bias).")
@click.option("--output", "output_path", required=True, type=click.Path(dir_okay=False),
              help="OUT.npz with the kernel's outputs (gemm: c M×N).")
@click.option("--dtype", required=True, help="The kernel's input/output format: bf16, f16, f32.")
@click.option("--out-dtype", default=None, help="Output format if it differs from --dtype.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable verdict.")
def check(family: str, inputs_path: str, output_path: str, dtype: str, out_dtype: str | None, as_json: bool) -> None:
    """Check a kernel's outputs against the float64 oracle: exit 0 pass, 1 fail, 2 bad input."""
    from mosaic.oracle import check as oracle_check

    inputs = _load_npz(inputs_path, "--inputs")
    outputs = _load_npz(output_path, "--output")
    verdict = oracle_check(family, inputs, outputs, dtype, out_dtype)
    if as_json:
        click.echo(json.dumps(verdict.to_json(), indent=2))
    else:
        for o in verdict.outputs:
            click.echo(f"{'PASS' if o.passed else 'FAIL'} {family} {verdict.dtype} {o.name} ({o.elements} elements): "
                       f"{o.summary()}")
            if not o.passed:
                click.echo(f"  reason: {o.reason}")
    if not verdict.passed:
        if not as_json:
            click.echo(f"FAIL: {verdict.reason}", err=True)
        raise click.exceptions.Exit(1)
