"""The parity analysis (mosaic_amk.parity): bf16 ulp arithmetic against torch's own bf16 rounding,
near-tie / decisive classification on synthetic logits, free-running and teacher-forced bookkeeping (the
ReferenceVM, and transformers' eager decode and the static-cache step on the CPU in float32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mosaic_amk import parity as P
from mosaic_amk.importer import import_checkpoint
from mosaic_amk.reference_vm import ReferenceVM


def _all_bf16() -> np.ndarray:
    """Every non-NaN bf16 value, as float32 (through torch's bf16 -> float32 conversion)."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    vals = bits.view(torch.bfloat16).float().numpy()
    return vals[~np.isnan(vals)]


def test_bf16_keys_count_every_representable_value_once():
    vals = np.unique(_all_bf16())  # sorted; +0 and -0 collapse to one value
    keys = P.bf16_key(vals)
    assert np.all(np.diff(keys) == 1)  # consecutive bf16 values: consecutive keys, across every binade
    assert P.bf16_key(np.float32(-0.0)) == P.bf16_key(np.float32(0.0)) == 0
    assert P.ulps_between(np.float32(np.inf), np.float32(-np.inf)) == 2 * 0x7F80
    with pytest.raises(ValueError):
        P.bf16_key(np.array([1.0, np.nan], np.float32))


def test_rounding_equals_torch_bf16_and_ulps_match_nextafter():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(20000).astype(np.float32) * 4,
                        rng.standard_normal(2000).astype(np.float32) * 1e-38,  # subnormals of float32
                        np.float32([2.0 - 2**-9, 2.0 + 2**-8, 2.0 + 3 * 2**-8, -(2.0 - 2**-9)])])  # exact halves
    want = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(P.to_bf16(x), want)
    b = torch.from_numpy(want).to(torch.bfloat16)
    up = torch.nextafter(b, torch.full_like(b, float("inf"))).float().numpy()
    assert np.all(P.ulps_between(up, want) == 1)
    # the spacing doubles at a binade: 2.0 - 1 ulp below is 2^-7 away, 2.0 + 1 ulp above is 2^-6 away
    assert P.ulps_between(np.float32(2.0), np.float32(2.0 - 2**-7)) == 1
    assert P.ulps_between(np.float32(2.0 + 2**-6), np.float32(2.0)) == 1
    assert P.ulps_between(np.float32(3.0), np.float32(2.0)) == 64


def _logits(vocab: int = 64, seed: int = 1) -> np.ndarray:
    """bf16 logits in [1, 1.75] with a clear winner at index 5 (2.5) and runner-up at 9."""
    rng = np.random.default_rng(seed)
    x = P.to_bf16(1.0 + 0.75 * rng.random(vocab).astype(np.float32))
    x[5], x[9] = 2.5, 2.5 - 2 * 2**-6  # 2 ulps apart (ulp at [2, 4): 2^-6)
    return x


def test_classification_near_tie_and_decisive():
    ref = _logits()
    d = P.disagreement(3, ref, 5, 9, k=4)
    assert (d.margin_ulps, d.gap_ulps, d.near_tie) == (2, 2, True)
    assert d.gap == pytest.approx(2 * 2**-6)
    assert not P.disagreement(3, ref, 5, 9, k=1).near_tie  # the same gap against a tighter threshold
    # the other decoder picked the third-best token: the gap to its choice decides, not the top-2 margin
    ref[17] = 2.25
    d = P.disagreement(0, ref, 5, 17, k=4)
    assert (d.margin_ulps, d.gap_ulps, d.near_tie) == (2, 16, False)
    # an exact tie: margin 0; the reference (first index) picks 5, a decoder that picks 9 is at a tie
    ref[9] = 2.5
    assert P.top2(ref) == (5, 9)
    d = P.disagreement(0, ref, 5, 9)
    assert (d.margin_ulps, d.gap_ulps, d.near_tie) == (0, 0, True)
    # a token outside the vocabulary is never a near-tie
    d = P.disagreement(0, ref, 5, 10**6)
    assert d.gap_ulps is None and not d.near_tie


def test_free_run_first_mismatch_and_its_margins():
    ref = [_logits(seed=s) for s in range(6)]
    ref_tokens = [5] * 6
    other = [r.copy() for r in ref]
    other[3][9] = 2.5 + 2**-6  # the runner-up overtakes at position 3 (the reference's margin: 2 ulps)
    other_tokens = [int(np.argmax(o)) for o in other]
    other_tokens[4] = 7  # after a mismatch the histories differ: nothing after it is compared
    f = P.free_run(ref_tokens, ref, other_tokens, other)
    assert f.first_mismatch == 3 and not f.ok
    assert (f.at_mismatch.ref_token, f.at_mismatch.other_token, f.at_mismatch.gap_ulps) == (5, 9, 2)
    assert f.at_mismatch.near_tie
    assert f.max_logit_error == pytest.approx(3 * 2**-6)  # up to and including position 3 only
    same = P.free_run(ref_tokens, ref, ref_tokens, ref)
    assert same.ok and same.at_mismatch is None and same.max_logit_error == 0.0
    with pytest.raises(ValueError):
        P.free_run(ref_tokens, ref, ref_tokens[:-1])


def test_forced_counts_disagreements_errors_and_pair_errors():
    n = 8
    ref = [_logits(seed=s) for s in range(n)]
    ref_tokens = [5] * n
    other = [r.copy() for r in ref]
    other[1][9] = 2.5  # exact tie in the other's logits: first index (5) still wins, no disagreement
    other[2][9] = 2.5 + 2**-6  # 3 ulps of pair error: a near-tie disagreement
    other[4][9] = 2.5 + 2**-5  # gap 2 ulps, pair error 4: near-tie at k=4
    other[6][5] = 1.5  # winner collapsed: the other's pick (9) is 2 ulps below, but its own logit moved 64+ ulps
    other[7][40] = 3.0  # the other picks 40, far below the winner in the reference: decisive
    argmax = [int(np.argmax(o)) for o in other]
    argmax[0] = 11  # an argmax that is not the argmax of the other's own logits (a broken argmax kernel)
    f = P.forced(ref_tokens, ref, argmax, other, k=4)
    pos = [d.position for d in f.disagreements]
    assert pos == [0, 2, 4, 6, 7]
    by = {d.position: d for d in f.disagreements}
    assert by[2].near_tie and by[4].near_tie and by[6].near_tie  # by the reference's gap to the other's pick
    assert not by[7].near_tie and not by[0].near_tie  # index 11 and 40 are far below 2.5
    assert (f.near_ties, f.decisive) == (3, 2)
    assert f.argmax_inconsistent == 1
    assert f.pair_error_ulps[0] == 0 and f.pair_error_ulps[1] == 2 and f.pair_error_ulps[2] == 3
    assert f.pair_error_ulps[4] == 4
    assert f.top2_max_ulps == 96  # position 6: 2.5 -> 1.5 is 32 ulps down to 2.0 and 64 more to 1.5
    assert f.max_abs_error == pytest.approx(max(1.0, 3.0 - float(ref[7][40])))  # position 6 or 7
    changed = 5  # elements that differ (positions 1, 2, 4, 6, 7; one element each)
    assert f.bit_equal_fraction == pytest.approx(1 - changed / (n * 64))
    js = f.to_json()
    assert js["near_ties"] == 3 and js["decisive"] == 2 and len(js["disagreements"]) == 5
    with pytest.raises(ValueError):
        P.forced(ref_tokens, ref, argmax[:-1], other)


def test_contender_summary_aggregates_prompts():
    ref = [_logits(seed=s) for s in range(4)]
    other = [r.copy() for r in ref]
    other[2][9] = 2.5 + 2**-6
    argmax = [int(np.argmax(o)) for o in other]
    c = P.ContenderParity("x", free=(P.free_run([5] * 4, ref, argmax, other),),
                          forced=(P.forced([5] * 4, ref, argmax, other), P.forced([5] * 4, ref, [5] * 4, ref)))
    s = c.summary()
    assert s["free"]["exact"] == 0 and s["free"]["gap_ulps_at_first_mismatch"] == [2]
    assert s["free"]["first_mismatch_near_ties"] == 1 and s["free"]["first_mismatch_decisive"] == 0
    assert s["forced"]["positions"] == 8 and s["forced"]["disagreements"] == 1
    assert (s["forced"]["near_ties"], s["forced"]["decisive"]) == (1, 0)
    assert s["forced"]["pair_error_ulps"]["max"] == 3 and s["forced"]["pair_error_within_k"] == 1.0


def test_forced_steps_plan():
    assert P.forced_steps(3, 2) == [(0, None), (1, None), (2, 0), (3, 1)]
    assert P.forced_steps(1, 1) == [(0, 0)]
    with pytest.raises(ValueError):
        P.forced_steps(0, 3)


def test_teacher_forcing_the_reference_vm(tiny_checkpoint):
    """Over its own greedy tokens the forced ReferenceVM reproduces every argmax and logit bit for bit; over
    a sequence that leaves that path, position i sees exactly the forced history up to token i - 1."""
    spec = import_checkpoint(tiny_checkpoint("llama"))
    vm = ReferenceVM(spec)
    prompt, n = [3, 17, 42, 5], 6
    tokens, logits = vm.generate(prompt, n)
    vm.reset()
    argmax, flogits = P.teacher_force(vm.step, prompt, tokens)
    assert argmax == tokens
    f = P.forced(tokens, logits, argmax, flogits)
    assert f.bit_equal_fraction == 1.0 and not f.disagreements and f.top2_max_ulps == 0
    other = list(tokens)
    other[2] = (tokens[2] + 7) % spec.vocab_size
    vm.reset()
    argmax, flogits = P.teacher_force(vm.step, prompt, other)
    for i in (0, 1, 2, 3, 5):  # positions 0..2 share the greedy history; 3 and later see the changed token
        want_tok, want_logits = ReferenceVM(spec).generate(prompt + other[:i], 1)
        assert argmax[i] == want_tok[0]
        np.testing.assert_array_equal(flogits[i], want_logits[0])
    assert not np.array_equal(flogits[3], logits[3])  # the forced token changed what position 3 sees


def _hf_cpu(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_hf_eager_forced_over_its_own_greedy_is_generate(tiny_checkpoint, family):
    from mosaic_amk.bench import hf_gpu

    model = _hf_cpu(tiny_checkpoint(family))
    prompts, n = [[3, 17, 42, 5], [9, 8, 7, 6]], 7
    tokens, logits = hf_gpu.greedy(model, prompts, n)
    argmax, flogits = hf_gpu.eager_forced(model, prompts, tokens)
    assert argmax == tokens
    for b in range(2):
        f = P.forced(tokens[b], list(logits[b]), argmax[b], list(flogits[b]))
        assert not f.disagreements and f.bit_equal_fraction == 1.0 and f.max_abs_error == 0.0  # bit for bit
    # forcing a different token changes the following positions' logits (the forced tokens are read)
    other = [list(tokens[0]), list(tokens[1])]
    other[0][1] = (other[0][1] + 1) % model.config.vocab_size
    _, g = hf_gpu.eager_forced(model, prompts, other)
    assert np.array_equal(g[0][:2], flogits[0][:2]) and not np.allclose(g[0][2], flogits[0][2])
    np.testing.assert_array_equal(g[1], flogits[1])


def test_static_decoder_free_and_forced_match_generate(tiny_checkpoint):
    from mosaic_amk.bench import hf_gpu

    model = _hf_cpu(tiny_checkpoint("llama"))
    prompt, n = [3, 17, 42, 5], 6
    tokens, logits = hf_gpu.greedy(model, [prompt], n)
    dec = hf_gpu.StaticGraphDecoder(model, max_cache_len=16, graph=False)
    free_toks, free_logits = dec.decode(prompt, n)
    assert free_toks == tokens[0]
    assert np.allclose(free_logits, logits[0], atol=1e-4)
    argmax, flogits = dec.decode(prompt, n, forced=tokens[0])
    assert argmax == tokens[0] and np.allclose(flogits, logits[0], atol=1e-4)
    with pytest.raises(ValueError):
        dec.decode(prompt, 20)


def test_check_hf_reports_the_margin_at_the_first_mismatch():
    from mosaic_amk.cuda.commands import check_hf_line, mismatch_margin

    hf = [_logits(seed=s) for s in range(4)]
    hf[2][17] = 2.25
    r = P.compare([5, 5, 9, 5], hf, [5, 5, 5, 5], hf)
    at = mismatch_margin(r, hf)
    line = check_hf_line(r, at)
    assert "MISMATCH at generated token 2" in line and "by 2 bf16 ulps" in line and "a near-tie" in line
    r = P.compare([5, 17, 9, 5], hf, [5, 5, 5, 5], hf)
    line = check_hf_line(r, mismatch_margin(r, hf))
    gap = int(P.ulps_between(hf[1][5], hf[1][17]))
    assert gap > 4 and "generated token 1" in line and "DECISIVE" in line and f"by {gap} bf16 ulps" in line
    ok = P.compare([5] * 4, hf, [5] * 4, hf)
    assert mismatch_margin(ok, hf) is None and check_hf_line(ok, None).startswith("check-hf: match")
