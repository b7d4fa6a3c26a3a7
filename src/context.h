/* The clffn_context, owned by context.c: one device, its queue, its tuning, and the cache of
 * compiled programs. */
#ifndef CLFFN_CONTEXT_H
#define CLFFN_CONTEXT_H

#include "common.h"
#include "program.h"
#include "tuning.h"

struct clffn_shared_scratch; /* ffn.h */

struct clffn_context {
    cl_context context;
    cl_device_id device;
    cl_command_queue queue; /* internal, in-order, profiling on */
    cl_ulong max_alloc;     /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    int cpu;                /* a CPU device: own buffers take CL_MEM_ALLOC_HOST_PTR */
    int denormals;          /* CL_FP_DENORM: the device keeps subnormal floats */
    /* a CPU whose work-item runs as a thread of its own (not a Mesa software GPU, which packs
     * work-items into SIMD lanes): the column GEMV then takes wide strips (clffn_wgemv_strip) */
    int col_strips;
    clffn_programs programs; /* the compiled kernels, built on first use (program.c) */
    clffn_tuning tuning;     /* what was applied when the device was opened */
    /* the GEMMs split their inner dimension into blocks of about this many (0: never); from
     * the tuning profile, or clffn_context_set_gemm_k_block() */
    size_t gemm_k_block;
    /* products whose token rows number at most this run as one matrix-vector product per row
     * (clffn__sgemm); from the tuning profile, or clffn_context_set_gemv_max_tokens() */
    size_t gemv_max_tokens;
    /* products over fewer token rows than this are not K-blocked (clffn__sgemm); from the
     * tuning profile, or clffn_context_set_gemm_k_block_min_rows() */
    size_t gemm_k_block_min_rows;
    /* the layout uploads keep W1, V and W2 in; from the tuning profile, or
     * clffn_context_set_weight_layout() */
    clffn_layout weight_layout;
    /* the Xgemm sets products run with: xgemm_few below xgemm_few_rows token rows, xgemm for
     * the rest (clffn__sgemm); from the tuning profile, or clffn_context_set_xgemm() */
    clffn_xgemm_set xgemm, xgemm_few;
    size_t xgemm_few_rows;
    /* products over at most this many token rows run clffn's few-token kernels, indexed by
     * clffn_kernel_class: [0] with f32 weights, [1] with f16 or bf16 ones, [2] with quantized
     * inputs, [3] with compressed ones in products of at least kernel_large_weights weights,
     * [4] with q8_0 or q4_0 ones; from the tuning profile, or
     * clffn_context_set_kernel_max_tokens() */
    size_t kernel_max_tokens[CLFFN_KERNEL_CLASSES];
    size_t kernel_large_weights;
    /* on a CPU, the row kernels take rows several a work-item where x has at least this many
     * floats (src/wmatrix.c); from the tuning profile, or clffn_context_set_row_group_cols() */
    size_t row_group_cols;
    /* clffn_context_set_quantized_inputs(): q8_0 and q4_0 products round their inputs to q8_0,
     * bf16 ones to bf16 */
    int quantized_inputs;
    /* clffn_context_set_fused_epilogues(): few-token products apply the FFN's epilogues */
    int fused_epilogues;
    /* blocks dequantized transposed go through local memory (clffn_wdequant_tl); on all but
     * CPU devices, or clffn_context_set_dequant_tiles() */
    int dequant_tiles;
    size_t max_wg;                    /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    cl_uint compute_units;            /* CL_DEVICE_MAX_COMPUTE_UNITS */
    size_t wgemv[CLFFN_WGEMV_PARAMS]; /* the few-token kernels' shapes */
    /* clffn_context_set_shared_scratch(): FFNs created while share_scratch is on share `shared`
     * (ffn.c makes it for the first and releases it with the last) */
    int share_scratch;
    struct clffn_shared_scratch *shared;
};

#endif
