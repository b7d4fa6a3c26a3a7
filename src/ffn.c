/* The clffn_ffn: creation and destruction, its kernels, its weights and its dropout state. The
 * passes themselves are forward.c and backward.c. */
#include "ffn.h"

#include "launch.h"
#include "program.h"

#include <stdlib.h>
#include <string.h>

static void weights_release(clffn_ffn *ffn) {
    cl_mem *const mems[] = {&ffn->w1.mem, &ffn->v.mem,  &ffn->w2.mem,
                            &ffn->b1.mem, &ffn->bv.mem, &ffn->b2.mem};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; ++i) {
        if (*mems[i]) { clReleaseMemObject(*mems[i]); }
    }
    memset(&ffn->w1, 0, sizeof ffn->w1);
    memset(&ffn->v, 0, sizeof ffn->v);
    memset(&ffn->w2, 0, sizeof ffn->w2);
    memset(&ffn->b1, 0, sizeof ffn->b1);
    memset(&ffn->bv, 0, sizeof ffn->bv);
    memset(&ffn->b2, 0, sizeof ffn->b2);
    ffn->has_weights = false;
}

/* Sets the FFN's weights from buffers it holds a reference to (owned or retained), kept in
 * `layout` and handed over in `given`. */
static void weights_set(clffn_ffn *ffn, clffn_layout layout, clffn_layout given, bool stacked,
                        const clffn_buffer m[6]) {
    const size_t D = ffn->cfg.d_model, F = ffn->cfg.d_ff;
    const clffn_linear w1 = {m[0].mem, m[0].offset, D, stacked ? 2 * F : F, layout};
    const clffn_linear v = {m[2].mem, m[2].offset, D, F, layout};
    const clffn_linear w2 = {m[4].mem, m[4].offset, F, D, layout};
    ffn->w1 = w1;
    ffn->v = v;
    ffn->w2 = w2;
    ffn->b1 = m[1];
    ffn->bv = m[3];
    ffn->b2 = m[5];
    ffn->grad_layout = given;
    ffn->stacked = stacked;
    ffn->has_weights = true;
}

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

/* The training kernels are built when the FFN first trains with a dropout that can drop
 * something: an FFN that only runs inference never pays for their program (a second build, a
 * sixth of the time to a first result on POCL). */
static clffn_status ensure_train_kernel(clffn_ffn *ffn) {
    if (ffn->epilogue1_train || !ffn->training || !(ffn->cfg.dropout > 0.0f)) {
        return CLFFN_SUCCESS;
    }
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
    const size_t bytes = clffn__n1(config) * config->d_model * sizeof(float);
    if ((cl_ulong)bytes > ctx->max_alloc) { return CLFFN_ERROR_SIZE_OVERFLOW; }

    clffn_ffn *ffn = calloc(1, sizeof *ffn);
    if (!ffn) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    ffn->ctx = ctx;
    ffn->cfg = *config;
    ffn->hidden_col0 = 0;
    ffn->hidden_total = config->d_ff;
    const clffn_program_key key = {(int)config->activation, config->gated, 0};
    st = make_kernel(ctx, &key, "clffn_epilogue1", &ffn->epilogue1);
    if (st == CLFFN_SUCCESS) { st = make_kernel(ctx, &key, "clffn_epilogue2", &ffn->epilogue2); }
    if (st == CLFFN_SUCCESS) {
        st = make_kernel(ctx, &key, "clffn_epilogue1_backward", &ffn->backward1);
    }
    if (st == CLFFN_SUCCESS) {
        st = make_kernel(ctx, &key, "clffn_column_partials", &ffn->column_partials);
    }
    if (st == CLFFN_SUCCESS) {
        st = make_kernel(ctx, &key, "clffn_column_sums", &ffn->column_sums);
    }
    if (st != CLFFN_SUCCESS) {
        clffn_ffn_destroy(ffn);
        return st;
    }
    *out = ffn;
    return CLFFN_SUCCESS;
}

clffn_status clffn_ffn_create_shard(clffn_context *ctx, const clffn_config *config, int index,
                                    int count, clffn_ffn **out) {
    if (!ctx || !config || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_status st = clffn_config_validate(config);
    if (st != CLFFN_SUCCESS) { return st; }
    size_t f0, f1;
    if ((st = clffn_shard_range(config->d_ff, index, count, &f0, &f1)) != CLFFN_SUCCESS) {
        return st;
    }
    /* the slice is an FFN of its own width whose b2 and residual only shard 0 adds */
    clffn_config part = *config;
    part.d_ff = f1 - f0;
    if (index != 0) {
        part.bias2 = 0;
        part.residual = 0;
    }
    clffn_ffn *ffn = NULL;
    if ((st = clffn_ffn_create(ctx, &part, &ffn)) != CLFFN_SUCCESS) { return st; }
    ffn->hidden_col0 = f0;
    ffn->hidden_total = config->d_ff;
    *out = ffn;
    return CLFFN_SUCCESS;
}

clffn_status clffn_ffn_shard_info(const clffn_ffn *ffn, size_t *f0, size_t *f1,
                                  size_t *d_ff_total) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (f0) { *f0 = ffn->hidden_col0; }
    if (f1) { *f1 = ffn->hidden_col0 + ffn->cfg.d_ff; }
    if (d_ff_total) { *d_ff_total = ffn->hidden_total; }
    return CLFFN_SUCCESS;
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
    clffn__workspace_release(&ffn->ws);
    clffn__scratch_release(&ffn->scratch);
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
        err =
            clEnqueueWriteBuffer(ctx->queue, m, CL_TRUE, 0, n * sizeof(float), src, 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            clReleaseMemObject(m);
            return (clffn_status)err;
        }
    }
    *out = m;
    return CLFFN_SUCCESS;
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
    const clffn_layout kept = ctx->weight_layout;
    const size_t D = c->d_model, F = c->d_ff;
    cl_mem m[6] = {NULL}; /* w1 (stacked with V when gated), b1, bv, w2, b2 */
    const float *const first[2] = {w->w1, c->gated ? w->v : NULL}, *const second[2] = {w->w2, NULL};
    clffn_status st = upload(ctx, clffn__n1(c) * D, NULL, &m[0]);
    if (st == CLFFN_SUCCESS) {
        st = (clffn_status)clffn__write_weight(ctx->queue, m[0], kept, layout, F, D, first);
    }
    if (st == CLFFN_SUCCESS && c->bias1) { st = upload(ctx, F, w->b1, &m[1]); }
    if (st == CLFFN_SUCCESS && c->gated && c->bias_gate) { st = upload(ctx, F, w->bv, &m[2]); }
    if (st == CLFFN_SUCCESS) { st = upload(ctx, D * F, NULL, &m[3]); }
    if (st == CLFFN_SUCCESS) {
        st = (clffn_status)clffn__write_weight(ctx->queue, m[3], kept, layout, D, F, second);
    }
    if (st == CLFFN_SUCCESS && c->bias2) { st = upload(ctx, D, w->b2, &m[4]); }
    if (st != CLFFN_SUCCESS) { /* the old weights stay in place */
        for (int i = 0; i < 6; ++i) {
            if (m[i]) { clReleaseMemObject(m[i]); }
        }
        return st;
    }
    weights_release(ffn);
    const clffn_buffer bufs[6] = {{m[0], 0}, {m[1], 0}, {NULL, 0}, {m[2], 0}, {m[3], 0}, {m[4], 0}};
    weights_set(ffn, kept, layout, c->gated != 0, bufs);
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
        clffn_status st =
            clffn__check_buffer(ffn->ctx, checks[i].b->mem, checks[i].b->offset, checks[i].count);
        if (st != CLFFN_SUCCESS) { return st; }
    }
    weights_release(ffn);
    clffn_buffer bufs[6] = {{NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}};
    for (size_t i = 0; i < 6; ++i) {
        if (!checks[i].needed) { continue; }
        clRetainMemObject(checks[i].b->mem);
        bufs[i] = *checks[i].b;
    }
    weights_set(ffn, layout, layout, stacked, bufs);
    return CLFFN_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Dropout state */

clffn_status clffn_ffn_set_training(clffn_ffn *ffn, int training) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const bool old = ffn->training;
    ffn->training = training != 0;
    clffn_status st = ensure_train_kernel(ffn);
    if (st != CLFFN_SUCCESS) { ffn->training = old; }
    return st;
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
