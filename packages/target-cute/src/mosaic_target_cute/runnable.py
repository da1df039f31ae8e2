"""A compiled CuTe kernel on the GPU (``mosaic.backend.Runnable``), with torch tensors as device memory.

The kernel is the lowering's compiled function when the artifact store holds it (:mod:`artifact_store`:
loaded, not compiled again), else compiled here; ``prepared_how`` says which, and why it compiled
(``"loaded artifact <key> in 0.05 s (first launch included)"`` / ``"compiled in 2.1 s (first launch
included): no artifact ..."``), and is printed to stderr.
``launch()`` calls the compiled kernel on a fixed stream (asynchronous, no allocation); ``poison()``
fills C with NaN; ``output()`` synchronises and copies C to host as float32.

:class:`CuteAttentionRunnable` is the same for the ``attention`` family (q, k, v in, o out). It compiles in
``prepare`` (the artifact store keys gemm builds only). WRITTEN BUT NOT YET RUN ON A GPU: this machine has none;
its first GPU capture is its test.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from mosaic.backend import Unbuildable


class CuteRunnable:
    def __init__(self, knobs, mnk, dtype: str, gpu, workdir: Path, a, b):
        try:
            import torch
        except ImportError:
            raise Unbuildable("cute prepare needs torch with CUDA for device memory", "prepare") from None
        if not torch.cuda.is_available():
            raise Unbuildable("cute prepare needs a CUDA GPU", "prepare")
        import cuda.bindings.driver as cuda
        from cutlass.cute.runtime import from_dlpack

        from mosaic_target_cute import artifact_store, budget
        from mosaic_target_cute.lowering import compile_gemm, gemm_tensors, line_info

        m, n, k = mnk
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        self.torch = torch
        self.a = torch.as_tensor(np.asarray(a, np.float32)).to("cuda", tdt).contiguous()
        self.b = torch.as_tensor(np.asarray(b, np.float32)).to("cuda", tdt).contiguous()
        self.c = torch.empty((m, n), device="cuda", dtype=tdt)
        # CuTe views: A (M, K, L), B (N, K, L) over the k×n row-major buffer, C (M, N, L), with the strides
        # of the fake tensors that lower() compiled (L stride m*k etc., as permute gives; unsqueeze(-1) gave
        # stride 1), so the kernel run here is the one whose PTX/SASS the bundle holds
        ta = from_dlpack(self.a[None].permute(1, 2, 0), assumed_align=16)
        tb = from_dlpack(self.b[None].permute(2, 1, 0), assumed_align=16)
        tc = from_dlpack(self.c[None].permute(1, 2, 0), assumed_align=16)
        want = [(tuple(f.shape), tuple(f.stride)) for f in gemm_tensors(m, n, k, dtype)]
        got = [(tuple(t.shape), tuple(t.stride)) for t in (ta, tb, tc)]
        if got != want:
            raise Unbuildable(f"device views {got} differ from the lowered layouts {want}", "prepare")
        self.stream_t = torch.cuda.current_stream()
        self.stream = cuda.CUstream(self.stream_t.cuda_stream)
        self.args = (ta, tb, tc, self.stream)
        self.artifact_key = artifact_store.artifact_key(
            artifact_store.key_inputs(knobs, m, n, k, dtype, gpu.arch, gpu.sm_count, line_info()))
        start = time.perf_counter()
        loaded = artifact_store.load(self.artifact_key)
        why = loaded if isinstance(loaded, str) else None
        if why is None:
            self.compiled = loaded.function
            self._module = loaded.module
            self.build = loaded.build
            budget.check(self.build, gpu)
            try:
                self.launch()  # the CUDA module is loaded at the first launch: outside the timed region
                torch.cuda.synchronize()
                self.prepared_how = (f"loaded artifact {self.artifact_key[:12]} in "
                                     f"{time.perf_counter() - start:.2f} s (first launch included)")
            except Exception as exc:  # noqa: BLE001 - the DSL raises many types; compile instead
                why = f"artifact {self.artifact_key[:12]} loaded but failed to launch: {type(exc).__name__}: {exc}"
                why = why[:400]
        if why is not None:
            start = time.perf_counter()
            self._module = None
            self.compiled, self.build = compile_gemm(knobs, m, n, k, dtype, gpu.arch, gpu.sm_count,
                                                     workdir / "cute_run_dump", tensors=(ta, tb, tc),
                                                     stream=self.stream)
            budget.check(self.build, gpu)
            self.launch()  # load the module outside the timed region
            torch.cuda.synchronize()
            self.prepared_how = f"compiled in {time.perf_counter() - start:.2f} s (first launch included): {why}"
        print(f"cute prepare: {self.prepared_how}", file=sys.stderr, flush=True)

    def launch(self) -> None:
        self.compiled(*self.args)

    def poison(self) -> None:
        self.c.fill_(float("nan"))

    def output(self) -> dict[str, np.ndarray]:
        self.torch.cuda.synchronize()
        return {"c": self.c.float().cpu().numpy()}

    def close(self) -> None:
        self.a = self.b = self.c = self.compiled = self._module = None


class CuteAttentionRunnable:
    """The attention forward on the GPU: q (batch, heads, seq, head_dim), k, v (batch, kv_heads, seq, head_dim)
    and o (like q) are contiguous torch tensors; the kernel sees them through the strided views
    :func:`~mosaic_target_cute.lowering.attention_tensors` describes (the same layouts the lowering compiled).
    First run on an H100 on 2026-12-07: every configuration of tests/test_attention_gpu.py passed the oracle."""

    def __init__(self, knobs, shape, dtype: str, gpu, workdir: Path, q, k, v):
        try:
            import torch
        except ImportError:
            raise Unbuildable("cute prepare needs torch with CUDA for device memory", "prepare") from None
        if not torch.cuda.is_available():
            raise Unbuildable("cute prepare needs a CUDA GPU", "prepare")
        import cuda.bindings.driver as cuda
        from cutlass.cute.runtime import from_dlpack

        from mosaic_target_cute import budget
        from mosaic_target_cute.lowering import attention_tensors, compile_attention

        tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        self.torch = torch
        b, h, kvh, s, d = shape.batch, shape.heads, shape.kv_heads, shape.seq, shape.head_dim
        self.q, self.k, self.v = (torch.as_tensor(np.asarray(x, np.float32)).to("cuda", tdt).contiguous()
                                  for x in (q, k, v))
        self.o = torch.empty((b, h, s, d), device="cuda", dtype=tdt)
        # (seq, head_dim, L) for q, k, o and (head_dim, seq, L) for v: L = batch*heads (kv_heads), stride seq*d
        views = (self.q.view(b * h, s, d).permute(1, 2, 0), self.k.view(b * kvh, s, d).permute(1, 2, 0),
                 self.v.view(b * kvh, s, d).permute(2, 1, 0), self.o.view(b * h, s, d).permute(1, 2, 0))
        tensors = tuple(from_dlpack(t, assumed_align=16) for t in views)
        want = [(tuple(f.shape), tuple(f.stride)) for f in attention_tensors(shape, dtype)]
        got = [(tuple(t.shape), tuple(t.stride)) for t in tensors]
        if got != want:
            raise Unbuildable(f"device views {got} differ from the lowered layouts {want}", "prepare")
        self.stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        self.args = (*tensors, self.stream)
        start = time.perf_counter()
        self.compiled, self.build = compile_attention(knobs, shape, dtype, gpu.arch, gpu.sm_count,
                                                      workdir / "cute_run_dump", tensors=tensors, stream=self.stream)
        budget.check_attention(self.build, knobs, gpu)
        self.launch()  # load the module outside the timed region
        torch.cuda.synchronize()
        self.prepared_how = f"compiled in {time.perf_counter() - start:.2f} s (first launch included)"
        print(f"cute prepare: {self.prepared_how}", file=sys.stderr, flush=True)

    def launch(self) -> None:
        self.compiled(*self.args)

    def poison(self) -> None:
        self.o.fill_(float("nan"))

    def output(self) -> dict[str, np.ndarray]:
        self.torch.cuda.synchronize()
        return {"o": self.o.float().cpu().numpy()}

    def close(self) -> None:
        self.q = self.k = self.v = self.o = self.compiled = None
