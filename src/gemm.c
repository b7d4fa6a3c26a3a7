/* The one SGEMM path (see gemm.h): column-major calls, K-blocks, scratch. */
#include "gemm.h"

#include "launch.h"
#include "program.h"

#include <clblast_c.h>

size_t clffn_gemm_k_split(size_t k, size_t k_block, size_t *block) {
    size_t dummy;
    if (!block) { block = &dummy; }
    /* as many blocks as fit whole: each is at least k_block long, so a remainder is spread over
     * them instead of becoming a short, poorly used last block (640 in blocks of 256 is two
     * of 320, not 256 + 256 + 128) */
    size_t n = k_block ? k / k_block : 1;
    if (n < 2) {
        *block = k;
        return 1;
    }
    /* equal blocks, each a multiple of 64 (a multiple of every KWG CLBlast tunes) so that no
     * block but the last is padded */
    size_t b = (k + n - 1) / n;
    b = (b + 63) / 64 * 64;
    n = (k + b - 1) / b;
    *block = n > 1 ? b : k; /* small blocks may round up to one */
    return n;
}

void clffn__scratch_release(clffn_scratch *scratch) {
    /* commands still queued on it keep it alive: OpenCL releases it when they complete */
    if (scratch->mem) { clReleaseMemObject(scratch->mem); }
    scratch->mem = NULL;
    scratch->bytes = 0;
}

void clffn__scratch_plan(clffn_scratch *scratch) {
    scratch->planning = 1;
    scratch->planned = 0;
}

/* A larger buffer replaces the old one, which earlier products on queue may still be using. */
static cl_int scratch_grow(const clffn_context *ctx, clffn_scratch *scratch, size_t need,
                           cl_command_queue queue) {
    if (need <= scratch->bytes) { return CL_SUCCESS; }
    cl_int err;
    cl_mem t = clffn__buffer(ctx, CL_MEM_READ_WRITE, need, &err);
    if (err != CL_SUCCESS) { return err; }
    clffn__release_when_done(queue, scratch->mem);
    scratch->mem = t;
    scratch->bytes = need;
    return CL_SUCCESS;
}

cl_int clffn__scratch_reserve(const clffn_context *ctx, clffn_scratch *scratch,
                              cl_command_queue queue) {
    scratch->planning = 0;
    return scratch_grow(ctx, scratch, scratch->planned, queue);
}

static CLBlastTranspose blas_transpose(clffn_transpose t) {
    return t == CLFFN_TRANS ? CLBlastTransposeYes : CLBlastTransposeNo;
}

/* Block j of op along K: where it starts in A and B, and how long it is. K runs along a row of
 * a row-major A unless it is transposed, and down the rows of B unless it is transposed. */
typedef struct k_block {
    size_t a_off, b_off, len;
} k_block;

static k_block block_of(const clffn_gemm_op *op, size_t kb, size_t j) {
    const size_t k0 = j * kb;
    const size_t a_step = op->ta == CLFFN_NO_TRANS ? 1 : op->a.ld;
    const size_t b_step = op->tb == CLFFN_NO_TRANS ? op->b.ld : 1;
    const k_block b = {op->a.off + k0 * a_step, op->b.off + k0 * b_step,
                       op->k - k0 < kb ? op->k - k0 : kb};
    return b;
}

/* Row i of C = α·op(B)ᵀ·(row i of A) + β·(row i of C), one CLBlastSgemv per row, for few rows
 * (small batches, decoding): a GEMM pads the rows (tokens) to a whole tile, a GEMV pads
 * nothing and reads B once per row. Column-major, B [k,n] row-major is [n,k] with leading
 * dimension b.ld, so c_i = that·a_i as it is stored (CLBlast's XgemvFast: consecutive work-items
 * read consecutive floats); B [n,k] (tb) is [k,n], used transposed (XgemvFastRot, which goes
 * through local memory and is about half as fast on POCL). Both fast kernels need B at offset
 * 0, which an FFN's own weights are. CLBlast's GEMV computes α·acc + β·y even for β = 0, so a
 * NaN left in y (a reused workspace, fresh memory) would survive: BLAS says y is not read then,
 * and zeroing it first is one pass over the output, small beside one over the weights. */
static cl_int gemv_rows(const clffn_context *ctx, const clffn_gemm_op *op, cl_command_queue *queue,
                        cl_event *event) {
    const int t = op->tb == CLFFN_TRANS;
    cl_int err = CL_SUCCESS;
    for (size_t i = 0; op->beta == 0.0f && i < op->m && err == CL_SUCCESS; ++i) {
        const size_t rows = op->c.ld == op->n ? op->m : 1; /* contiguous rows: one kernel */
        err = clffn__zero_floats(&ctx->programs, *queue, op->c.mem, op->c.off + i * op->c.ld,
                                 rows * op->n);
        if (rows > 1) { break; }
    }
    for (size_t i = 0; i < op->m && err == CL_SUCCESS; ++i) {
        err = CLBlastSgemv(CLBlastLayoutColMajor, t ? CLBlastTransposeYes : CLBlastTransposeNo,
                           t ? op->k : op->n, t ? op->n : op->k, op->alpha, op->b.mem, op->b.off,
                           op->b.ld, op->a.mem, op->a.off + i * op->a.ld, 1, op->beta, op->c.mem,
                           op->c.off + i * op->c.ld, 1, queue, i + 1 == op->m ? event : NULL);
    }
    return err;
}

/* Called column-major: C = A·B row-major is Cᵀ = Bᵀ·Aᵀ column-major over the same memory, so
 * CLBlast's A is our B and its m is our n. CLBlast's Xgemm computes a column-major C, so for a
 * row-major one it transposes C into scratch and back on every call (c_do_transpose in its
 * xgemm.cpp); asked column-major it does neither: every product ~25% faster on POCL.
 * CLBlast's Xgemm also walks the whole inner dimension for each tile of C; on a CPU a long K
 * streams operand panels that no longer fit in cache. Summing K-blocks into C costs one more
 * pass over C per block and can be much faster (docs/PERFORMANCE.md). */
static cl_int sgemm_blocks(const clffn_context *ctx, clffn_scratch *scratch,
                           const clffn_gemm_op *op, cl_command_queue *queue, cl_event *event) {
    const CLBlastLayout L = CLBlastLayoutColMajor;
    const CLBlastTranspose ta = blas_transpose(op->ta), tb = blas_transpose(op->tb);
    /* few token rows: the operand panels fit in cache anyway, and each block's extra CLBlast
     * call (with its copy kernels) costs more than it saves */
    const size_t block = op->m >= ctx->gemm_k_block_min_rows ? ctx->gemm_k_block : 0;
    size_t kb;
    const size_t blocks = clffn_gemm_k_split(op->k, block, &kb);
    size_t need = 0;
    cl_int err = CL_SUCCESS;
    for (size_t j = 0; scratch && j < blocks && err == CL_SUCCESS; ++j) {
        const k_block b = block_of(op, kb, j);
        size_t nj = 0;
        err = CLBlastSGemmTempBufferSize(L, tb, ta, op->n, op->m, b.len, b.b_off, op->b.ld, b.a_off,
                                         op->a.ld, op->c.off, op->c.ld, queue, &nj);
        if (nj > need) { need = nj; }
    }
    if (scratch && scratch->planning) {
        if (need > scratch->planned) { scratch->planned = need; }
        return err;
    }
    if (scratch && err == CL_SUCCESS) { err = scratch_grow(ctx, scratch, need, *queue); }
    for (size_t j = 0; j < blocks && err == CL_SUCCESS; ++j) {
        const k_block b = block_of(op, kb, j);
        err = CLBlastSgemmWithTempBuffer(
            L, tb, ta, op->n, op->m, b.len, op->alpha, op->b.mem, b.b_off, op->b.ld, op->a.mem,
            b.a_off, op->a.ld, j ? 1.0f : op->beta, op->c.mem, op->c.off, op->c.ld, queue,
            j + 1 == blocks ? event : NULL, need ? scratch->mem : NULL);
    }
    return err;
}

cl_int clffn__sgemm(const clffn_context *ctx, clffn_scratch *scratch, const clffn_gemm_op *op,
                    cl_command_queue *queue, cl_event *event) {
    if (op->ta == CLFFN_NO_TRANS && op->m <= ctx->gemv_max_tokens && op->m > 0) {
        return scratch && scratch->planning ? CL_SUCCESS : gemv_rows(ctx, op, queue, event);
    }
    /* The set goes by the product's token count: its rows, or its inner dimension for a
     * transposed A (the weight gradients), so that every product of one pass wants the same set
     * and nothing switches within it (switching per product made the backward at 16 tokens
     * 1.4x slower on POCL). The scratch a product needs depends on the tile, so it is planned
     * under the same set. */
    const size_t tokens = op->ta == CLFFN_TRANS ? op->k : op->m;
    const clffn_xgemm_set *set = tokens < ctx->xgemm_few_rows ? &ctx->xgemm_few : &ctx->xgemm;
    if (!set->have) { return sgemm_blocks(ctx, scratch, op, queue, event); }
    clffn_xgemm_hold *held = NULL;
    cl_int err = (cl_int)clffn__xgemm_hold(ctx->device, set, &held);
    if (err == CL_SUCCESS) { err = sgemm_blocks(ctx, scratch, op, queue, event); }
    clffn__xgemm_release(held);
    return err;
}

clffn_status clffn_sgemm(const clffn_context *ctx, clffn_transpose trans_a, clffn_transpose trans_b,
                         size_t m, size_t n, size_t k, float alpha, cl_mem a, size_t a_off,
                         size_t a_ld, cl_mem b, size_t b_off, size_t b_ld, float beta, cl_mem c,
                         size_t c_off, size_t c_ld, cl_command_queue queue, cl_event *event) {
    if (!ctx || !a || !b || !c || !queue) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if ((trans_a != CLFFN_NO_TRANS && trans_a != CLFFN_TRANS) ||
        (trans_b != CLFFN_NO_TRANS && trans_b != CLFFN_TRANS)) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    const clffn_status st = clffn__check_queue(ctx, queue);
    if (st != CLFFN_SUCCESS) { return st; }
    const clffn_gemm_op op = {
        trans_a,          trans_b,         m, n, k, alpha, beta, {a, a_off, a_ld},
        {b, b_off, b_ld}, {c, c_off, c_ld}};
    return (clffn_status)clffn__sgemm(ctx, NULL, &op, &queue, event);
}
