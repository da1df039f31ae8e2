"""The convergence loop, in one package (docs/convergence.md).

* :mod:`~mosaic.run.campaign`: what to port, to what, on which GPU, and the search's limits;
* :mod:`~mosaic.run.loop`: the loop itself (capture, propose, build, gate, time, decide, beam, stop);
* :mod:`~mosaic.run.decide`: the pure decisions (the acceptance verdict, the stop rule);
* :mod:`~mosaic.run.workbench`: the protocol the loop asks for measurements, and the bundle records it reads;
* :mod:`~mosaic.run.live`: the live workbench on a GPU, split by process (parent, worker pool, child);
* :mod:`~mosaic.run.replay`: answers replayed from a journal (``mosaic run --resume``);
* :mod:`~mosaic.run.offline`: the offline workbench and re-decision from bundles (``mosaic run --offline``);
* :mod:`~mosaic.run.preview`: what a campaign does on a machine without a GPU;
* :mod:`~mosaic.run.journal` and :mod:`~mosaic.run.report`: the record of a campaign and its report.

The ``mosaic run`` verb itself is :mod:`mosaic.commands.run`.
"""
