"""GpuTarget records for Blackwell: B200 (compute capability 10.0, sm_100a) and GeForce RTX 5090
(compute capability 12.0, sm_120a).

Sources, cited per figure below:
  [DS-B200]  NVIDIA HGX B200 datasheet (per GPU: 180 GB HBM3e, 8 TB/s; FP16/BF16 4.5 PFLOPS and FP8
             9 PFLOPS with sparsity, halved here for dense).
  [WP-5090]  NVIDIA RTX Blackwell GPU Architecture whitepaper, GeForce RTX 5090 column (170 SMs, 32 GB
             GDDR7 at 1792 GB/s, 96 MB L2; FP16/BF16 tensor with FP32 accumulate 209.5 TFLOPS dense,
             FP8 with FP32 accumulate 419 TFLOPS dense).
  [PG]       CUDA C++ Programming Guide, "Features and Technical Specifications": cc 10.0 has 228 KB
             shared memory per SM (227 KB per block), 2048 threads and 32 blocks per SM; cc 12.0 has
             100 KB per SM (99 KB per block), 1536 threads and 32 blocks per SM; both 64 K registers.
  [PROPS]    cudaGetDeviceProperties: B200 multiProcessorCount 148, l2CacheSize 132644864 (126.5 MiB).
  [CLUSTER]  Clusters: 8 portable; 16 non-portable on B200; RTX 5090 recorded at the portable 8.
"""

from mosaic.records import GpuTarget

KIB = 1024
MIB = 1024 * KIB
GB = 10**9

B200 = GpuTarget(
    name="b200",
    display_name="NVIDIA B200",
    arch="sm_100a",
    compute_capability=(10, 0),
    sm_count=148,  # [PROPS]
    smem_per_sm=228 * KIB,  # [PG]
    smem_per_block=227 * KIB,  # [PG]
    regs_per_sm=64 * KIB,  # [PG]
    l2_bytes=132644864,  # [PROPS]
    hbm_bandwidth_gbs=8000.0,  # [DS-B200]
    memory_bytes=180 * GB,  # [DS-B200]
    peak_bf16_tflops=2250.0,  # [DS-B200] 4.5 PFLOPS with sparsity
    peak_fp8_tflops=4500.0,  # [DS-B200] 9 PFLOPS with sparsity
    max_cluster_size=16,  # [CLUSTER]
    max_threads_per_sm=2048,  # [PG]
    device_names=("B200",),  # [PROPS] name "NVIDIA B200"
)

RTX_5090 = GpuTarget(
    name="rtx5090",
    display_name="NVIDIA GeForce RTX 5090",
    arch="sm_120a",
    compute_capability=(12, 0),
    sm_count=170,  # [WP-5090]
    smem_per_sm=100 * KIB,  # [PG]
    smem_per_block=99 * KIB,  # [PG]
    regs_per_sm=64 * KIB,  # [PG]
    l2_bytes=96 * MIB,  # [WP-5090]
    hbm_bandwidth_gbs=1792.0,  # [WP-5090] GDDR7, not HBM: the field is DRAM bandwidth
    memory_bytes=32 * GB,  # [WP-5090]
    peak_bf16_tflops=209.5,  # [WP-5090] FP32 accumulate
    peak_fp8_tflops=419.0,  # [WP-5090] FP32 accumulate
    max_cluster_size=8,  # [CLUSTER]
    max_threads_per_sm=1536,  # [PG]
    device_names=("RTX 5090",),  # [PROPS] name "NVIDIA GeForce RTX 5090"
)

TARGETS = (B200, RTX_5090)
