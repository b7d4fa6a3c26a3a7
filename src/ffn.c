/* The clffn_ffn: weights, workspace, and the forward pass
 *
 *   x[T,D] ─SGEMM(W1|V)─► z[T,N1] ─epilogue1─► h[T,F] ─SGEMM(W2)─► u[T,D] ─epilogue2─► y[T,D]
 *
 * N1 = F, or 2F when gated (W1's columns then V's). The second SGEMM writes the FFN's own u, not
 * the caller's y, so y is written by one kernel at the very end: a failure anywhere earlier leaves
 * it untouched, and y may be x itself. */
#include "internal.h"

#include <clblast_c.h>
#include <stdlib.h>
#include <string.h>

#define F_BIAS1 1u
#define F_BIAS_GATE 2u
#define F_BIAS2 4u
#define F_RESIDUAL 8u

static void bound_release(clffn_bound *b) {
    if (b->mem) { clReleaseMemObject(b->mem); }
    b->mem = NULL;
    b->offset = 0;
}

static void weights_release(clffn_ffn *ffn) {
    bound_release(&ffn->w1);
    bound_release(&ffn->b1);
    bound_release(&ffn->v);
    bound_release(&ffn->bv);
    bound_release(&ffn->w2);
    bound_release(&ffn->b2);
    ffn->has_weights = false;
}

static size_t n1_of(const clffn_config *c) { return c->gated ? 2 * c->d_ff : c->d_ff; }

/* ------------------------------------------------------------------------------------------ */
/* Creation */

static clffn_status make_kernel(clffn_context *ctx, const clffn_program_key *key, const char *name,
                                cl_kernel *out) {
    cl_program prog;
    clffn_status st = clffn__get_program(ctx, key, &prog);
    if (st != CLFFN_SUCCESS) { return st; }
    cl_int err;
    *out = clCreateKernel(prog, name, &err);
    return (clffn_status)err;
}

/* The training kernels exist only while dropout can drop something. */
static clffn_status ensure_train_kernel(clffn_ffn *ffn) {
    if (ffn->epilogue1_train || !(ffn->cfg.dropout > 0.0f)) { return CLFFN_SUCCESS; }
    const clffn_program_key key = {(int)ffn->cfg.activation, ffn->cfg.gated, 1};
    clffn_status st = make_kernel(ffn->ctx, &key, "clffn_epilogue1", &ffn->epilogue1_train);
    if (st == CLFFN_SUCCESS) {
        st = make_kernel(ffn->ctx, &key, "clffn_epilogue1_backward", &ffn->backward1_train);
    }
    if (st != CLFFN_SUCCESS && ffn->epilogue1_train) { /* both or neither */
        clReleaseKernel(ffn->epilogue1_train);
        ffn->epilogue1_train = NULL;
    }
    return st;
}

clffn_status clffn_ffn_create(clffn_context *ctx, const clffn_config *config, clffn_ffn **out) {
    if (!ctx || !config || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn_config_validate(config);
    if (st != CLFFN_SUCCESS) { return st; }
    /* each weight matrix must fit one device allocation */
    const size_t bytes = n1_of(config) * config->d_model * sizeof(float);
    if ((cl_ulong)bytes > ctx->max_alloc) { return CLFFN_ERROR_SIZE_OVERFLOW; }

    clffn_ffn *ffn = calloc(1, sizeof *ffn);
    if (!ffn) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    ffn->ctx = ctx;
    ffn->cfg = *config;
    const clffn_program_key key = {(int)config->activation, config->gated, 0};
    st = make_kernel(ctx, &key, "clffn_epilogue1", &ffn->epilogue1);
    if (st == CLFFN_SUCCESS) { st = make_kernel(ctx, &key, "clffn_epilogue2", &ffn->epilogue2); }
    if (st == CLFFN_SUCCESS) {
        st = make_kernel(ctx, &key, "clffn_epilogue1_backward", &ffn->backward1);
    }
    if (st == CLFFN_SUCCESS) {
        st = make_kernel(ctx, &key, "clffn_column_partials", &ffn->column_partials);
    }
    if (st == CLFFN_SUCCESS) { st = make_kernel(ctx, &key, "clffn_column_sums", &ffn->column_sums); }
    if (st == CLFFN_SUCCESS) { st = ensure_train_kernel(ffn); }
    if (st != CLFFN_SUCCESS) {
        clffn_ffn_destroy(ffn);
        return st;
    }
    *out = ffn;
    return CLFFN_SUCCESS;
}

static void workspace_release(clffn_ffn *ffn) {
    cl_mem *bufs[] = {&ffn->z,     &ffn->h,    &ffn->u,    &ffn->io_x, &ffn->io_y,
                      &ffn->dh,    &ffn->dz,   &ffn->colsum, &ffn->io_dy, &ffn->io_dx, &ffn->g_w1,
                      &ffn->g_b1,  &ffn->g_bv, &ffn->g_w2, &ffn->g_b2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) {
        if (*bufs[i]) { clReleaseMemObject(*bufs[i]); }
        *bufs[i] = NULL;
    }
    ffn->ws_tokens = ffn->io_tokens = ffn->bws_tokens = ffn->bio_tokens = 0;
    if (ffn->gemm_tmp) { clReleaseMemObject(ffn->gemm_tmp); }
    ffn->gemm_tmp = NULL;
    ffn->gemm_tmp_bytes = 0;
}

void clffn_ffn_destroy(clffn_ffn *ffn) {
    if (!ffn) { return; }
    if (ffn->epilogue1) { clReleaseKernel(ffn->epilogue1); }
    if (ffn->epilogue1_train) { clReleaseKernel(ffn->epilogue1_train); }
    if (ffn->epilogue2) { clReleaseKernel(ffn->epilogue2); }
    if (ffn->backward1) { clReleaseKernel(ffn->backward1); }
    if (ffn->backward1_train) { clReleaseKernel(ffn->backward1_train); }
    if (ffn->column_partials) { clReleaseKernel(ffn->column_partials); }
    if (ffn->column_sums) { clReleaseKernel(ffn->column_sums); }
    if (ffn->last_event) { clReleaseEvent(ffn->last_event); }
    if (ffn->last_queue) { clReleaseCommandQueue(ffn->last_queue); }
    if (ffn->prof_start) { clReleaseEvent(ffn->prof_start); }
    if (ffn->prof_end) { clReleaseEvent(ffn->prof_end); }
    weights_release(ffn);
    workspace_release(ffn);
    free(ffn);
}

clffn_config clffn_ffn_get_config(const clffn_ffn *ffn) {
    if (!ffn) {
        clffn_config zero;
        memset(&zero, 0, sizeof zero);
        return zero;
    }
    return ffn->cfg;
}

/* ------------------------------------------------------------------------------------------ */
/* Weights */

static clffn_status upload(clffn_context *ctx, size_t n, const float *src, cl_mem *out) {
    cl_int err;
    cl_mem m = clffn__buffer(ctx, CL_MEM_READ_ONLY, n * sizeof(float), &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if (src) {
        err = clEnqueueWriteBuffer(ctx->queue, m, CL_TRUE, 0, n * sizeof(float), src, 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            clReleaseMemObject(m);
            return (clffn_status)err;
        }
    }
    *out = m;
    return CLFFN_SUCCESS;
}

/* Writes an F-column matrix block into the stacked [D, 2F] IN_OUT weight at column col0. */
static cl_int write_columns(clffn_context *ctx, cl_mem m, size_t rows, size_t cols, size_t ld,
                            size_t col0, const float *src) {
    const size_t buffer_origin[3] = {col0 * sizeof(float), 0, 0};
    const size_t host_origin[3] = {0, 0, 0};
    const size_t region[3] = {cols * sizeof(float), rows, 1};
    return clEnqueueWriteBufferRect(ctx->queue, m, CL_TRUE, buffer_origin, host_origin, region,
                                    ld * sizeof(float), 0, cols * sizeof(float), 0, src, 0, NULL,
                                    NULL);
}

clffn_status clffn_ffn_upload_weights(clffn_ffn *ffn, clffn_layout layout,
                                      const clffn_host_weights *w) {
    if (!ffn || !w) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    const clffn_config *c = &ffn->cfg;
    if (!w->w1 || !w->w2 || (c->bias1 && !w->b1) || (c->bias2 && !w->b2) ||
        (c->gated && (!w->v || (c->bias_gate && !w->bv)))) {
        return CLFFN_ERROR_NULL_ARGUMENT;
    }
    clffn_context *ctx = ffn->ctx;
    const size_t D = c->d_model, F = c->d_ff;
    cl_mem m[6] = {NULL}; /* w1 (stacked with V when gated), b1, bv, w2, b2 */
    clffn_status st = upload(ctx, n1_of(c) * D, c->gated ? NULL : w->w1, &m[0]);
    if (st == CLFFN_SUCCESS && c->gated) {
        cl_int err;
        if (layout == CLFFN_LAYOUT_OUT_IN) { /* [2F, D]: W1's rows, then V's */
            err = clEnqueueWriteBuffer(ctx->queue, m[0], CL_TRUE, 0, F * D * sizeof(float), w->w1,
                                       0, NULL, NULL);
            if (err == CL_SUCCESS) {
                err = clEnqueueWriteBuffer(ctx->queue, m[0], CL_TRUE, F * D * sizeof(float),
                                           F * D * sizeof(float), w->v, 0, NULL, NULL);
            }
        } else { /* [D, 2F]: each row holds W1's F values, then V's */
            err = write_columns(ctx, m[0], D, F, 2 * F, 0, w->w1);
            if (err == CL_SUCCESS) { err = write_columns(ctx, m[0], D, F, 2 * F, F, w->v); }
        }
        st = (clffn_status)err;
    }
    if (st == CLFFN_SUCCESS && c->bias1) { st = upload(ctx, F, w->b1, &m[1]); }
    if (st == CLFFN_SUCCESS && c->gated && c->bias_gate) { st = upload(ctx, F, w->bv, &m[2]); }
    if (st == CLFFN_SUCCESS) { st = upload(ctx, D * F, w->w2, &m[3]); }
    if (st == CLFFN_SUCCESS && c->bias2) { st = upload(ctx, D, w->b2, &m[4]); }
    if (st != CLFFN_SUCCESS) { /* the old weights stay in place */
        for (int i = 0; i < 6; ++i) {
            if (m[i]) { clReleaseMemObject(m[i]); }
        }
        return st;
    }
    weights_release(ffn);
    ffn->layout = layout;
    ffn->stacked = c->gated != 0;
    ffn->w1.mem = m[0];
    ffn->b1.mem = m[1];
    ffn->bv.mem = m[2];
    ffn->w2.mem = m[3];
    ffn->b2.mem = m[4];
    ffn->has_weights = true;
    return CLFFN_SUCCESS;
}

clffn_status clffn_ffn_init_weights(clffn_ffn *ffn, clffn_init scheme, uint64_t seed) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_config *c = &ffn->cfg;
    const size_t D = c->d_model, F = c->d_ff;
    /* one host block for all tensors: W1, V, W2 then the biases */
    const size_t total = D * F * (c->gated ? 3 : 2) + 3 * F + D;
    float *block = malloc(total * sizeof *block);
    if (!block) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    clffn_weight_arrays a;
    a.w1 = block;
    a.v = c->gated ? block + D * F : NULL;
    a.w2 = block + D * F * (c->gated ? 2 : 1);
    a.b1 = a.w2 + D * F;
    a.bv = a.b1 + F;
    a.b2 = a.bv + F;
    clffn_status st = clffn_init_weights_host(c, scheme, seed, CLFFN_LAYOUT_OUT_IN, &a);
    if (st == CLFFN_SUCCESS) {
        const clffn_host_weights hw = {a.w1, a.b1, a.v, a.bv, a.w2, a.b2};
        st = clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &hw);
    }
    free(block);
    return st;
}

/* Checks that mem belongs to ctx and holds floats [offset, offset + count). */
clffn_status clffn__check_buffer(const clffn_context *ctx, cl_mem mem, size_t offset, size_t count) {
    if (!mem) { return CLFFN_ERROR_NULL_ARGUMENT; }
    cl_context mctx = NULL;
    size_t size = 0;
    cl_int err = clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof mctx, &mctx, NULL);
    if (err == CL_SUCCESS) { err = clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof size, &size, NULL); }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if (mctx != ctx->context) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    size_t end, bytes;
    if (offset > SIZE_MAX - count || !clffn__mul_ok(offset + count, sizeof(float), &bytes)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    end = bytes;
    return end <= size ? CLFFN_SUCCESS : CLFFN_ERROR_BUFFER_TOO_SMALL;
}

clffn_status clffn_ffn_bind_weights(clffn_ffn *ffn, clffn_layout layout,
                                    const clffn_device_weights *w) {
    if (!ffn || !w) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    const clffn_config *c = &ffn->cfg;
    const size_t D = c->d_model, F = c->d_ff;
    const bool stacked = c->gated && !w->v.mem;
    struct {
        const clffn_buffer *b;
        size_t count;
        bool needed;
    } checks[] = {
        {&w->w1, (stacked ? 2 * F : F) * D, true},
        {&w->b1, F, c->bias1 != 0},
        {&w->v, F * D, c->gated && !stacked},
        {&w->bv, F, c->gated && c->bias_gate},
        {&w->w2, D * F, true},
        {&w->b2, D, c->bias2 != 0},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; ++i) {
        if (!checks[i].needed) { continue; }
        clffn_status st = clffn__check_buffer(ffn->ctx, checks[i].b->mem, checks[i].b->offset,
                                       checks[i].count);
        if (st != CLFFN_SUCCESS) { return st; }
    }
    weights_release(ffn);
    clffn_bound *dst[] = {&ffn->w1, &ffn->b1, &ffn->v, &ffn->bv, &ffn->w2, &ffn->b2};
    for (size_t i = 0; i < 6; ++i) {
        if (!checks[i].needed) { continue; }
        clRetainMemObject(checks[i].b->mem);
        dst[i]->mem = checks[i].b->mem;
        dst[i]->offset = checks[i].b->offset;
    }
    ffn->layout = layout;
    ffn->stacked = stacked;
    ffn->has_weights = true;
    return CLFFN_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Dropout state */

clffn_status clffn_ffn_set_training(clffn_ffn *ffn, int training) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ffn->training = training != 0;
    return CLFFN_SUCCESS;
}

clffn_status clffn_ffn_set_dropout(clffn_ffn *ffn, float p) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!(p >= 0.0f && p <= 1.0f)) { return CLFFN_ERROR_INVALID_DROPOUT; }
    const float old = ffn->cfg.dropout;
    ffn->cfg.dropout = p;
    clffn_status st = ensure_train_kernel(ffn);
    if (st != CLFFN_SUCCESS) { ffn->cfg.dropout = old; }
    return st;
}

clffn_status clffn_ffn_set_rng(clffn_ffn *ffn, uint64_t seed, uint64_t offset) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ffn->seed = seed;
    ffn->rng_offset = offset;
    return CLFFN_SUCCESS;
}

clffn_status clffn_ffn_get_rng(const clffn_ffn *ffn, uint64_t *seed, uint64_t *offset) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (seed) { *seed = ffn->seed; }
    if (offset) { *offset = ffn->rng_offset; }
    return CLFFN_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Forward */

/* Grows the workspace to hold T tokens. Old buffers are released, not reused: commands still
 * queued on them keep them alive, and nothing new can race with them. */
static clffn_status ensure_workspace(clffn_ffn *ffn, size_t tokens) {
    if (tokens <= ffn->ws_tokens) { return CLFFN_SUCCESS; }
    const clffn_config *c = &ffn->cfg;
    const size_t sizes[3] = {tokens * n1_of(c), tokens * c->d_ff, tokens * c->d_model};
    cl_mem m[3] = {NULL, NULL, NULL};
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < 3 && err == CL_SUCCESS; ++i) {
        m[i] = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, sizes[i] * sizeof(float), &err);
    }
    if (err != CL_SUCCESS) {
        for (int i = 0; i < 3; ++i) {
            if (m[i]) { clReleaseMemObject(m[i]); }
        }
        return (clffn_status)err;
    }
    if (ffn->z) { clReleaseMemObject(ffn->z); }
    if (ffn->h) { clReleaseMemObject(ffn->h); }
    if (ffn->u) { clReleaseMemObject(ffn->u); }
    ffn->z = m[0];
    ffn->h = m[1];
    ffn->u = m[2];
    ffn->ws_tokens = tokens;
    return CLFFN_SUCCESS;
}

clffn_status clffn__check_queue(const clffn_context *ctx, cl_command_queue queue) {
    cl_context qctx = NULL;
    cl_device_id qdev = NULL;
    cl_command_queue_properties props = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL);
    if (err == CL_SUCCESS) {
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL);
    }
    if (err == CL_SUCCESS) {
        err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    /* CLBlast enqueues several kernels per GEMM and relies on in-order execution */
    if (qctx != ctx->context || qdev != ctx->device ||
        (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
        return CLFFN_ERROR_INVALID_QUEUE;
    }
    return CLFFN_SUCCESS;
}

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

cl_mem clffn__buffer(const clffn_context *ctx, cl_mem_flags flags, size_t bytes, cl_int *err) {
    return clCreateBuffer(ctx->context, flags | (ctx->cpu ? CL_MEM_ALLOC_HOST_PTR : 0), bytes,
                          NULL, err);
}

/* Grows the FFN's GEMM scratch to at least `need` bytes. */
static cl_int ensure_gemm_tmp(clffn_ffn *ffn, size_t need) {
    if (need <= ffn->gemm_tmp_bytes) { return CL_SUCCESS; }
    /* the old scratch may still be in use by enqueued GEMMs: OpenCL keeps it alive until they
     * complete, so releasing it here is safe */
    cl_int err;
    cl_mem t = clffn__buffer(ffn->ctx, CL_MEM_READ_WRITE, need, &err);
    if (err != CL_SUCCESS) { return err; }
    if (ffn->gemm_tmp) { clReleaseMemObject(ffn->gemm_tmp); }
    ffn->gemm_tmp = t;
    ffn->gemm_tmp_bytes = need;
    return CL_SUCCESS;
}

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

/* Every product clffn runs: C[m,n] = α·op(A)·op(B) + β·C, all row-major, A [m,k] or (ta) [k,m],
 * B [k,n] or (tb) [n,k]. CLBlast's scratch is the FFN's own (grown first, so that a failure
 * enqueues nothing) when ffn is given, else CLBlast's per call. */
static cl_int sgemm(const clffn_context *ctx, clffn_ffn *ffn, CLBlastTranspose ta,
                    CLBlastTranspose tb, size_t m, size_t n, size_t k, float alpha, cl_mem a,
                    size_t a_off, size_t a_ld, cl_mem b, size_t b_off, size_t b_ld, float beta,
                    cl_mem c, size_t c_off, size_t c_ld, cl_command_queue *queue,
                    cl_event *event) {
    /* Called column-major: C = A·B row-major is Cᵀ = Bᵀ·Aᵀ column-major over the same memory,
     * so CLBlast's A is our B and its m is our n. CLBlast's Xgemm computes a column-major C, so
     * for a row-major one it transposes C into scratch and back on every call (c_do_transpose
     * in its xgemm.cpp); asked column-major it does neither: every product ~25% faster on POCL. */
    const CLBlastLayout L = CLBlastLayoutColMajor;
    /* CLBlast's Xgemm walks the whole inner dimension for each tile of C; on a CPU a long K
     * streams operand panels that no longer fit in cache. Summing K-blocks into C costs one more
     * pass over C per block and can be much faster (docs/PERFORMANCE.md) */
    size_t kb;
    const size_t blocks = clffn_gemm_k_split(k, ctx->gemm_k_block, &kb);
    /* where block j starts: K runs along a row of a row-major A unless it is transposed, and
     * down the rows of B unless it is transposed */
    const size_t a_step = ta == CLBlastTransposeNo ? 1 : a_ld;
    const size_t b_step = tb == CLBlastTransposeNo ? b_ld : 1;
    size_t need = 0;
    cl_int err = CL_SUCCESS;
    for (size_t j = 0; ffn && j < blocks && err == CL_SUCCESS; ++j) {
        const size_t k0 = j * kb, kk = k - k0 < kb ? k - k0 : kb;
        size_t nj = 0;
        err = CLBlastSGemmTempBufferSize(L, tb, ta, n, m, kk, b_off + k0 * b_step, b_ld,
                                         a_off + k0 * a_step, a_ld, c_off, c_ld, queue, &nj);
        if (nj > need) { need = nj; }
    }
    if (ffn && err == CL_SUCCESS) { err = ensure_gemm_tmp(ffn, need); }
    for (size_t j = 0; j < blocks && err == CL_SUCCESS; ++j) {
        const size_t k0 = j * kb, kk = k - k0 < kb ? k - k0 : kb;
        err = CLBlastSgemmWithTempBuffer(L, tb, ta, n, m, kk, alpha, b, b_off + k0 * b_step, b_ld,
                                         a, a_off + k0 * a_step, a_ld, j ? 1.0f : beta, c, c_off,
                                         c_ld, queue, j + 1 == blocks ? event : NULL,
                                         need ? ffn->gemm_tmp : NULL);
    }
    return err;
}

cl_int clffn__sgemm(clffn_ffn *ffn, int ta, int tb, size_t m, size_t n, size_t k, float alpha,
                    cl_mem a, size_t a_off, size_t a_ld, cl_mem b, size_t b_off, size_t b_ld,
                    float beta, cl_mem c, size_t c_off, size_t c_ld, cl_command_queue *queue,
                    cl_event *event) {
    return sgemm(ffn->ctx, ffn, (CLBlastTranspose)ta, (CLBlastTranspose)tb, m, n, k, alpha, a,
                 a_off, a_ld, b, b_off, b_ld, beta, c, c_off, c_ld, queue, event);
}

clffn_status clffn_sgemm(const clffn_context *ctx, int trans_a, int trans_b, size_t m, size_t n,
                         size_t k, float alpha, cl_mem a, size_t a_off, size_t a_ld, cl_mem b,
                         size_t b_off, size_t b_ld, float beta, cl_mem c, size_t c_off,
                         size_t c_ld, cl_command_queue queue, cl_event *event) {
    if (!ctx || !a || !b || !c || !queue) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_status st = clffn__check_queue(ctx, queue);
    if (st != CLFFN_SUCCESS) { return st; }
    return (clffn_status)sgemm(ctx, NULL, trans_a ? CLBlastTransposeYes : CLBlastTransposeNo,
                               trans_b ? CLBlastTransposeYes : CLBlastTransposeNo, m, n, k, alpha,
                               a, a_off, a_ld, b, b_off, b_ld, beta, c, c_off, c_ld, &queue,
                               event);
}

/* Enqueues a (columns/4, T) epilogue launch. */
cl_int clffn__launch(clffn_ffn *ffn, cl_kernel k, size_t columns, size_t tokens,
                     cl_command_queue queue, cl_event *event) {
    const size_t ls = ffn->ctx->epilogue_local_size;
    size_t global[2] = {(columns + 3) / 4, tokens};
    size_t local[2] = {ls, 1};
    if (ls) { global[0] = round_up(global[0], ls); }
    return clEnqueueNDRangeKernel(queue, k, 2, NULL, global, ls ? local : NULL, 0, NULL, event);
}

static cl_int enqueue_epilogue1(clffn_ffn *ffn, size_t tokens, cl_command_queue queue,
                                cl_event *event) {
    const clffn_config *c = &ffn->cfg;
    const bool drop = ffn->training && c->dropout > 0.0f;
    cl_kernel k = drop ? ffn->epilogue1_train : ffn->epilogue1;
    const cl_ulong ldz = n1_of(c);
    const cl_uint vec = (c->d_ff % 4) == 0;
    cl_int err = CL_SUCCESS;
    SET_ARG(k, 0, ffn->z);
    SET_ARG(k, 1, ldz);
    SET_ARG(k, 2, ffn->h);
    if (err == CL_SUCCESS) {
        err = clffn__set_epilogue1_args(ffn, k, 3, tokens, drop, c->dropout, ffn->rng_offset);
    }
    SET_ARG(k, 8, vec);
    if (err == CL_SUCCESS) { err = clffn__launch(ffn, k, c->d_ff, tokens, queue, event); }
    return err;
}

static cl_int enqueue_epilogue2(clffn_ffn *ffn, size_t tokens, cl_mem x, size_t x_off, cl_mem y,
                                size_t y_off, cl_command_queue queue, cl_event *event) {
    const clffn_config *c = &ffn->cfg;
    cl_kernel k = ffn->epilogue2;
    const cl_mem b2 = c->bias2 ? ffn->b2.mem : ffn->u;
    const cl_ulong b2_off = c->bias2 ? ffn->b2.offset : 0;
    const cl_ulong xo = x_off, yo = y_off, T = tokens, D = c->d_model;
    const cl_uint flags = (c->bias2 ? F_BIAS2 : 0) | (c->residual ? F_RESIDUAL : 0);
    const cl_uint vec = (D % 4) == 0;
    cl_int err = CL_SUCCESS;
    SET_ARG(k, 0, ffn->u);
    SET_ARG(k, 1, y);
    SET_ARG(k, 2, yo);
    SET_ARG(k, 3, x);
    SET_ARG(k, 4, xo);
    SET_ARG(k, 5, b2);
    SET_ARG(k, 6, b2_off);
    SET_ARG(k, 7, flags);
    SET_ARG(k, 8, vec);
    SET_ARG(k, 9, T);
    SET_ARG(k, 10, D);
    if (err == CL_SUCCESS) { err = clffn__launch(ffn, k, c->d_model, tokens, queue, event); }
    return err;
}

cl_int clffn__set_epilogue1_args(clffn_ffn *ffn, cl_kernel k, cl_uint bias_index, size_t tokens,
                                 int drop, float p, uint64_t rng_offset) {
    const clffn_config *c = &ffn->cfg;
    /* a bias that is off is never read; any valid buffer stands in for it */
    const cl_mem b1 = c->bias1 ? ffn->b1.mem : ffn->z;
    const cl_mem bv = c->gated && c->bias_gate ? ffn->bv.mem : ffn->z;
    const cl_ulong b1_off = c->bias1 ? ffn->b1.offset : 0;
    const cl_ulong bv_off = c->gated && c->bias_gate ? ffn->bv.offset : 0;
    const cl_uint flags = (c->bias1 ? F_BIAS1 : 0) | (c->gated && c->bias_gate ? F_BIAS_GATE : 0);
    const cl_ulong T = tokens, F = c->d_ff, off = rng_offset;
    const cl_ulong thresh = drop ? clffn__drop_threshold(p) : 0;
    const cl_float scale = drop ? clffn__drop_scale(p) : 1.0f;
    const cl_uint2 key = {{(cl_uint)ffn->seed, (cl_uint)(ffn->seed >> 32)}};
    cl_int err = CL_SUCCESS;
    SET_ARG(k, bias_index, b1);
    SET_ARG(k, bias_index + 1, b1_off);
    SET_ARG(k, bias_index + 2, bv);
    SET_ARG(k, bias_index + 3, bv_off);
    SET_ARG(k, bias_index + 4, flags);
    SET_ARG(k, 9, T);
    SET_ARG(k, 10, F);
    SET_ARG(k, 11, thresh);
    SET_ARG(k, 12, scale);
    SET_ARG(k, 13, key);
    SET_ARG(k, 14, off);
    return err;
}

/* The first projection: z = x·[W1 | V]. One SGEMM when the weights are stacked (or plain),
 * two into the halves of z otherwise. */
static cl_int enqueue_gemm1(clffn_ffn *ffn, size_t tokens, cl_mem x, size_t x_off,
                            cl_command_queue *queue) {
    const clffn_config *c = &ffn->cfg;
    const size_t D = c->d_model, F = c->d_ff, ldz = n1_of(c);
    const bool out_in = ffn->layout == CLFFN_LAYOUT_OUT_IN;
    const CLBlastTranspose tb = out_in ? CLBlastTransposeYes : CLBlastTransposeNo;
    if (!c->gated || ffn->stacked) {
        return clffn__sgemm(ffn, CLBlastTransposeNo, tb, tokens, ldz, D, 1.0f,
                            x, x_off, D, ffn->w1.mem, ffn->w1.offset, out_in ? D : ldz, 0.0f,
                            ffn->z, 0, ldz, queue, NULL);
    }
    cl_int err = clffn__sgemm(ffn, CLBlastTransposeNo, tb, tokens, F, D, 1.0f,
                              x, x_off, D, ffn->w1.mem, ffn->w1.offset, out_in ? D : F, 0.0f,
                              ffn->z, 0, ldz, queue, NULL);
    if (err == CL_SUCCESS) {
        err = clffn__sgemm(ffn, CLBlastTransposeNo, tb, tokens, F, D, 1.0f, x,
                           x_off, D, ffn->v.mem, ffn->v.offset, out_in ? D : F, 0.0f, ffn->z, F,
                           ldz, queue, NULL);
    }
    return err;
}

/* The second projection: u = h·W2. */
static cl_int enqueue_gemm2(clffn_ffn *ffn, size_t tokens, cl_command_queue *queue) {
    const clffn_config *c = &ffn->cfg;
    const size_t D = c->d_model, F = c->d_ff;
    const bool out_in = ffn->layout == CLFFN_LAYOUT_OUT_IN;
    return clffn__sgemm(ffn, CLBlastTransposeNo,
                        out_in ? CLBlastTransposeYes : CLBlastTransposeNo, tokens, D, F, 1.0f,
                        ffn->h, 0, F, ffn->w2.mem, ffn->w2.offset, out_in ? F : D, 0.0f, ffn->u,
                        0, D, queue, NULL);
}

static void remember_forward(clffn_ffn *ffn, size_t tokens, cl_command_queue queue, cl_event ev) {
    if (ffn->last_event) { clReleaseEvent(ffn->last_event); }
    if (ffn->last_queue) { clReleaseCommandQueue(ffn->last_queue); }
    ffn->last_event = ev;
    ffn->last_queue = queue;
    if (queue) { clRetainCommandQueue(queue); }
    ffn->last_tokens = tokens;
}

clffn_status clffn_forward(clffn_ffn *ffn, size_t tokens, cl_mem x, size_t x_offset, cl_mem y,
                           size_t y_offset, cl_command_queue queue, cl_event *event) {
    if (!ffn || !x || !y || !queue) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!ffn->has_weights) { return CLFFN_ERROR_NO_WEIGHTS; }
    clffn_status st = clffn__check_queue(ffn->ctx, queue);
    if (st != CLFFN_SUCCESS) { return st; }
    const clffn_config *c = &ffn->cfg;

    /* every size the pass touches, checked before anything is enqueued */
    size_t nx, nz, bytes;
    if (!clffn__mul_ok(tokens, c->d_model, &nx) || !clffn__mul_ok(tokens, n1_of(c), &nz) ||
        !clffn__mul_ok(nz, sizeof(float), &bytes) || (cl_ulong)bytes > ffn->ctx->max_alloc ||
        !clffn__mul_ok(nx, sizeof(float), &bytes) || (cl_ulong)bytes > ffn->ctx->max_alloc) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    if ((st = clffn__check_buffer(ffn->ctx, x, x_offset, nx)) != CLFFN_SUCCESS ||
        (st = clffn__check_buffer(ffn->ctx, y, y_offset, nx)) != CLFFN_SUCCESS) {
        return st;
    }
    if (x == y && x_offset != y_offset && x_offset < y_offset + nx && y_offset < x_offset + nx) {
        return CLFFN_ERROR_BUFFER_OVERLAP;
    }
    if (tokens == 0) { /* CLBlast rejects empty matrices; the caller still gets an event */
        remember_forward(ffn, 0, NULL, NULL);
        return event ? (clffn_status)clEnqueueMarkerWithWaitList(queue, 0, NULL, event)
                     : CLFFN_SUCCESS;
    }
    if ((st = ensure_workspace(ffn, tokens)) != CLFFN_SUCCESS) { return st; }

    cl_event ev1 = NULL, start = NULL, end = NULL;
    cl_int err = CL_SUCCESS;
    if (ffn->profiling) { err = clEnqueueMarkerWithWaitList(queue, 0, NULL, &start); }
    if (err == CL_SUCCESS) { err = enqueue_gemm1(ffn, tokens, x, x_offset, &queue); }
    if (err == CL_SUCCESS) { err = enqueue_epilogue1(ffn, tokens, queue, &ev1); }
    if (err == CL_SUCCESS) { err = enqueue_gemm2(ffn, tokens, &queue); }
    if (err == CL_SUCCESS) {
        err = enqueue_epilogue2(ffn, tokens, x, x_offset, y, y_offset, queue,
                                ffn->profiling ? &end : event);
    }
    if (err != CL_SUCCESS) {
        if (ev1) { clReleaseEvent(ev1); }
        if (start) { clReleaseEvent(start); }
        if (end) { clReleaseEvent(end); }
        remember_forward(ffn, 0, NULL, NULL);
        return (clffn_status)err;
    }
    remember_forward(ffn, tokens, queue, ev1);
    ffn->last_drop = ffn->training && c->dropout > 0.0f;
    ffn->last_p = c->dropout;
    ffn->last_rng_offset = ffn->rng_offset;
    if (ffn->profiling) {
        if (ffn->prof_start) { clReleaseEvent(ffn->prof_start); }
        if (ffn->prof_end) { clReleaseEvent(ffn->prof_end); }
        ffn->prof_start = start;
        ffn->prof_end = end;
        if (event) { /* the caller gets the same last event, with its own reference */
            clRetainEvent(end);
            *event = end;
        }
    } else if (ffn->prof_start) { /* stale times must not be read as this forward's */
        clReleaseEvent(ffn->prof_start);
        clReleaseEvent(ffn->prof_end);
        ffn->prof_start = ffn->prof_end = NULL;
    }
    if (ffn->training && c->dropout > 0.0f) {
        /* the next forward draws a fresh mask: skip the Philox blocks this one used */
        ffn->rng_offset += ((uint64_t)tokens * c->d_ff + 3) / 4;
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn_forward_host(clffn_ffn *ffn, size_t tokens, const float *x, size_t x_len,
                                float *y, size_t y_len) {
    if (!ffn || !x || !y) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!ffn->has_weights) { return CLFFN_ERROR_NO_WEIGHTS; }
    size_t n, bytes;
    if (!clffn__mul_ok(tokens, ffn->cfg.d_model, &n) || !clffn__mul_ok(n, sizeof(float), &bytes)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    if (x_len < n || y_len < n) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    if (tokens == 0) {
        remember_forward(ffn, 0, NULL, NULL);
        return CLFFN_SUCCESS;
    }
    clffn_context *ctx = ffn->ctx;
    /* the workspace too, before any buffer is made for a call that cannot run */
    size_t nz, zbytes;
    if ((cl_ulong)bytes > ctx->max_alloc || !clffn__mul_ok(tokens, n1_of(&ffn->cfg), &nz) ||
        !clffn__mul_ok(nz, sizeof(float), &zbytes) || (cl_ulong)zbytes > ctx->max_alloc) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    if (tokens > ffn->io_tokens) {
        cl_int err;
        cl_mem bx = clffn__buffer(ctx, CL_MEM_READ_ONLY, bytes, &err);
        cl_mem by = err == CL_SUCCESS
                        ? clffn__buffer(ctx, CL_MEM_WRITE_ONLY, bytes, &err)
                        : NULL;
        if (err != CL_SUCCESS) {
            if (bx) { clReleaseMemObject(bx); }
            return (clffn_status)err;
        }
        if (ffn->io_x) { clReleaseMemObject(ffn->io_x); }
        if (ffn->io_y) { clReleaseMemObject(ffn->io_y); }
        ffn->io_x = bx;
        ffn->io_y = by;
        ffn->io_tokens = tokens;
    }
    cl_int err = clEnqueueWriteBuffer(ctx->queue, ffn->io_x, CL_FALSE, 0, bytes, x, 0, NULL, NULL);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    clffn_status st = clffn_forward(ffn, tokens, ffn->io_x, 0, ffn->io_y, 0, ctx->queue, NULL);
    if (st != CLFFN_SUCCESS) {
        clFinish(ctx->queue); /* the write above still reads x: it must end before we return */
        return st;
    }
    return (clffn_status)clEnqueueReadBuffer(ctx->queue, ffn->io_y, CL_TRUE, 0, bytes, y, 0, NULL,
                                             NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* Hidden tensors of the last forward */

clffn_status clffn_ffn_read_hidden(clffn_ffn *ffn, clffn_hidden which, float *out,
                                   size_t out_len, size_t *tokens) {
    if (!ffn || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_config *c = &ffn->cfg;
    if (which != CLFFN_HIDDEN_PRE && which != CLFFN_HIDDEN_GATE && which != CLFFN_HIDDEN_OUT) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    if (which == CLFFN_HIDDEN_GATE && !c->gated) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    if (ffn->last_tokens == 0 || !ffn->last_event) { return CLFFN_ERROR_NO_FORWARD; }
    const size_t T = ffn->last_tokens, F = c->d_ff, n = T * F; /* fitted the workspace */
    if (out_len < n) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    clffn_context *ctx = ffn->ctx;
    /* the forward may still sit unflushed in the caller's queue, which we are about to wait on */
    cl_int err = clFlush(ffn->last_queue);
    if (err != CL_SUCCESS) { return (clffn_status)err; }

    if (which == CLFFN_HIDDEN_OUT) {
        err = clEnqueueReadBuffer(ctx->queue, ffn->h, CL_TRUE, 0, n * sizeof(float), out, 1,
                                  &ffn->last_event, NULL);
        if (err == CL_SUCCESS && tokens) { *tokens = T; }
        return (clffn_status)err;
    }
    /* PRE and GATE are z's halves plus their bias, added here in float as the kernel does */
    const bool pre = which == CLFFN_HIDDEN_PRE;
    const bool has_bias = pre ? c->bias1 != 0 : c->bias_gate != 0;
    const clffn_bound *bias = pre ? &ffn->b1 : &ffn->bv;
    float *tmp = malloc(n * sizeof *tmp);
    float *b = has_bias ? malloc(F * sizeof *b) : NULL;
    if (!tmp || (has_bias && !b)) {
        free(tmp);
        free(b);
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    const size_t ldz = n1_of(c), col0 = pre ? 0 : F;
    const size_t buffer_origin[3] = {col0 * sizeof(float), 0, 0};
    const size_t host_origin[3] = {0, 0, 0};
    const size_t region[3] = {F * sizeof(float), T, 1};
    err = clEnqueueReadBufferRect(ctx->queue, ffn->z, CL_FALSE, buffer_origin, host_origin, region,
                                  ldz * sizeof(float), 0, F * sizeof(float), 0, tmp, 1,
                                  &ffn->last_event, NULL);
    if (err == CL_SUCCESS && has_bias) {
        err = clEnqueueReadBuffer(ctx->queue, bias->mem, CL_FALSE, bias->offset * sizeof(float),
                                  F * sizeof(float), b, 0, NULL, NULL);
    }
    cl_int fin = clFinish(ctx->queue);
    if (err == CL_SUCCESS) { err = fin; }
    if (err == CL_SUCCESS) {
        for (size_t t = 0; t < T; ++t) {
            for (size_t j = 0; j < F; ++j) { out[t * F + j] = tmp[t * F + j] + (b ? b[j] : 0.0f); }
        }
        if (tokens) { *tokens = T; }
    }
    free(tmp);
    free(b);
    return (clffn_status)err;
}

/* ------------------------------------------------------------------------------------------ */
/* Stage timing */

clffn_status clffn_ffn_set_profiling(clffn_ffn *ffn, int on) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ffn->profiling = on != 0;
    return CLFFN_SUCCESS;
}

static cl_int event_time(cl_event e, cl_profiling_info what, cl_ulong *ns) {
    return clGetEventProfilingInfo(e, what, sizeof *ns, ns, NULL);
}

clffn_status clffn_ffn_stage_times(clffn_ffn *ffn, clffn_stage_times *out) {
    if (!ffn || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!ffn->prof_start || !ffn->prof_end || !ffn->last_event || ffn->last_tokens == 0) {
        return CLFFN_ERROR_NO_FORWARD;
    }
    cl_int err = clFlush(ffn->last_queue);
    if (err == CL_SUCCESS) { err = clWaitForEvents(1, &ffn->prof_end); }
    /* in-order queue: GEMM 1 runs from the marker to epilogue 1, GEMM 2 between the epilogues
     * (each GEMM may be several CLBlast kernels, so it is timed by what surrounds it) */
    cl_ulong t0 = 0, e1s = 0, e1e = 0, e2s = 0, e2e = 0;
    if (err == CL_SUCCESS) { err = event_time(ffn->prof_start, CL_PROFILING_COMMAND_END, &t0); }
    if (err == CL_SUCCESS) { err = event_time(ffn->last_event, CL_PROFILING_COMMAND_START, &e1s); }
    if (err == CL_SUCCESS) { err = event_time(ffn->last_event, CL_PROFILING_COMMAND_END, &e1e); }
    if (err == CL_SUCCESS) { err = event_time(ffn->prof_end, CL_PROFILING_COMMAND_START, &e2s); }
    if (err == CL_SUCCESS) { err = event_time(ffn->prof_end, CL_PROFILING_COMMAND_END, &e2e); }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if (!(t0 <= e1s && e1s <= e1e && e1e <= e2s && e2s <= e2e)) {
        return CLFFN_ERROR_INVALID_QUEUE; /* not in order: the stages overlapped */
    }
    out->gemm1_s = (double)(e1s - t0) * 1e-9;
    out->epilogue1_s = (double)(e1e - e1s) * 1e-9;
    out->gemm2_s = (double)(e2s - e1e) * 1e-9;
    out->epilogue2_s = (double)(e2e - e2s) * 1e-9;
    out->total_s = (double)(e2e - t0) * 1e-9;
    return CLFFN_SUCCESS;
}
