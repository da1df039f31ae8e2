"""One kernel per module: ``hopper_gemm`` (warp-specialised TMA/wgmma) and ``naive_gemm`` (first translation)."""
