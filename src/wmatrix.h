/* Weight matrices in their stored type and clffn's own kernels over them (cl/weights.cl): the
 * few-token GEMVs and the dequantizer that feeds CLBlast's SGEMM. Below the linear layer, which
 * decides between them; takes the context and the queue as arguments. */
#ifndef CLFFN_WMATRIX_H
#define CLFFN_WMATRIX_H

#include "gemm.h"

/* A weight matrix as stored: rows of cols values, row_bytes apart, from offset bytes into mem
 * (quantized rows are cols / 32 blocks). */
typedef struct clffn_wmatrix {
    cl_mem mem;
    size_t offset;
    size_t rows, cols, row_bytes;
    clffn_dtype dtype;
} clffn_wmatrix;

/* A pass's token count kept on the device: count[at] of a cl_uint buffer, at most the pass's
 * tokens (an expert's rows in a mixture-of-experts layer, which the host does not read back: the
 * kernels launch for the most, and a count of 0 reads no weight). */
typedef struct clffn_wcount {
    cl_mem mem;
    cl_uint at;
    /* a grouped launch: `groups` experts' products at once (0 or 1: this one alone), step g's
     * expert e being mem[ids_at + g] (ids_at 0: e = g), its count at at + e, its weights
     * e·w_stride bytes after the matrix's, its x and y e·x_stride and e·y_stride floats after
     * the pass's (cl/weights.cl, CLFFN_GROUP_SHIFT); with experts_at set (a tiled launch), step
     * g's rows, count and outputs go by g, and only its weights (and biases) by its expert
     * mem[experts_at + g] (cl/weights.cl, CLFFN_GROUP_EXPERT) */
    cl_uint groups, ids_at;
    cl_ulong w_stride, x_stride, y_stride;
    cl_ulong experts_at;
} clffn_wcount;

/* Token counts the kernels are built for; a launch takes the smallest that holds its tokens. */
#define CLFFN_WTOKEN_BUCKETS 5

/* One owner's (an FFN's) kernels for its weights' type, made on first use with the context's
 * shapes (remade when they change), and its scratch: the f32 block a product dequantizes, the
 * column GEMV's per-chunk sums, or a product's quantized input rows (one product at a time uses
 * it, in queue order), its own or `shared`: one that several owners share where their products
 * run one after another on one queue, as a mixture-of-experts layer's experts on its context do.
 * There one expert's dequantized block at a time is live, not one an expert: 128 experts' f32
 * blocks of the whole inner dimension would take 2.5 times the q8_0 weights' memory. Of that
 * clffn_scratch (gemm.h) only the buffer and its size are used here. Kernel arguments are
 * state: one owner, one thread at a time. The scratch follows clffn_scratch's
 * plan-then-reserve (wk's own planned): while planning, the products only record what they need
 * and build what they will run, so a failing allocation or build happens before any output is
 * written. */
typedef struct clffn_wkernels {
    clffn_dtype dtype;
    size_t shapes[CLFFN_WGEMV_PARAMS]; /* the context's shapes the kernels were made with */
    cl_kernel rows[CLFFN_WTOKEN_BUCKETS], rows2[CLFFN_WTOKEN_BUCKETS], rows4[CLFFN_WTOKEN_BUCKETS];
    cl_kernel rows3[CLFFN_WTOKEN_BUCKETS];
    /* clffn_wgemv_rows_ep, _act and _glu: the epilogues applied as the sums are written */
    cl_kernel rows_ep[CLFFN_WTOKEN_BUCKETS], rows_act[CLFFN_WTOKEN_BUCKETS];
    cl_kernel rows_glu[CLFFN_WTOKEN_BUCKETS];
    cl_kernel cols[CLFFN_WTOKEN_BUCKETS]; /* clffn_wgemv_cols, or _strip on a CPU unsplit */
    /* quantized inputs: clffn_xquant, clffn_wgemv_rows_qx */
    cl_kernel xquant[CLFFN_WTOKEN_BUCKETS], rows_qx[CLFFN_WTOKEN_BUCKETS];
    /* clffn_wgemv_sum, clffn_wdequant and its transposing forms _t and _tl */
    cl_kernel sum, dequant, dequant_t, dequant_tl;
    int tl_fits; /* dequant_tl runs its work-group on the device: 1, 2 it does not, 0 not asked */
    clffn_scratch own;
    clffn_scratch *shared; /* NULL: own; else not the owner's to release */
    int planning;
    size_t planned;
} clffn_wkernels;

/* The scratch wk's products use. */
static inline clffn_scratch *clffn__wscratch(clffn_wkernels *wk) {
    return wk->shared ? wk->shared : &wk->own;
}

/* y[T, w.rows] = x[T, w.cols]·Wᵀ (+ β·y) when along_rows, else y[T, w.cols] = x[T, w.rows]·W
 * (+ β·y), for T ≤ CLFFN_MAX_KERNEL_TOKENS, each weight read once; with count (NULL: none),
 * only its first rows of the T, the others of y untouched. The kernels are those built for
 * max(T, capacity) tokens: their vectors and unrolling follow the tokens they are built for, so
 * a pass of T rows sums as a pass of capacity tokens (with a count of T) does. Past
 * CLFFN_MAX_KERNEL_TOKENS (no count), in passes of that many, each as built for a full pass:
 * along the rows all in one launch, else a launch each. On a CPU device
 * rows go several at a time where x reaches the context's row_group_cols floats (the profile's
 * "WGEMV_ROW_GROUP_COLS"); the column form runs in chunks of rows whose sums meet in the scratch
 * (CLFFN_WCOL_CHUNK_ROWS rows on a CPU, enough chunks to fill a GPU). Along the rows of q8_0 or
 * q4_0 weights, where the context asks for quantized inputs, x's rows are first rounded to q8_0
 * blocks in the scratch and the products run in integers.
 * While planning, only builds the kernels and records the scratch. */
cl_int clffn__wgemv(clffn_wkernels *wk, const clffn_context *ctx, const clffn_wmatrix *w,
                    bool along_rows, size_t tokens, size_t capacity, const clffn_wcount *count,
                    clffn_matrix x, float beta, clffn_matrix y, cl_command_queue queue);

/* Whether the context rounds the inputs of products along the rows of dtype's weights first
 * (clffn_context_set_quantized_inputs): q8_0, q4_0 and bf16 weights where it asks for it. */
bool clffn__quantizes_inputs(const clffn_context *ctx, clffn_dtype dtype);

/* The epilogue a product along W's rows applies as it writes y (cl/weights.cl,
 * clffn_wgemv_rows_ep, _act, _glu), so that it takes no launch of its own: flags CLFFN_EP_*
 * (clffn_defs.h), act a clffn_activation; with CLFFN_EP_PAIRS, W's first pair rows are W1's and
 * V's as many lie v_offset bytes into v (after W1's in W's buffer when stacked; y then has
 * 2·pair columns, V's after W1's); h the first epilogue's output [T, pair or W's rows], b and
 * bg the biases (any buffer where their flag is off). A grouped launch's expert e takes h
 * e·h_stride floats on and its biases e·bias_stride, its V as its W. */
typedef struct clffn_wepi {
    cl_uint flags, act;
    size_t pair;
    cl_mem v;
    size_t v_offset;
    clffn_matrix h;
    clffn_buffer b, bg;
    cl_ulong bias_stride, h_stride;
} clffn_wepi;

/* Whether clffn__wgemv_ep can run a product over w's rows for `tokens` (kernels built for
 * max(tokens, capacity)), with pairs or without: where clffn__wgemv would run it one row a
 * work-item or a work-group's lanes a row (not rows several to a work-item, nor quantized
 * inputs), and for pairs with an even number of rows a work-group. */
bool clffn__wgemv_takes_ep(const clffn_context *ctx, const clffn_wmatrix *w, size_t tokens,
                           size_t capacity, bool pairs);

/* y[T, w.rows] = x[T, w.cols]·Wᵀ with ep applied as it is written (see clffn_wepi), as
 * clffn__wgemv along the rows with β 0 otherwise, where clffn__wgemv_takes_ep says so (else
 * CLFFN_ERROR_INVALID_ARGUMENT); event (NULL: none) receives the one launch's event. */
cl_int clffn__wgemv_ep(clffn_wkernels *wk, const clffn_context *ctx, const clffn_wmatrix *w,
                       size_t tokens, size_t capacity, const clffn_wcount *count, clffn_matrix x,
                       clffn_matrix y, const clffn_wepi *ep, cl_command_queue queue,
                       cl_event *event);

/* The f32 block W[r0 .. r0 + nr, c0 .. c0 + nc) into the owner's scratch, enqueued on queue:
 * *out is the block as a row-major operand, [nr, nc] (ld = nc), or transposed, [nc, nr]
 * (ld = nr). While planning, records the scratch it needs and builds the kernel. c0 and nc are
 * multiples of 32 for the quantized types. */
cl_int clffn__wdequant(clffn_wkernels *wk, const clffn_context *ctx, const clffn_wmatrix *w,
                       size_t r0, size_t nr, size_t c0, size_t nc, bool transposed,
                       cl_command_queue queue, clffn_matrix *out);

/* Starts recording (see clffn_wkernels), and stops it, growing the scratch to what was recorded
 * (the old one released once what queue holds is done with it): CL_SUCCESS or the allocation's
 * error, the old scratch kept. */
void clffn__wkernels_plan(clffn_wkernels *wk);
cl_int clffn__wkernels_reserve(clffn_wkernels *wk, const clffn_context *ctx,
                               cl_command_queue queue);

/* Releases the kernels and its own scratch; the struct is empty after. */
void clffn__wkernels_release(clffn_wkernels *wk);

#endif
