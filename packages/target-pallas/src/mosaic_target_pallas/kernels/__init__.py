"""One kernel per module: ``hopper_matmul`` (jax's, wrapped), ``pipelined_matmul`` (the project's own),
``attention`` (jax's, wrapped), ``race_demo`` (a tiny two-warpgroup kernel for the race detector)."""
