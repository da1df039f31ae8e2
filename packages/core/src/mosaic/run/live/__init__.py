"""The live workbench: the convergence loop's measurements taken on a GPU, in child processes.

Split by process:

* :mod:`~mosaic.run.live.parent`: :class:`~mosaic.run.live.parent.LiveWorkbench`, in the loop's own process;
* :mod:`~mosaic.run.live.worker`: the persistent worker pool (the parent's
  :class:`~mosaic.run.live.worker.Workers` and the worker process's serve loop);
* :mod:`~mosaic.run.live.child`: the request handler (prepare, numerics gate, interleaved timing);
* :mod:`~mosaic.run.live.protocol`: the request and answer records all three share.

``mosaic run`` asks a :class:`~mosaic.run.workbench.Workbench`; this one answers on the device and leaves, for
every kernel it touched, a bundle in ``DIR/bundles`` in exactly the layout :class:`~mosaic.run.offline.
OfflineWorkbench` reads, so ``mosaic run --offline DIR`` re-decides the campaign from them. Nothing else it
writes stays in ``DIR`` but the worker's output (``DIR/logs/worker-N.log``): lowerings in flight and gate
bundles go to a scratch directory in the user cache (``$MOSAIC_CACHE_DIR/scratch/<campaign>-<slot>-<pid>/``,
:func:`mosaic.user_cache.make_scratch`), removed when the workbench closes.

* **Reference** (``capture_reference``): :func:`mosaic.capture.capture` in its own process with a timeout;
  noise from ``noise_blocks / 2`` interleaved self-pairs of blocks (what capture records). When the
  language dumped PTX but no SASS or cubin (jax's Mosaic GPU), the PTX is assembled with ``ptxas`` for the
  GPU record's arch so the reference can be lifted (said in the manifest: ``sass_from_ptx``). The family's
  yardsticks are captured next, each in its own process, by the same capture code and timer (cuBLAS, a
  ``torch.matmul`` Runnable with reduced-precision reductions off, for GEMM; torch SDPA, flash SDPA, cuDNN
  SDPA and flash-attn-4 for attention): ``yardstick.bundle`` for the first, ``yardstick-<name>.bundle`` for
  every other; one that cannot run keeps a bundle saying why (``mosaic_run.unmeasured``). All their costs
  are the reference's.
* **Build** (``build``): the target backend's ``lower()`` through a lower-only capture (own process); an
  :class:`~mosaic.backend.Unbuildable` setting is recorded (``build.ok = false``) and stepped over. Then,
  still in the build step and in another process (the worker, or a fresh child), the numerics gate: ``backend.prepare()`` -> poison ->
  one run -> capture's float64 oracle (``capture_in_process``); a passing kernel also gets a launch record
  from CUPTI. The gate runs inside the build step so that the bundle the loop lifts is final (the launch
  record is part of the fingerprint; the offline re-decision lifts the same files). A kernel that fails
  the gate or crashes is never timed. ``check`` answers the gate's recorded verdict. The float64 reference
  is computed once per campaign and gate seed (:mod:`mosaic.oracle.cache`, ``$MOSAIC_CACHE_DIR/oracle``) and read
  by later gates after its key (the inputs' SHA-256 among it) is verified; the gate's
  ``capture.summary.oracle_reference`` says computed or read. The inputs come from the campaign's gate seeds
  (drawn when it starts, in the journal header), made in the loop's process: a request names an inputs file,
  never a seed. A passing capture is followed by the device cases (the second seed, two unseen shapes inside the
  candidate's domain, every distribution: :func:`mosaic.gate.device_plan`), judged in the loop's process.
* **Time** (``time``): one process (the worker, reusing the kernels it compiled, or a fresh child) prepares
  the incumbent and the candidate with their backends' ``prepare()`` on the same seeded inputs and runs ``timer.time_interleaved([incumbent, candidate], runs)``
  ``rounds`` times with an L2 flush (:class:`mosaic.timing.device.L2Flush`) before every run; each run is
  bracketed by device synchronisations so kernels on different streams (jax's, the default stream) never
  overlap. The session is appended to the candidate bundle's ``timings.json`` ``sessions``, with its spot-check:
  the outputs of the candidate's last timed run of a round drawn by the loop's process, judged by the float64
  oracle (a failure rejects the candidate).
* **Prefetch** (``prefetch``): languages whose lowering never touches the GPU (:data:`~mosaic.run.live.parent.PREFETCH_LANGUAGES`)
  are lowered ahead in background processes (``CUDA_VISIBLE_DEVICES=""``), up to ``parallel`` at a time:
  the loop names the naive translation before the reference capture and the next few proposals after each
  diff. ``build`` then waits for the prefetched capture instead of starting one.

Isolation (campaign ``isolation``): ``"worker"`` (default) sends gates and timing sessions to one
persistent child (:mod:`mosaic.run.live.worker`, its own process group) that keeps compiled kernels and the
reference between requests and is replaced after any failure (crash, timeout, failed request, failed gate,
protocol error); a failure in a worker that had served earlier requests is asked once more of a fresh
worker before it is recorded (not for timeouts). ``"step"``: a fresh child per gate and per session.
Either way each gate (``capture.isolation``) and each session (``isolation``) records the mode, the pid and
the request number within that process (and, for the worker, which kernels were compiled or cached).

Costs (``mosaic_run.cost_s`` of each bundle, the loop's budget): wall seconds the loop waited for that
kernel's steps on the device machine (lowering wait + gate + every timing session it was the candidate
of, a worker's start or a confirming retry included). Compile time that overlapped other steps is not
counted twice.

The child protocol (``"step"``, and every yardstick's capture): ``python -m mosaic.run.live.child REQUEST.json``;
the request is a JSON object ``{"format": "mosaic-live-request", "mode": "check" | "time", ..., "result":
PATH}`` and the child writes ``{"status": "ok" | "failed", ...}`` to ``result``. A child that writes no
result crashed (a signal) or failed; one past its timeout is killed with its whole process group. Nothing
of a child's failure reaches the parent's process except that record. The worker speaks the same requests
as JSON lines (:mod:`mosaic.run.live.worker`).
"""
