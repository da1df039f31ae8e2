"""AutoMegaKernel (AMK): a HuggingFace Llama-family model lowered to a validated task DAG run by one
persistent cooperative CUDA kernel, with a CPU ReferenceVM as the oracle."""
