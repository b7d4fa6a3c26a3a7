/* clffn_defs.h — the constants the host layer and the kernels must agree on, defined once.
 *
 * Valid C and OpenCL C: the host includes it (src/), and it is the first part of every program
 * the host builds (cmake/embed_kernels.cmake puts it before the .cl files). The activation ids
 * are not here: they are the public clffn_activation values, and the host passes each one to the
 * kernel build as -DCLFFN_ACT_<NAME>=<value> (src/program.c), so the kernels compare against the
 * public enum itself. */
#ifndef CLFFN_DEFS_H
#define CLFFN_DEFS_H

/* Runtime flags of the epilogue kernels (bit set = present). */
#define CLFFN_F_BIAS1 1u
#define CLFFN_F_BIAS_GATE 2u
#define CLFFN_F_BIAS2 4u
#define CLFFN_F_RESIDUAL 8u

/* The row products' fused epilogues (cl/weights.cl, clffn_wgemv_rows_ep/_act/_glu): which one
 * (the host's choice of kernel), and whether its biases are added (the kernel's flags). */
#define CLFFN_EP_HIDDEN 1u    /* the first epilogue (h from z), else the second (y = u + b) */
#define CLFFN_EP_PAIRS 2u     /* gated: W1's row j and V's row pair + j in one work-group */
#define CLFFN_EP_BIAS 4u      /* b1 (first) or b2 (second) */
#define CLFFN_EP_BIAS_GATE 8u /* bv */
#define CLFFN_EP_VEC4 16u     /* the activation's float4 form, as clffn_epilogue1's vec path */

/* Philox4x32-10: round multipliers and the key's Weyl increments (golden ratio, sqrt(3) - 1). */
#define CLFFN_PHILOX_M0 0xD2511F53u
#define CLFFN_PHILOX_M1 0xCD9E8D57u
#define CLFFN_PHILOX_W0 0x9E3779B9u
#define CLFFN_PHILOX_W1 0xBB67AE85u

/* Columns per work-item of the element-wise kernels: one float4, and one Philox block. */
#define CLFFN_COLUMNS_PER_ITEM 4

/* Rows per chunk of the bias-gradient sums (clffn_column_partials): more means fewer partial
 * sums, but longer walks down the columns. */
#define CLFFN_COLSUM_ROWS 64

/* The column GEMV's accumulators (cl/weights.cl, clffn_wgemv_cols): a work-item keeps its
 * columns × tokens sums in registers, so many tokens get fewer columns each, down to 8, instead
 * of sums that spill to memory. */
#define CLFFN_WCOL_VALUES 128
#define CLFFN_WCOL_WIDTH(width, tokens)      \
    ((width) * (tokens) <= CLFFN_WCOL_VALUES \
         ? (width)                           \
         : (CLFFN_WCOL_VALUES / (tokens) >= 8 ? CLFFN_WCOL_VALUES / (tokens) : 8))

/* The column GEMV on a CPU device (cl/weights.cl, clffn_wgemv_strip): a work-item keeps the
 * sums of a strip of columns over the pass's tokens in private memory, this many values in all
 * (4 KiB): the strip is that over the tokens, in whole blocks of 32, at least one. Wider strips
 * measured the same (16384 values: whole rows of 4096 -> 11008) or slower (4096 values), and
 * narrower ones, whose sums fit the registers at 2 to 8 tokens, mixed: 256 values, ∂x through
 * 4096 -> 11008 SwiGLU on an Intel Xeon, f16 at 16 tokens 80.6 -> 70.9 ms, but q4_0 56.4 ->
 * 61.6, q4_0 at 8 tokens 31.9 -> 41.8 and both at 2 tokens 6-20% slower. */
#define CLFFN_WCOL_STRIP_VALUES 1024
#define CLFFN_WCOL_STRIP(tokens) \
    (CLFFN_WCOL_STRIP_VALUES / (tokens) >= 32 ? CLFFN_WCOL_STRIP_VALUES / (tokens) / 32 * 32 : 32)

/* clffn_wdequant_tl's tile (cl/weights.cl): W's rows by W's columns a work-group stages in local
 * memory, with work-groups of (CLFFN_WDEQUANT_TILE_COLS / 8, CLFFN_WDEQUANT_TILE_ROWS), eight
 * values a work-item (src/wmatrix.c launches them). */
#define CLFFN_WDEQUANT_TILE_ROWS 32
#define CLFFN_WDEQUANT_TILE_COLS 64

/* Bytes of one token's row of quantized inputs for rows of `blocks` q8_0 blocks (clffn_xquant in
 * cl/weights.cl): the quants of ⌈blocks / 2⌉ pairs (64 bytes a pair) and a scale a block,
 * padded to a multiple of 64 bytes. */
#define CLFFN_XQ_BYTES(blocks) \
    (64 * (((blocks) + 1) / 2) + (8 * (((blocks) + 1) / 2) + 63) / 64 * 64)

/* Whether q8_0's and q4_0's quantized-input rows go sixteen to a work-item (cl/weights.cl,
 * clffn_qx_rows16): where a row has one lane (split 1, CPUs), q8_0's from 4 tokens on and q4_0's
 * at every count. One row a work-item decodes each of q4_0's blocks for that row alone (nibbles
 * split, scale converted, a sum per block), which bound its one- and two-token products; sixteen
 * rows share those steps, and their transposition costs less than the decoding it spares (q4_0,
 * 4096 -> 11008 SwiGLU, one token 2.5-2.6 -> 2.1-2.2 ms, two 4.0-4.2 -> 2.3-2.4). q8_0's bytes
 * are its quants, so its one row a work-item reads them as they lie; at 2 tokens the wide form
 * was slower on the smaller shapes (2048 -> 6144 0.89-0.92 -> 0.95-0.97 ms). Their input rows
 * then carry each block's -Σq, as q4_0's do at one token everywhere (CLFFN_XQ_C). */
#define CLFFN_QX_WIDE(split, tokens, q4_0) ((split) == 1 && (tokens) >= ((q4_0) ? 1 : 4))
#define CLFFN_QX_WIDE_ROWS 16 /* the rows a work-item of that form takes */

/* Bytes of one token's row of bf16-rounded inputs for rows of `cols` bf16 weights (clffn_xquant
 * of the bf16 program, cl/weights.cl): ⌈cols / 32⌉ chunks of 32 values, 64 bytes each, zeros
 * past cols. */
#define CLFFN_XB_BYTES(cols) ((((cols) + 31) / 32) * 64)

/* Rows a work-item of the bf16-input row kernel takes on a CPU with AVX-512 BF16 (cl/weights.cl,
 * clffn_bx_rows), by the pass's tokens: each chunk of x read then serves every row, with rows ×
 * tokens accumulators of 16 lanes kept at 16 registers or fewer. */
#define CLFFN_BX_ROWS(tokens) ((tokens) <= 2 ? 1 : 4)

/* Rows per chunk of the column GEMV on a CPU device: each chunk's partial sums go to scratch and
 * are added by clffn_wgemv_sum, so a work-item walks a few pages rather than one per row. */
#define CLFFN_WCOL_CHUNK_ROWS 128

/* The column GEMV on a GPU: chunks of rows enough for this many work-groups per compute unit,
 * each chunk at least CLFFN_WCOL_GPU_MIN_ROWS rows (src/wmatrix.c, col_chunk_rows). */
#define CLFFN_WCOL_GPU_GROUPS 4
#define CLFFN_WCOL_GPU_MIN_ROWS 256

/* Work-items sharing one router dot product of a mixture-of-experts layer (cl/moe.cl,
 * clffn_moe_logits; a power of 2): the host launches work-groups of this size. */
#define CLFFN_MOE_LANES 64

/* Past one pass of the few-token kernels, a mixture-of-experts layer that keeps its counts on
 * the device lays each expert's rows out in tiles of CLFFN_MOE_TILE rows (its last one partly
 * filled), and each tile is a step of the grouped launches (cl/moe.cl, clffn_moe_tiles; src/moe.c).
 * CLFFN_MOE_TILE is CLFFN_MAX_KERNEL_TOKENS, the kernels' pass; clffn_moe_place's stride
 * CLFFN_MOE_TILED asks for that layout. For n choices of E experts there are at most
 * CLFFN_MOE_TILE_STEPS(n, E) tiles: ⌈n_e / 16⌉ ≤ (n_e + 15) / 16 for each of the m ≤ min(E, n)
 * experts with rows, so their sum is at most ⌊(n + 15·min(E, n)) / 16⌋. */
#define CLFFN_MOE_TILE 16u
#define CLFFN_MOE_TILED 0xffffffffu
#define CLFFN_MOE_TILE_STEPS(n, E) \
  (((n) + (CLFFN_MOE_TILE - 1) * ((E) < (n) ? (E) : (n))) / CLFFN_MOE_TILE)

/* The erf accuracy probe's forms (clffn_erf_probe): float4 instead of float, and a reciprocal
 * 2 ulp off instead of the device's. */
#define CLFFN_ERF_PROBE_VEC 1u
#define CLFFN_ERF_PROBE_DIV_2ULP 2u

#endif
