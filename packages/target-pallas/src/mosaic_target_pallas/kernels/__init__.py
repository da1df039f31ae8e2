"""One kernel per module: ``hopper_matmul`` (jax's, wrapped), ``pipelined_matmul`` (the project's own),
``attention`` (the project's own forward; jax's attention_mgpu is wrapped in ``backend.py``), ``race_demo`` (a tiny two-warpgroup kernel for the race detector)."""
