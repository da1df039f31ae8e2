"""Kept only until ``live.py`` (moving to ``run/live/``) imports :mod:`mosaic.toolchain` (see .coord/NOTES.md).

The disassemblers and cubin readers live in :mod:`mosaic.toolchain.nvdisasm` and :mod:`mosaic.toolchain.cubin`.
"""

from mosaic.toolchain.nvdisasm import disassemble as disassemble_cubin

__all__ = ["disassemble_cubin"]
