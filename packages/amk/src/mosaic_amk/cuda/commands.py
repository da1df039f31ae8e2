"""The CUDA VM's commands: ``mosaic amk generate --vm cuda`` (called from cli.generate_cmd) and
``mosaic amk bench``. Only click is imported at module level: the CLI assembles without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mosaic_amk import gpu_option


def _ids(prompt: str) -> list[int]:
    from mosaic.errors import BadInput

    try:
        ids = [int(t) for t in prompt.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise BadInput(f"--prompt must be comma-separated token ids, got {prompt!r}") from None
    if not ids:
        raise BadInput("--prompt needs at least one token id")
    return ids


def _gpu_config(gpu_name: str | None, config_path: str | None):
    """The record and config of a command that runs the CUDA VM: a named record must be the device's."""
    from mosaic_amk.config import CUDA_DEFAULT

    return gpu_option.gpu_config(gpu_name, config_path, on_device=True, default=CUDA_DEFAULT)


def quantized_weights(model: str) -> bool:
    """Whether ``model`` holds quantized weights the VM reads natively: a .gguf file, or a checkpoint directory whose
    config.json has a quantization_config (the importer accepts only int8 weight-only, and refuses the rest)."""
    import json

    path = Path(model)
    if path.suffix == ".gguf" and path.is_file():
        return True
    try:
        return bool(json.loads((path / "config.json").read_text()).get("quantization_config"))
    except (OSError, ValueError, AttributeError):
        return False


def generate_cuda(model_dir: str, prompt: str, n_tokens: int, check_hf: bool, config_path: str | None,
                  gpu_name: str, as_json: bool, unsafe: bool, tokenizer=None) -> None:
    """Greedy decode with the CUDA VM; --check-hf compares with transformers' eager bf16 generate on the GPU.
    ``tokenizer`` (the prompt was text): the generated ids are decoded and printed too."""
    from mosaic.errors import BadInput, CheckFailed, Diagnostic

    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.cuda.cuda_vm import CudaVM, weights_from_torch
    from mosaic_amk.cuda.launcher import _cupy
    from mosaic_amk.parity import compare
    from mosaic_amk.text import decode

    ids = _ids(prompt)
    gpu, config, choice = _gpu_config(gpu_name, config_path)
    native = quantized_weights(model_dir)  # a .gguf file's blocks or an int8 weight-only directory
    if native and check_hf:
        raise BadInput("--check-hf runs HF on an unquantized checkpoint directory: for quantized weights use "
                       "`mosaic amk parity --model DEQUANTISED_DIR --weights W` or benchmarks/amk_quant_speed.py",
                       model_dir)
    if not native and not Path(model_dir).is_dir():
        raise BadInput("not a checkpoint directory", model_dir)
    _cupy()  # one clear line when there is no GPU, before loading anything
    if native:
        from mosaic_amk.importer import import_checkpoint

        model, spec = None, import_checkpoint(model_dir)
        weights = None  # the spec's own arrays: its QuantizedTensors are uploaded as their device planes
    else:
        model = hf_gpu.load_bf16(model_dir)
        spec = hf_gpu.spec_of(model)
        weights = weights_from_torch(model, spec)
    bad = [t for t in ids if not 0 <= t < spec.vocab_size]
    if bad:
        raise BadInput(f"--prompt needs token ids in 0 .. {spec.vocab_size - 1}, got {prompt!r}")
    vm = CudaVM(spec, config, gpu, weights=weights, unsafe=unsafe, max_positions=len(ids) + n_tokens)
    if vm.note:
        click.echo(f"note: {vm.note}", err=True)
    tokens, logits = vm.generate(ids, n_tokens)
    gpu_option.announce(choice, as_json)
    result = at = None
    if check_hf:
        hf_tokens, hf_logits = hf_gpu.greedy(model, [ids], n_tokens)
        result = compare(tokens, logits, hf_tokens[0], list(hf_logits[0]))
        at = mismatch_margin(result, list(hf_logits[0]))
    if as_json:
        check = {"check_hf": {**result.to_json(), "at_mismatch": at.to_json() if at else None}} if result else {}
        text = {"prompt_ids": ids, "text": decode(tokenizer, tokens)} if tokenizer is not None else {}
        click.echo(json.dumps({"tokens": tokens, **text, "vm": "cuda", "rope_order": vm.config.rope_order,
                               **check, **gpu_option.json_fields(choice)}))
    else:
        click.echo(",".join(map(str, tokens)))
        if tokenizer is not None:
            click.echo(f"text: {decode(tokenizer, tokens)!r}")
        if result:
            click.echo(f"hf eager bf16 (GPU): {','.join(map(str, result.hf_tokens))}")
            click.echo(check_hf_line(result, at))
    if result and not result.ok:
        k = result.first_mismatch
        raise CheckFailed("CUDA VM disagrees with HF eager bf16 greedy decoding", [Diagnostic(
            "token-mismatch", f"generated token {k}", result.hf_tokens[k] if k < len(result.hf_tokens) else None,
            result.vm_tokens[k] if k < len(result.vm_tokens) else None,
            f"max logit error {result.max_logit_error:.3g}" + (f"; {margin_text(at)}" if at else ""))])


def mismatch_margin(result, hf_logits):
    """The reference's margins at the first mismatch (parity.Disagreement), None when the tokens agree."""
    from mosaic_amk.parity import disagreement

    k = result.first_mismatch
    if k is None or k >= len(result.hf_tokens) or k >= len(result.vm_tokens) or k >= len(hf_logits):
        return None
    return disagreement(k, hf_logits[k], result.hf_tokens[k], result.vm_tokens[k])


def margin_text(at) -> str:
    from mosaic_amk.parity import DEFAULT_NEAR_TIE_ULPS

    if at.gap_ulps is None:
        return f"the VM's token {at.other_token} is outside the vocabulary"
    kind = "a near-tie" if at.near_tie else "DECISIVE"
    return (f"HF's logit of its token {at.ref_token} exceeds its logit of the VM's token {at.other_token} by "
            f"{at.gap_ulps} bf16 ulps ({at.gap:.4g}; HF's top-2 margin {at.margin_ulps} ulps): {kind} "
            f"(near-tie: <= {DEFAULT_NEAR_TIE_ULPS} ulps, docs/amk.md \"Parity: what differs and why\")")


def check_hf_line(result, at) -> str:
    if result.ok:
        return f"check-hf: match; max logit error {result.max_logit_error:.3g}"
    text = f"check-hf: MISMATCH at generated token {result.first_mismatch}; max logit error {result.max_logit_error:.3g}"
    return text + (f"; {margin_text(at)}" if at else "")


@click.command("bench")
@click.option("--model", "model_dir", type=click.Path(path_type=str), help="HF checkpoint dir.")
@click.option("--shape", type=click.Choice(["smollm2-135m", "smollm2-360m", "tinyllama-1.1b", "llama-3.2-1b"]),
              help="Instead of --model: a seeded random-init model of this shape, built on the GPU.")
@click.option("--config", "config_path", type=click.Path(path_type=str),
              help="ScheduleConfig TOML (default: bench.default_candidates, config.CUDA_DEFAULT among them).")
@gpu_option.option
@click.option("--rounds", default=5, show_default=True, type=click.IntRange(min=1), help="Interleaved rounds.")
@click.option("--steps", default=64, show_default=True, type=click.IntRange(min=1), help="Decode steps per sample.")
@click.option("--no-graph", is_flag=True, help="Skip the HF static cache + CUDA graph contender.")
@click.option("--time-best", type=click.IntRange(min=1), default=None,
              help="Time only the fastest N passing candidates (one selection sample each after the gate).")
@click.option("-o", "--output", type=click.Path(path_type=str), help="Also write the result JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the table.")
def bench_cmd(model_dir: str | None, shape: str | None, config_path: str | None, gpu_name: str, rounds: int,
              steps: int, no_graph: bool, time_best: int | None, output: str | None, as_json: bool) -> None:
    """AMK ms/token vs HF eager, HF static cache + CUDA graph and the weight-bandwidth floor (interleaved)."""
    from mosaic.errors import BadInput

    from mosaic_amk.bench import hf_gpu
    from mosaic_amk.bench.bench import format_table, run_bench
    from mosaic_amk.config import load_config
    from mosaic_amk.cuda.launcher import _cupy

    if bool(model_dir) == bool(shape):
        raise BadInput("give exactly one of --model DIR or --shape NAME")
    if model_dir and not Path(model_dir).is_dir():
        raise BadInput("not a checkpoint directory", model_dir)
    gpu, _, choice = _gpu_config(gpu_name, config_path)
    candidates = [("config", load_config(config_path).for_gpu(gpu))] if config_path else None
    _cupy()
    gpu_option.announce(choice)  # before the progress lines, JSON or not (they go to stderr either way)
    model = hf_gpu.load_bf16(model_dir) if model_dir else hf_gpu.random_model(shape)
    spec = hf_gpu.spec_of(model)
    result = run_bench(model, spec, gpu, candidates, rounds=rounds, steps=steps, graph=not no_graph,
                       log=lambda m: click.echo(m, err=True), time_best=time_best)
    result["source"] = model_dir or f"random-init {shape}"
    result["gpu_provenance"] = choice.provenance
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(json.dumps(result, indent=1) + "\n")
    click.echo(json.dumps(result, indent=1) if as_json else format_table(result))
