/* clffn's own kernels over weights in their stored type (see wmatrix.h, cl/weights.cl). */
#include "wmatrix.h"

#include "clffn_defs.h"
#include "dtype.h"
#include "launch.h"

#include <string.h>

static const size_t bucket_tokens[CLFFN_WTOKEN_BUCKETS] = {1, 2, 4, 8, 16};

void clffn__wkernels_release(clffn_wkernels *wk) {
    for (int b = 0; b < CLFFN_WTOKEN_BUCKETS; ++b) {
        if (wk->rows[b]) { clReleaseKernel(wk->rows[b]); }
        if (wk->rows2[b]) { clReleaseKernel(wk->rows2[b]); }
        if (wk->rows3[b]) { clReleaseKernel(wk->rows3[b]); }
        if (wk->rows4[b]) { clReleaseKernel(wk->rows4[b]); }
        if (wk->rows_ep[b]) { clReleaseKernel(wk->rows_ep[b]); }
        if (wk->rows_glu[b]) { clReleaseKernel(wk->rows_glu[b]); }
        if (wk->rows_act[b]) { clReleaseKernel(wk->rows_act[b]); }
        if (wk->cols[b]) { clReleaseKernel(wk->cols[b]); }
        if (wk->xquant[b]) { clReleaseKernel(wk->xquant[b]); }
        if (wk->rows_qx[b]) { clReleaseKernel(wk->rows_qx[b]); }
    }
    if (wk->sum) { clReleaseKernel(wk->sum); }
    if (wk->dequant) { clReleaseKernel(wk->dequant); }
    if (wk->dequant_t) { clReleaseKernel(wk->dequant_t); }
    if (wk->dequant_tl) { clReleaseKernel(wk->dequant_tl); }
    clffn__scratch_release(&wk->own);
    memset(wk, 0, sizeof *wk);
}

/* The kernels made for another type or other shapes go: what is asked for next is made anew. */
static void refresh(clffn_wkernels *wk, const clffn_context *ctx, clffn_dtype dtype) {
    if (wk->dtype == dtype && !memcmp(wk->shapes, ctx->wgemv, sizeof wk->shapes)) { return; }
    const clffn_scratch own = wk->own;
    clffn_scratch *shared = wk->shared;
    const size_t planned = wk->planned;
    const int planning = wk->planning;
    wk->own.mem = NULL;
    clffn__wkernels_release(wk);
    wk->own = own, wk->shared = shared;
    wk->planned = planned, wk->planning = planning;
    wk->dtype = dtype;
    memcpy(wk->shapes, ctx->wgemv, sizeof wk->shapes);
}

/* *slot, made from the weight program for (dtype, tokens) if it is not yet. */
static cl_int kernel_for(const clffn_context *ctx, clffn_dtype dtype, size_t tokens,
                         const char *name, cl_kernel *slot) {
    if (*slot) { return CL_SUCCESS; }
    const size_t *p = ctx->wgemv;
    const clffn_program_key key = {
        .activation = CLFFN_ACT_IDENTITY,
        .weights = 1 + (int)dtype,
        .tokens = (int)tokens,
        .wgemv = {(int)p[0], (int)p[1], (int)p[2], (int)p[3], (int)p[4]}};
    cl_program prog;
    /* the program cache is the context's mutable state behind its lock (program.h) */
    const clffn_status st = clffn__get_program((clffn_programs *)&ctx->programs, &key, &prog);
    if (st != CLFFN_SUCCESS) { return (cl_int)st; }
    cl_int err;
    *slot = clCreateKernel(prog, name, &err);
    return err;
}

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

/* The buffer a launch reads its experts' list from (cl/weights.cl, CLFFN_GROUP_EXPERT): the
 * counts', or without them `other`, one the launch reads anyway (its one value read unused). */
static cl_mem ids_of(const clffn_wcount *count, cl_mem other) {
    return count->mem ? count->mem : other;
}

/* A launch of one product, its token count the host's. */
static const clffn_wcount no_count = {NULL, 0, 0, 0, 0, 0, 0, 0};

/* The experts a launch runs (the third dimension), 1 but for a grouped one. */
static size_t groups_of(const clffn_wcount *count) { return count->groups ? count->groups : 1; }

/* kernel over global[0] × global[1] (local NULL: an element-wise one) × the count's groups. */
static cl_int enqueue_grouped(const clffn_context *ctx, cl_command_queue queue, cl_kernel kernel,
                              const clffn_wcount *count, const size_t global[2],
                              const size_t local[2]) {
    const size_t g[3] = {global[0], global[1], groups_of(count)};
    if (!local) { return clffn__enqueue_items(&ctx->programs, queue, kernel, 3, g, NULL); }
    const size_t l[3] = {local[0], local[1], 1};
    return clEnqueueNDRangeKernel(queue, kernel, 3, NULL, g, l, 0, NULL, NULL);
}

static cl_mem scratch_of(clffn_wkernels *wk) { return clffn__wscratch(wk)->mem; }

/* The scratch need recorded while planning; past it, whether it was recorded. */
static cl_int need_scratch(clffn_wkernels *wk, size_t bytes) {
    if (wk->planning) {
        if (bytes > wk->planned) { wk->planned = bytes; }
        return CL_SUCCESS;
    }
    return bytes > clffn__wscratch(wk)->bytes ? CL_INVALID_BUFFER_SIZE /* not planned: a bug */
                                              : CL_SUCCESS;
}

/* y = β·y + the chunks' sums in the scratch (chunks × tokens × cols). */
static cl_int enqueue_sum(clffn_wkernels *wk, const clffn_context *ctx, clffn_dtype dtype,
                          size_t chunks, size_t tokens, const clffn_wcount *count, size_t cols,
                          float beta, clffn_matrix y, cl_command_queue queue) {
    cl_int err = kernel_for(ctx, dtype, 1, "clffn_wgemv_sum", &wk->sum);
    if (err != CL_SUCCESS || wk->planning) { return err; }
    const cl_ulong K = chunks, C = cols, y_off = y.off, ldy = y.ld;
    const cl_uint t = (cl_uint)tokens;
    const cl_ulong8 grp = {
        {0, 0, count->y_stride, chunks * tokens * cols, count->ids_at, 0, 0, count->experts_at}};
    const cl_mem scratch = scratch_of(wk);
    clffn_args a = clffn__args(wk->sum);
    CLFFN_ARG(a, scratch), CLFFN_ARG(a, K), CLFFN_ARG(a, t), CLFFN_ARG(a, count->mem);
    CLFFN_ARG(a, count->at), CLFFN_ARG(a, C);
    CLFFN_ARG(a, y.mem), CLFFN_ARG(a, y_off), CLFFN_ARG(a, ldy), CLFFN_ARG(a, beta);
    const cl_mem ids = ids_of(count, scratch);
    CLFFN_ARG(a, ids), CLFFN_ARG(a, grp);
    if ((err = clffn__args_end(&a)) != CL_SUCCESS) { return err; }
    const size_t global[2] = {cols, tokens};
    return enqueue_grouped(ctx, queue, wk->sum, count, global, NULL);
}

/* Rows per chunk of the column GEMV. On a CPU, CLFFN_WCOL_CHUNK_ROWS. On a GPU, as many chunks
 * as give the device some CLFFN_WCOL_GPU_GROUPS work-groups per compute unit: a product with few
 * columns (4096 outputs: 64 work-groups of 8 column groups) would leave most of a large GPU idle,
 * each work-item walking thousands of rows; chunks of at least CLFFN_WCOL_GPU_MIN_ROWS rows keep
 * the partial sums' traffic small beside the weights'. */
static size_t col_chunk_rows(const clffn_context *ctx, const clffn_wmatrix *w, size_t width) {
    if (ctx->cpu) { return CLFFN_WCOL_CHUNK_ROWS; }
    const size_t groups = ((w->cols + width - 1) / width + ctx->wgemv[4] - 1) / ctx->wgemv[4];
    const size_t want = (size_t)ctx->compute_units * CLFFN_WCOL_GPU_GROUPS;
    size_t chunks = groups < want ? (want + groups - 1) / groups : 1;
    const size_t most = w->rows / CLFFN_WCOL_GPU_MIN_ROWS;
    if (chunks > most) { chunks = most > 1 ? most : 1; }
    return (w->rows + chunks - 1) / chunks;
}

/* y = x̃·Wᵀ (+ β·y) with x̃ x's rows rounded to the weights' dot-product type (clffn_xquant,
 * into the scratch): q8_0 blocks for q8_0 and q4_0 weights, bf16 for bf16 ones; then
 * clffn_wgemv_rows_qx along the weights' rows, in the rows kernel's shape (a row's lanes side
 * by side on a GPU; on a CPU one row a work-item, or several: CLFFN_BX_ROWS, CLFFN_QX_WIDE). */
static cl_int wgemv_quantized_inputs(clffn_wkernels *wk, const clffn_context *ctx,
                                     const clffn_wmatrix *w, int b, size_t tokens,
                                     const clffn_wcount *count, clffn_matrix x, float beta,
                                     clffn_matrix y, cl_command_queue queue) {
    const bool bf16 = w->dtype == CLFFN_DTYPE_BF16;
    const size_t split = ctx->wgemv[0], group = ctx->wgemv[1];
    const bool q4_0 = w->dtype == CLFFN_DTYPE_Q4_0;
    const bool wide = !bf16 && CLFFN_QX_WIDE(split, bucket_tokens[b], q4_0);
    const size_t blocks = w->cols / 32, pairs = (blocks + 1) / 2;
    /* the rows end in their offset sums for q4_0 at one token and in the 16-row form
     * (CLFFN_XQ_C) */
    const int c = (q4_0 && bucket_tokens[b] == 1) || wide;
    const size_t xs = bf16 ? CLFFN_XB_BYTES(w->cols)
                           : CLFFN_XQ_BYTES(blocks) + (c ? (8 * pairs + 63) / 64 * 64 : 0);
    cl_int err = kernel_for(ctx, w->dtype, bucket_tokens[b], "clffn_xquant", &wk->xquant[b]);
    if (err == CL_SUCCESS) {
        err = kernel_for(ctx, w->dtype, bucket_tokens[b], "clffn_wgemv_rows_qx", &wk->rows_qx[b]);
    }
    /* the 16-row form's are block-major, a slot for each of the program's tokens */
    const size_t per_group = (wide ? bucket_tokens[b] : tokens) * xs;
    /* a grouped launch whose steps all read one x (a token's experts reading it where it lies)
     * rounds it once, every token (a step's count only shortens what it reads), and each step
     * reads that copy: one block a work-item, not one a step */
    const bool one_x = groups_of(count) > 1 && count->x_stride == 0;
    const clffn_wcount *qc = one_x ? &no_count : count;
    if (err == CL_SUCCESS) { err = need_scratch(wk, groups_of(qc) * per_group); }
    if (err != CL_SUCCESS || wk->planning) { return err; }
    const cl_ulong x_off = x.off, ldx = x.ld, cols = w->cols, XS = xs;
    const cl_uint t = (cl_uint)tokens;
    const cl_mem scratch = scratch_of(wk);
    clffn_args a = clffn__args(wk->xquant[b]);
    CLFFN_ARG(a, x.mem), CLFFN_ARG(a, x_off), CLFFN_ARG(a, ldx), CLFFN_ARG(a, cols);
    CLFFN_ARG(a, t), CLFFN_ARG(a, qc->mem), CLFFN_ARG(a, qc->at);
    CLFFN_ARG(a, scratch), CLFFN_ARG(a, XS);
    const cl_ulong8 qgrp = {{0, qc->x_stride, per_group, 0, qc->ids_at, 0, 0, qc->experts_at}};
    const cl_mem xids = ids_of(qc, x.mem);
    CLFFN_ARG(a, xids), CLFFN_ARG(a, qgrp);
    if ((err = clffn__args_end(&a)) != CL_SUCCESS) { return err; }
    const size_t qglobal[2] = {bf16 ? (w->cols + 31) / 32 : 2 * pairs, tokens};
    err = enqueue_grouped(ctx, queue, wk->xquant[b], qc, qglobal, NULL);
    if (err != CL_SUCCESS) { return err; }
    const cl_ulong w_off = w->offset, row_bytes = w->row_bytes, rows = w->rows;
    const cl_ulong y_off = y.off, ldy = y.ld;
    a = clffn__args(wk->rows_qx[b]);
    CLFFN_ARG(a, w->mem), CLFFN_ARG(a, w_off), CLFFN_ARG(a, row_bytes), CLFFN_ARG(a, rows);
    CLFFN_ARG(a, cols), CLFFN_ARG(a, scratch), CLFFN_ARG(a, XS), CLFFN_ARG(a, t);
    CLFFN_ARG(a, count->mem), CLFFN_ARG(a, count->at), CLFFN_ARG(a, y.mem), CLFFN_ARG(a, y_off);
    CLFFN_ARG(a, ldy), CLFFN_ARG(a, beta);
    const cl_ulong8 grp = {{count->w_stride, one_x ? 0 : per_group, count->y_stride, 0,
                            count->ids_at, 0, 0, count->experts_at}};
    const cl_mem ids = ids_of(count, w->mem);
    CLFFN_ARG(a, ids), CLFFN_ARG(a, grp);
    if ((err = clffn__args_end(&a)) != CL_SUCCESS) { return err; }
    const size_t per_item = wide                 ? CLFFN_QX_WIDE_ROWS
                            : bf16 && split == 1 ? CLFFN_BX_ROWS(bucket_tokens[b])
                                                 : 1; /* rows a work-item */
    const size_t items = (w->rows + per_item - 1) / per_item;
    const size_t global[2] = {split, round_up(items, group)}, local[2] = {split, group};
    return enqueue_grouped(ctx, queue, wk->rows_qx[b], count, global, local);
}

/* The GEMV kernels' first arguments (cl/weights.cl's CLFFN_ROWS_PARAMS; the column kernels
 * take the same): W, x, the pass's tokens and their count on the device, and y. */
static void head_args(clffn_args *a, const clffn_wmatrix *w, clffn_matrix x, size_t tokens,
                      const clffn_wcount *count, clffn_matrix y) {
    const cl_ulong w_off = w->offset, row_bytes = w->row_bytes, rows = w->rows, cols = w->cols;
    const cl_ulong x_off = x.off, ldx = x.ld, y_off = y.off, ldy = y.ld;
    const cl_uint t = (cl_uint)tokens;
    CLFFN_ARG(*a, w->mem), CLFFN_ARG(*a, w_off), CLFFN_ARG(*a, row_bytes), CLFFN_ARG(*a, rows);
    CLFFN_ARG(*a, cols), CLFFN_ARG(*a, x.mem), CLFFN_ARG(*a, x_off), CLFFN_ARG(*a, ldx);
    CLFFN_ARG(*a, t), CLFFN_ARG(*a, count->mem), CLFFN_ARG(*a, count->at), CLFFN_ARG(*a, y.mem);
    CLFFN_ARG(*a, y_off), CLFFN_ARG(*a, ldy);
}

/* The bucket of kernels built for max(tokens, capacity), or -1 where none holds them. */
static int bucket_of(size_t tokens, size_t capacity) {
    const size_t built_for = capacity > tokens ? capacity : tokens;
    int b = 0;
    while (b + 1 < CLFFN_WTOKEN_BUCKETS && bucket_tokens[b] < built_for) { ++b; }
    return built_for > bucket_tokens[b] ? -1 : b;
}

bool clffn__quantizes_inputs(const clffn_context *ctx, clffn_dtype dtype) {
    return ctx->quantized_inputs &&
           (dtype == CLFFN_DTYPE_Q8_0 || dtype == CLFFN_DTYPE_Q4_0 || dtype == CLFFN_DTYPE_BF16);
}

/* Rows a work-item of a product along w's rows takes (bucket b). Rows go several to a
 * work-item where the pass's x (cols values for each token) has at least the context's
 * row_group_cols floats: each vector of x read then serves every row. In fours up to 4 tokens,
 * where a core streaming four rows reads faster than with one or two on hosts whose memory
 * outpaces a core; from 8 tokens f32, f16 and bf16 rows in threes with the direct sums (the
 * programs' row_direct), whose sums for 8 tokens a part fill AVX-512's registers, else in twos:
 * on an Intel Xeon, 4096 -> 11008 SwiGLU in f16 and bf16, 8 tokens 16-22% and 16 tokens 8-14%
 * faster in threes than in twos. The quantized types, whose decoding takes more registers, keep
 * twos: q8_0 gained 2-14% there but lost 5-7% in the 8-expert layer at 512 tokens (1024 ->
 * 2816); q4_0 was level at 8 tokens, 8% slower at 64 and from 3% faster to 19% slower at 16.
 * Where x fits the first-level cache it depends on the host: on an AMD EPYC one row a work-item
 * read fastest (4096 -> 11008 SwiGLU, one token: f16 6.6-6.7 ms with W1's rows in fours,
 * 5.7-6.0 one by one; q4_0 at 4 tokens, x 64 KB, 12.8-13.1 ms one by one, 8.7-8.8 in fours), on
 * an Intel Xeon four (f16 13.4-13.5 ms one by one, 9.9-10.3 in fours; docs/PERFORMANCE.md). */
static size_t rows_per_item(const clffn_context *ctx, const clffn_wmatrix *w, int b) {
    const bool several =
        ctx->cpu && ctx->wgemv[0] == 1 && w->cols * bucket_tokens[b] >= ctx->row_group_cols;
    if (!several) { return 1; }
    if (bucket_tokens[b] <= 4) { return 4; }
    const bool threes =
        bucket_tokens[b] >= 8 && ctx->programs.row_direct && !clffn__dtype_quantized(w->dtype);
    return threes ? 3 : 2;
}

/* clffn__wgemv over more tokens than a pass takes, where the kernels do not take the passes in
 * one launch (the column kernels, and quantized inputs): passes of CLFFN_MAX_KERNEL_TOKENS rows,
 * each reading the weights once, all as built for a full pass, so that a row sums alike in every
 * pass, the last one's too. The passes share the scratch: the queue runs them in turn. */
static cl_int wgemv_passes(clffn_wkernels *wk, const clffn_context *ctx, const clffn_wmatrix *w,
                           bool along_rows, size_t tokens, clffn_matrix x, float beta,
                           clffn_matrix y, cl_command_queue queue) {
    const size_t pass = CLFFN_MAX_KERNEL_TOKENS;
    cl_int err = CL_SUCCESS;
    for (size_t t0 = 0; t0 < tokens && err == CL_SUCCESS; t0 += pass) {
        const size_t n = tokens - t0 < pass ? tokens - t0 : pass;
        const clffn_matrix xp = {x.mem, x.off + t0 * x.ld, x.ld};
        const clffn_matrix yp = {y.mem, y.off + t0 * y.ld, y.ld};
        err = clffn__wgemv(wk, ctx, w, along_rows, n, pass, NULL, xp, beta, yp, queue);
        if (wk->planning) { break; } /* every pass needs what the first does */
    }
    return err;
}

cl_int clffn__wgemv(clffn_wkernels *wk, const clffn_context *ctx, const clffn_wmatrix *w,
                    bool along_rows, size_t tokens, size_t capacity, const clffn_wcount *count,
                    clffn_matrix x, float beta, clffn_matrix y, cl_command_queue queue) {
    const bool qx = along_rows && clffn__quantizes_inputs(ctx, w->dtype);
    /* the row kernels take every pass in one launch (cl/weights.cl, CLFFN_ROW_PASS_TOKENS);
     * their token count is a cl_uint */
    const size_t passes =
        along_rows && !qx && !count && tokens > CLFFN_MAX_KERNEL_TOKENS && tokens <= CL_UINT_MAX
            ? (tokens + CLFFN_MAX_KERNEL_TOKENS - 1) / CLFFN_MAX_KERNEL_TOKENS
            : 1;
    if (tokens > CLFFN_MAX_KERNEL_TOKENS && !count && passes == 1) {
        return wgemv_passes(wk, ctx, w, along_rows, tokens, x, beta, y, queue);
    }
    if (!count) { count = &no_count; }
    refresh(wk, ctx, w->dtype);
    const int b = passes > 1 ? CLFFN_WTOKEN_BUCKETS - 1 : bucket_of(tokens, capacity);
    if (b < 0) { return (cl_int)CLFFN_ERROR_INVALID_SIZE; }
    if (qx) { return wgemv_quantized_inputs(wk, ctx, w, b, tokens, count, x, beta, y, queue); }
    const size_t *p = ctx->wgemv;
    const size_t per_item = along_rows ? rows_per_item(ctx, w, b) : 1; /* rows a work-item */
    cl_kernel *slot = !along_rows     ? &wk->cols[b]
                      : per_item == 4 ? &wk->rows4[b]
                      : per_item == 3 ? &wk->rows3[b]
                      : per_item == 2 ? &wk->rows2[b]
                                      : &wk->rows[b];
    const bool strip = !along_rows && ctx->col_strips && p[3] == 1; /* clffn_wgemv_strip */
    const char *name = strip           ? "clffn_wgemv_strip"
                       : !along_rows   ? "clffn_wgemv_cols"
                       : per_item == 4 ? "clffn_wgemv_rows4"
                       : per_item == 3 ? "clffn_wgemv_rows3"
                       : per_item == 2 ? "clffn_wgemv_rows2"
                                       : "clffn_wgemv_rows";
    cl_int err = kernel_for(ctx, w->dtype, bucket_tokens[b], name, slot);
    const size_t width =
        strip ? CLFFN_WCOL_STRIP(bucket_tokens[b]) : CLFFN_WCOL_WIDTH(p[2], bucket_tokens[b]);
    const size_t chunk = along_rows ? w->rows : col_chunk_rows(ctx, w, width);
    const size_t chunks = w->rows ? (w->rows + chunk - 1) / chunk : 1;
    if (err == CL_SUCCESS && chunks > 1) {
        err = need_scratch(wk, groups_of(count) * chunks * tokens * w->cols * sizeof(float));
    }
    if (err != CL_SUCCESS || wk->planning) {
        return err == CL_SUCCESS && chunks > 1
                   ? enqueue_sum(wk, ctx, w->dtype, chunks, tokens, count, w->cols, beta, y, queue)
                   : err;
    }
    const cl_ulong chunk_rows = chunk;
    clffn_args a = clffn__args(*slot);
    head_args(&a, w, x, tokens, count, y);
    CLFFN_ARG(a, beta);
    const cl_mem part = chunks > 1 ? scratch_of(wk) : y.mem; /* one chunk: unread */
    if (!along_rows) { CLFFN_ARG(a, chunk_rows), CLFFN_ARG(a, part); }
    const cl_ulong8 grp = {{count->w_stride, count->x_stride, count->y_stride,
                            chunks * tokens * w->cols, count->ids_at, 0, 0, count->experts_at}};
    const cl_mem ids = ids_of(count, w->mem);
    CLFFN_ARG(a, ids), CLFFN_ARG(a, grp);
    if ((err = clffn__args_end(&a)) != CL_SUCCESS) { return err; }
    size_t global[2], local[2];
    if (along_rows) {
        local[0] = p[0], local[1] = p[1];
        /* the passes of a rows' group one after another (along the first dimension), where the
         * rows weigh more than x, else pass by pass (cl/weights.cl, CLFFN_ROW_PASS_TOKENS) */
        const size_t groups = round_up((w->rows + per_item - 1) / per_item, p[1]);
        const bool rows_first = !clffn__dtype_quantized(w->dtype);
        global[0] = p[0] * (rows_first ? passes : 1);
        global[1] = groups * (rows_first ? 1 : passes);
    } else if (strip) {
        local[0] = local[1] = 1;
        global[0] = (w->cols + width - 1) / width, global[1] = chunks;
    } else {
        local[0] = p[4], local[1] = p[3];
        global[0] = round_up((w->cols + width - 1) / width, p[4]), global[1] = p[3] * chunks;
    }
    err = enqueue_grouped(ctx, queue, *slot, count, global, local);
    if (err != CL_SUCCESS || chunks == 1) { return err; }
    return enqueue_sum(wk, ctx, w->dtype, chunks, tokens, count, w->cols, beta, y, queue);
}

bool clffn__wgemv_takes_ep(const clffn_context *ctx, const clffn_wmatrix *w, size_t tokens,
                           size_t capacity, bool pairs) {
    const int b = bucket_of(tokens, capacity);
    return b >= 0 && !clffn__quantizes_inputs(ctx, w->dtype) && rows_per_item(ctx, w, b) == 1 &&
           (!pairs || ctx->wgemv[1] % 2 == 0);
}

cl_int clffn__wgemv_ep(clffn_wkernels *wk, const clffn_context *ctx, const clffn_wmatrix *w,
                       size_t tokens, size_t capacity, const clffn_wcount *count, clffn_matrix x,
                       clffn_matrix y, const clffn_wepi *ep, cl_command_queue queue,
                       cl_event *event) {
    const bool pairs = (ep->flags & CLFFN_EP_PAIRS) != 0;
    if (!clffn__wgemv_takes_ep(ctx, w, tokens, capacity, pairs)) {
        return (cl_int)CLFFN_ERROR_INVALID_ARGUMENT;
    }
    if (!count) { count = &no_count; }
    refresh(wk, ctx, w->dtype);
    const int b = bucket_of(tokens, capacity);
    const bool hidden = (ep->flags & CLFFN_EP_HIDDEN) != 0;
    cl_kernel *slot = pairs ? &wk->rows_glu[b] : hidden ? &wk->rows_act[b] : &wk->rows_ep[b];
    const char *name = pairs    ? "clffn_wgemv_rows_glu"
                       : hidden ? "clffn_wgemv_rows_act"
                                : "clffn_wgemv_rows_ep";
    cl_int err = kernel_for(ctx, w->dtype, bucket_tokens[b], name, slot);
    if (err != CL_SUCCESS || wk->planning) { return err; }
    const cl_ulong h_off = ep->h.off, ldh = ep->h.ld, b_off = ep->b.offset, bg_off = ep->bg.offset;
    const cl_ulong pair = ep->pair;
    clffn_args a = clffn__args(*slot);
    head_args(&a, w, x, tokens, count, y);
    CLFFN_ARG(a, ep->h.mem), CLFFN_ARG(a, h_off), CLFFN_ARG(a, ldh);
    CLFFN_ARG(a, ep->b.mem), CLFFN_ARG(a, b_off), CLFFN_ARG(a, ep->bg.mem), CLFFN_ARG(a, bg_off);
    const cl_mem v = pairs ? ep->v : w->mem; /* unread without pairs */
    const cl_ulong v_off = pairs ? ep->v_offset : 0;
    CLFFN_ARG(a, ep->flags), CLFFN_ARG(a, ep->act), CLFFN_ARG(a, pair);
    CLFFN_ARG(a, v), CLFFN_ARG(a, v_off);
    const cl_ulong8 grp = {{count->w_stride, count->x_stride, count->y_stride, 0, count->ids_at,
                            ep->bias_stride, ep->h_stride, count->experts_at}};
    const cl_mem ids = ids_of(count, w->mem);
    CLFFN_ARG(a, ids), CLFFN_ARG(a, grp);
    if ((err = clffn__args_end(&a)) != CL_SUCCESS) { return err; }
    const size_t *p = ctx->wgemv;
    /* pairs: a work-group takes p[1] / 2 rows of W1 and as many of V */
    const size_t per_group = !pairs ? p[1] : p[1] / 2;
    const size_t groups = ((pairs ? ep->pair : w->rows) + per_group - 1) / per_group;
    const size_t g[3] = {p[0], groups * p[1], groups_of(count)}, l[3] = {p[0], p[1], 1};
    return clEnqueueNDRangeKernel(queue, *slot, 3, NULL, g, l, 0, NULL, event);
}

void clffn__wkernels_plan(clffn_wkernels *wk) {
    wk->planning = 1;
    wk->planned = 0;
}

cl_int clffn__wkernels_reserve(clffn_wkernels *wk, const clffn_context *ctx,
                               cl_command_queue queue) {
    wk->planning = 0;
    clffn_scratch *s = clffn__wscratch(wk);
    if (wk->planned <= s->bytes) { return CL_SUCCESS; }
    cl_int err;
    cl_mem m = clffn__buffer(ctx, CL_MEM_READ_WRITE, wk->planned, &err);
    if (err != CL_SUCCESS) { return err; }
    clffn__release_when_done(queue, s->mem);
    s->mem = m;
    s->bytes = wk->planned;
    return CL_SUCCESS;
}

cl_int clffn__wdequant(clffn_wkernels *wk, const clffn_context *ctx, const clffn_wmatrix *w,
                       size_t r0, size_t nr, size_t c0, size_t nc, bool transposed,
                       cl_command_queue queue, clffn_matrix *out) {
    refresh(wk, ctx, w->dtype);
    /* the local-memory form where the context takes it and the kernel runs its work-group,
     * asked once a kernel */
    static const size_t tl_local[2] = {CLFFN_WDEQUANT_TILE_COLS / 8, CLFFN_WDEQUANT_TILE_ROWS};
    bool tiles = transposed && ctx->dequant_tiles && ctx->max_wg >= tl_local[0] * tl_local[1] &&
                 wk->tl_fits != 2;
    cl_int err = CL_SUCCESS;
    if (tiles && !wk->tl_fits &&
        (err = kernel_for(ctx, w->dtype, 1, "clffn_wdequant_tl", &wk->dequant_tl)) == CL_SUCCESS) {
        size_t fits = 0;
        err = clGetKernelWorkGroupInfo(wk->dequant_tl, ctx->device, CL_KERNEL_WORK_GROUP_SIZE,
                                       sizeof fits, &fits, NULL);
        /* else registers ran short: the other form */
        wk->tl_fits = err != CL_SUCCESS ? 0 : fits >= tl_local[0] * tl_local[1] ? 1 : 2;
        tiles = wk->tl_fits == 1;
    }
    if (err != CL_SUCCESS) { return err; }
    cl_kernel *k = tiles ? &wk->dequant_tl : transposed ? &wk->dequant_t : &wk->dequant;
    if (!tiles) {
        err = kernel_for(ctx, w->dtype, 1, transposed ? "clffn_wdequant_t" : "clffn_wdequant", k);
    }
    const size_t bytes = nr * nc * sizeof(float);
    if (err == CL_SUCCESS) { err = need_scratch(wk, bytes); }
    if (err != CL_SUCCESS || wk->planning) { return err; }
    const cl_ulong w_off = w->offset, row_bytes = w->row_bytes, R0 = r0, C0 = c0, NR = nr, NC = nc,
                   ldo = transposed ? nr : nc;
    const cl_mem scratch = scratch_of(wk);
    clffn_args a = clffn__args(*k);
    CLFFN_ARG(a, w->mem), CLFFN_ARG(a, w_off), CLFFN_ARG(a, row_bytes), CLFFN_ARG(a, R0);
    CLFFN_ARG(a, C0), CLFFN_ARG(a, NR), CLFFN_ARG(a, NC), CLFFN_ARG(a, scratch);
    CLFFN_ARG(a, ldo);
    if ((err = clffn__args_end(&a)) != CL_SUCCESS) { return err; }
    out->mem = scratch, out->off = 0, out->ld = ldo;
    if (tiles) { /* a tile a work-group */
        const size_t global[2] = {round_up((nc + 7) / 8, tl_local[0]), round_up(nr, tl_local[1])};
        return clEnqueueNDRangeKernel(queue, *k, 2, NULL, global, tl_local, 0, NULL, NULL);
    }
    /* an 8 x 8 tile a work-item transposed, eight values of a row else */
    const size_t global[2] = {(nc + 7) / 8, transposed ? (nr + 7) / 8 : nr};
    return clffn__enqueue_items(&ctx->programs, queue, *k, 2, global, NULL);
}
