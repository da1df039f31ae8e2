"""The `mosaic amk` command group."""

import click


@click.group("amk")
def amk() -> None:
    """AutoMegaKernel: lower a Llama-family checkpoint to a validated megakernel schedule."""


# ---- lower / generate (importer, lowering, ReferenceVM) -------------------------------------------------
def _gpu_and_config(gpu_name: str, config_path: str | None):
    from mosaic.plugins import host

    from mosaic_amk.config import load_config

    gpu = host().get("gpus", gpu_name)
    return gpu, load_config(config_path).for_gpu(gpu)


@amk.command("lower")
@click.option("--model", "model_dir", required=True, type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("--config", "config_path", type=click.Path(path_type=str), help="ScheduleConfig TOML.")
@click.option("--gpu", "gpu_name", default="h200", show_default=True, help="GPU record name (mosaic gpus).")
@click.option("--position", default=0, show_default=True, type=click.IntRange(min=0), help="Decode position.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="Schedule JSON to write.")
def lower_cmd(model_dir: str, config_path: str | None, gpu_name: str, position: int, output: str) -> None:
    """Lower one decode step to a schedule; validate it; write it only if it is safe (else exit 1)."""
    from mosaic.errors import CheckFailed

    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.lowering import lower
    from mosaic_amk.validate import validate

    gpu, config = _gpu_and_config(gpu_name, config_path)
    schedule = lower(import_checkpoint(model_dir), config, gpu, position)
    result = validate(schedule)
    if result.diagnostics:
        raise CheckFailed(f"lowering produced an unsafe schedule; {output} not written", list(result.diagnostics))
    schedule.save(output)
    click.echo(f"wrote {output}: {len(schedule.tasks)} tasks, {len(schedule.buffers)} buffers, "
               f"{schedule.num_counters} counters on {schedule.num_sms} SMs (validated: safe)")


@amk.command("generate")
@click.option("--model", "model_dir", required=True, type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("--prompt", required=True, help="Prompt token ids, comma-separated, e.g. 1,2,3.")
@click.option("--tokens", "n_tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--vm", type=click.Choice(["reference", "cuda"]), default="reference", show_default=True)
@click.option("--check-hf", is_flag=True, help="Compare with transformers' eager greedy generate (float32, CPU).")
@click.option("--config", "config_path", type=click.Path(path_type=str), help="ScheduleConfig TOML.")
@click.option("--gpu", "gpu_name", default="h200", show_default=True, help="GPU record name (mosaic gpus).")
@click.option("--interleave", type=click.Choice(["list", "random", "priority", "pct"]), default="list",
              show_default=True, help="Task order: list order, or seeded legal interleavings of the SM queues.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of --interleave.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--unsafe", is_flag=True, help="--vm cuda: launch even a schedule the validator rejects (tests only).")
def generate_cmd(model_dir: str, prompt: str, n_tokens: int, vm: str, check_hf: bool, config_path: str | None,
                 gpu_name: str, interleave: str, seed: int, as_json: bool, unsafe: bool = False) -> None:
    """Greedy-decode token ids with the ReferenceVM (prefill token by token through the decode schedule)."""
    import json

    from mosaic.errors import BadInput, CheckFailed, Diagnostic

    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.reference_vm import ReferenceVM

    if vm == "cuda":  # the CUDA megakernel VM (mosaic_amk/cuda/commands.py); --check-hf: HF eager bf16 on the GPU
        from mosaic_amk.cuda.commands import generate_cuda

        return generate_cuda(model_dir, prompt, n_tokens, check_hf, config_path, gpu_name, as_json, unsafe)
    try:
        ids = [int(t) for t in prompt.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise BadInput(f"--prompt must be comma-separated token ids, got {prompt!r}") from None
    gpu, config = _gpu_and_config(gpu_name, config_path)
    spec = import_checkpoint(model_dir)
    bad = [t for t in ids if not 0 <= t < spec.vocab_size]
    if not ids or bad:
        raise BadInput(f"--prompt needs token ids in 0 .. {spec.vocab_size - 1}, got {prompt!r}")
    executor = None
    if interleave != "list":
        from mosaic_amk.validate.oracle import interleaving

        executor = interleaving(seed, interleave)
    tokens, logits = ReferenceVM(spec, config, gpu).generate(ids, n_tokens, executor=executor)
    result = None
    if check_hf:
        from mosaic_amk.parity import compare, hf_greedy

        result = compare(tokens, logits, *hf_greedy(model_dir, ids, n_tokens))
    if as_json:
        click.echo(json.dumps({"tokens": tokens, **({"check_hf": result.to_json()} if result else {})}))
    else:
        click.echo(",".join(map(str, tokens)))
        if result:
            verdict = "match" if result.ok else f"MISMATCH at generated token {result.first_mismatch}"
            click.echo(f"hf eager: {','.join(map(str, result.hf_tokens))}")
            click.echo(f"check-hf: {verdict}; max logit error {result.max_logit_error:.3g}")
    if result and not result.ok:
        raise CheckFailed("reference VM disagrees with HF eager greedy decoding", [Diagnostic(
            "token-mismatch", f"generated token {result.first_mismatch}", result.hf_tokens[result.first_mismatch]
            if result.first_mismatch < len(result.hf_tokens) else None,
            result.vm_tokens[result.first_mismatch] if result.first_mismatch < len(result.vm_tokens) else None,
            f"max logit error {result.max_logit_error:.3g}")])


# ---- validate / audit (schedule IR, static validator, dynamic oracle) -----------------------------------
@amk.command("validate")
@click.argument("schedule_path", metavar="S.json", type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def validate_cmd(schedule_path: str, as_json: bool) -> None:
    """Statically check a schedule: exit 0 safe, 1 unsafe (every diagnostic, with code and task ids),
    2 not a schedule (not JSON, wrong format tag or version)."""
    import json

    from mosaic_amk.schedule import read_schedule_json
    from mosaic_amk.validate import validate

    result = validate(read_schedule_json(schedule_path))
    if as_json:
        click.echo(json.dumps({"schedule": schedule_path, **result.to_json()}, indent=2, default=str))
    elif result.ok:
        click.echo(f"{schedule_path}: safe ({result.num_tasks} tasks)")
    else:
        for line in result.lines():
            click.echo(line)
        click.echo(f"{schedule_path}: UNSAFE, {len(result.diagnostics)} problem(s) "
                   f"({', '.join(sorted(result.codes()))})")
    if not result.ok:
        raise click.exceptions.Exit(1)


@amk.command("audit")
@click.option("--n", "n", default=2000, show_default=True, type=click.IntRange(min=1),
              help="Adversarial schedules (mutants of real lowerings per class, a quarter random DAGs).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--workers", default=0, show_default=True, type=click.IntRange(min=0), help="Processes (0: all cores).")
@click.option("--runs", default=8, show_default=True, type=click.IntRange(min=1), help="Oracle interleavings each.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def audit_cmd(n: int, seed: int, workers: int, runs: int, as_json: bool) -> None:
    """Audit the validator against the dynamic oracle; exit 1 on any false accept or rejected real lowering."""
    import json

    from mosaic_amk.validate.audit import run_audit, table

    report = run_audit(n, seed=seed, workers=workers or None, runs=runs)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else table(report))
    if report.false_accepts or report.real.rejected:
        raise click.exceptions.Exit(1)


# ---- bench (the CUDA VM: mosaic_amk/cuda/commands.py) --------------------------------------------------
from mosaic_amk.cuda.commands import bench_cmd  # noqa: E402

amk.add_command(bench_cmd)
