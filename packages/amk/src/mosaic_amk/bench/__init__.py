"""Lab equipment for the CUDA VM, apart from the VM runtime (``mosaic_amk.cuda``):

- :mod:`~mosaic_amk.bench.bench`: ``mosaic amk bench``, the candidate configs timed against HF eager, HF static
  cache + CUDA graph and the weight-bandwidth floor, and the "where the time goes" probes;
- :mod:`~mosaic_amk.bench.microbench`: small schedules (one op split over SMs, hand-off chains, the planted
  deadlock);
- :mod:`~mosaic_amk.bench.handoff` (+ ``handoff.cu``): the grid-wide stage hand-off protocols measured alone;
- :mod:`~mosaic_amk.bench.trace`: an ``AMK_TRACE`` build's per-task timestamps turned into a timeline and stage
  table;
- :mod:`~mosaic_amk.bench.hf_gpu`: transformers on the GPU in bf16 (random-init shapes, greedy reference,
  eager / static-cache + CUDA-graph timing).
"""
