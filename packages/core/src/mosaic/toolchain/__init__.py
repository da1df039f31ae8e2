"""The CUDA toolchain, written once and used by core, every target plugin and AMK.

* :mod:`~mosaic.toolchain.tools` finds a tool (``nvcc``, ``ptxas``, ``nvdisasm``, ``cuobjdump``) and runs it;
* :mod:`~mosaic.toolchain.ptxas` assembles PTX into a cubin and parses the ``ptxas -v`` resource log;
* :mod:`~mosaic.toolchain.nvcc` runs nvcc and keeps its outputs in the hash-keyed build cache;
* :mod:`~mosaic.toolchain.nvdisasm` turns a cubin into SASS text;
* :mod:`~mosaic.toolchain.cubin` reads a cubin's ELF attributes (registers, shared memory, launch bounds).

Nothing here runs a kernel or needs a GPU, and nothing here imports anything of mosaic above
``mosaic.errors`` and ``mosaic.records``.
"""
