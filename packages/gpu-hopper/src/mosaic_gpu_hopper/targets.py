"""GpuTarget records for Hopper (compute capability 9.0, lowered for sm_90a).

Sources, cited per figure below:
  [DS-H100]  NVIDIA H100 Tensor Core GPU datasheet (H100 SXM / H100 PCIe columns), dense figures are
             the with-sparsity figures halved.
  [DS-H200]  NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column).
  [PG]       CUDA C++ Programming Guide, "Features and Technical Specifications", compute capability 9.0
             (228 KB shared memory per SM, 227 KB per block opt-in, 64 K registers per SM, 2048 threads
             and 32 blocks per SM, 255 registers per thread).
  [HTG]      Hopper Tuning Guide: thread block clusters, portable size 8, up to 16 with
             cudaFuncAttributeNonPortableClusterSizeAllowed (we record the non-portable maximum).
  [PROPS]    cudaGetDeviceProperties on the device: multiProcessorCount, l2CacheSize (52428800 on
             H100 SXM/PCIe), sharedMemPerMultiprocessor 233472, sharedMemPerBlockOptin 232448.
  [H200-READ] cudaGetDeviceProperties read on the lent H200 on 2026-11-30 (benchmarks/device_probe.py):
             name "NVIDIA H200", 132 SMs, l2CacheSize 62914560 (60 MiB, not the H100's 50 MiB),
             sharedMemPerMultiprocessor 233472, sharedMemPerBlockOptin 232448, regsPerMultiprocessor
             65536, maxThreadsPerMultiProcessor 2048, totalGlobalMem 150109880320, cooperativeLaunch 1.
"""

from mosaic.records import GpuTarget

KIB = 1024
MIB = 1024 * KIB
GB = 10**9

_HOPPER_SM = dict(
    arch="sm_90a",
    compute_capability=(9, 0),
    smem_per_sm=228 * KIB,  # [PG] [PROPS] 233472
    smem_per_block=227 * KIB,  # [PG] [PROPS] sharedMemPerBlockOptin 232448
    regs_per_sm=64 * KIB,  # [PG] 65536 32-bit registers
    l2_bytes=50 * MIB,  # [PROPS] l2CacheSize 52428800
    max_cluster_size=16,  # [HTG] 8 portable, 16 non-portable
    max_regs_per_thread=255,  # [PG]
    max_threads_per_sm=2048,  # [PG]
    max_threads_per_block=1024,  # [PG]
    max_blocks_per_sm=32,  # [PG]
)

H100_SXM = GpuTarget(
    name="h100-sxm",
    display_name="NVIDIA H100 SXM5 80GB",
    sm_count=132,  # [DS-H100] [PROPS] multiProcessorCount 132
    hbm_bandwidth_gbs=3350.0,  # [DS-H100] 3.35 TB/s HBM3
    memory_bytes=80 * GB,  # [DS-H100]
    peak_bf16_tflops=989.4,  # [DS-H100] 1979 with sparsity
    peak_fp8_tflops=1978.9,  # [DS-H100] 3958 with sparsity
    device_names=("H100 80GB HBM3", "H100 SXM"),  # [PROPS] name "NVIDIA H100 80GB HBM3"
    **_HOPPER_SM,
)

H100_PCIE = GpuTarget(
    name="h100-pcie",
    display_name="NVIDIA H100 PCIe 80GB",
    sm_count=114,  # [DS-H100] [PROPS] multiProcessorCount 114
    hbm_bandwidth_gbs=2000.0,  # [DS-H100] 2 TB/s HBM2e
    memory_bytes=80 * GB,  # [DS-H100]
    peak_bf16_tflops=756.0,  # [DS-H100] 1513 with sparsity
    peak_fp8_tflops=1513.0,  # [DS-H100] 3026 with sparsity
    device_names=("H100 PCIe",),  # [PROPS] name "NVIDIA H100 PCIe"
    **_HOPPER_SM,
)

H200 = GpuTarget(
    name="h200",
    display_name="NVIDIA H200 SXM 141GB",
    sm_count=132,  # [DS-H200] [H200-READ] multiProcessorCount 132
    l2_bytes=60 * MIB,  # [H200-READ] l2CacheSize 62914560
    hbm_bandwidth_gbs=4800.0,  # [DS-H200] 4.8 TB/s HBM3e (a device-to-device copy measured 4.17 TB/s)
    memory_bytes=141 * GB,  # [DS-H200]
    peak_bf16_tflops=989.4,  # [DS-H200] 1979 with sparsity
    peak_fp8_tflops=1978.9,  # [DS-H200] 3958 with sparsity
    device_names=("H200",),  # [PROPS] name "NVIDIA H200"
    **{k: v for k, v in _HOPPER_SM.items() if k != "l2_bytes"},
)

TARGETS = (H100_SXM, H100_PCIE, H200)
