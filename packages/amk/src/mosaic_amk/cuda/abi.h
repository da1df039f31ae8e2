// The AMK CUDA VM's task-descriptor ABI. Mirrored word for word by mosaic_amk/cuda/encode.py
// (test_cuda_encode checks the two agree by parsing this file).
#pragma once

#define AMK_TASK_WORDS 64   // int32 words per task record (256 bytes)
#define AMK_BUF_META 8      // int32 words per buffer record
#define AMK_MAX_IN 8
#define AMK_MAX_OUT 4
#define AMK_MAX_WAIT 8
#define AMK_MAX_PF 3        // weight regions prefetched per task
#define AMK_CTRL_HEAD 16    // control words before the per-block dump
#define AMK_DUMP_WORDS 8    // per-block dump record

// task record words
#define W_OP 0
#define W_NIN 1
#define W_NOUT 2
#define W_NWAIT 3
#define W_SIGNAL 4
#define W_FLAGS 5
#define W_ROW0 6
#define W_ROW1 7
#define W_IN 8        // 8 buffer ids
#define W_OUT 16      // 4 buffer ids
#define W_WAIT 20     // 8 x (counter, threshold)
#define W_NH 36
#define W_NKV 37
#define W_HD 38
#define W_WINDOW 39
#define W_PAGE 40
#define W_EPS 41      // float bits
#define W_SCALE 42    // float bits
#define W_ASCALE 43   // float bits (rope attention_scaling)
#define W_POS 44      // position baked into the schedule (used when F_RUNTIME_POS is clear)
#define W_PART 45     // argmax_partial: the part (index into val / idx) it writes
#define W_PF 48       // 3 x (buffer id, offset in 16-byte units, size in 16-byte units)
#define W_ID 60       // the schedule's task id (for the dump)

// task flags
#define F_BIAS 1
#define F_RESID 2
#define F_RUNTIME_POS 4
#define F_NORM 8      // gemv_rope / gemv_rope_append: the task normalises x itself (input nw)
#define F_ROPE 16     // gemv_rope_append: RoPE on the rows (input inv_freq); gemv_rope always rotates
#define F_KV_STAGE 32 // attention: the cache rows before the step's position may be read before the wait (encode.py)
#define F_ROPE_BLOCK 64 // gemv_rope(_append) with RoPE, attention: q / the K cache in the blocked RoPE order (rope_order.py)

// op codes (order of encode.OPS)
#define OP_EMBED 0
#define OP_RMSNORM 1
#define OP_GEMV 2
#define OP_GEMV_SILU_MUL 3
#define OP_SILU_MUL 4
#define OP_ADD 5
#define OP_ROPE 6
#define OP_KV_APPEND 7
#define OP_ROPE_APPEND 8
#define OP_ATTENTION 9
#define OP_ARGMAX 10
#define OP_RMSNORM_GEMV 11
#define OP_RMSNORM_GEMV_SILU_MUL 12
#define OP_GEMV_ROPE 13
#define OP_GEMV_ROPE_APPEND 14
#define OP_ARGMAX_PARTIAL 15
#define OP_ARGMAX_COMBINE 16
#define AMK_NUM_OPS 17

// device dtypes of buffer records
#define DT_F32 0
#define DT_BF16 1
#define DT_I32 2
// quantized weights (mosaic_amk/quant.py): one buffer of 16-byte-aligned planes, codes | scales (| mins)
#define DT_Q8_0 3     // GGUF Q8_0: int8 codes [rows, K], float16 block scales [rows, K / 32]
#define DT_Q4_1 4     // GGUF Q4_1: 4-bit codes [rows, K / 2] (GGUF nibble order), float16 scales and mins [rows, K / 32]
#define DT_INT8 5     // int8 weight-only: int8 codes [rows, K], float32 row scales [rows]

// buffer record words
#define B_DTYPE 0
#define B_KIND 1
#define B_RANK 2
#define B_D0 3        // dims 0..3 at words 3..6
#define B_ROW 7       // elements per row of axis 0 (product of dims 1..)

// control words
#define C_ABORT 0     // sticky: set by the watchdog; a launch that finds it set runs nothing
#define C_ERROR 1     // sticky error bits (E_*)
#define C_ABORTED 2   // blocks that stopped on the abort
#define E_TOKEN 1     // embed: token id outside the table
#define E_POSITION 2  // kv slot outside the cache
#define E_SCORES 4    // attention: more cached tokens than the score buffer holds
#define E_SMEM 8      // a fused GEMV's operands (x, its rows, cos/sin) do not fit the block's shared memory
#define E_ROPE_BLOCK 16 // attention: K rows in the blocked RoPE order but the task is not staged (rope_order.py)
#define E_QUANT 32     // a quantized weight reached a VM built without AMK_QUANT=1 (cuda_vm.quant_defines)

// dump states
#define S_IDLE 0
#define S_RUNNING 1
#define S_DONE 2
#define S_TIMEOUT 3
#define S_PEER_ABORT 4
#define S_SKIPPED 5

// precision modes
#define MODE_F32 0      // ops.py semantics in float32 (bf16 weights)
#define MODE_HF_BF16 1  // round to bf16 where transformers' bf16 eager rounds
