/* The clffn_ffn: creation and destruction, its kernels, its weights' slots and its dropout
 * state. Uploading weights is weights.c; the passes are forward.c and backward.c. */
#include "ffn.h"

#include "dtype.h"
#include "launch.h"
#include "program.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

clffn_status clffn__ffn_refuse(clffn_ffn *ffn, clffn_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ffn->message, sizeof ffn->message, fmt, ap);
    va_end(ap);
    return st;
}

const char *clffn_ffn_error_message(const clffn_ffn *ffn) { return ffn ? ffn->message : ""; }

void clffn__ffn_weights_release(clffn_ffn *ffn) {
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
    ffn->weight_bytes = 0;
    memset(ffn->pool_gen, 0, sizeof ffn->pool_gen);
}

void clffn__ffn_weights_set(clffn_ffn *ffn, clffn_layout layout, clffn_layout given, bool stacked,
                            clffn_dtype dtype, const clffn_buffer m[6]) {
    const size_t D = ffn->cfg.d_model, F = ffn->cfg.d_ff;
    const clffn_linear w1 = {m[0].mem, m[0].offset, D, stacked ? 2 * F : F, layout, dtype};
    const clffn_linear v = {m[2].mem, m[2].offset, D, F, layout, dtype};
    const clffn_linear w2 = {m[4].mem, m[4].offset, F, D, layout, dtype};
    ffn->w1 = w1;
    ffn->v = v;
    ffn->w2 = w2;
    ffn->b1 = m[1];
    ffn->bv = m[3];
    ffn->b2 = m[5];
    ffn->grad_layout = given;
    ffn->stacked = stacked;
    ffn->has_weights = true;
    size_t row;
    clffn_dtype_bytes(dtype, D, &row); /* fits: checked before the upload */
    ffn->weight_bytes = clffn__n1(&ffn->cfg) * row;
    clffn_dtype_bytes(dtype, F, &row);
    ffn->weight_bytes += D * row;
}

/* ------------------------------------------------------------------------------------------ */
/* Creation */

static clffn_status make_kernel(clffn_context *ctx, const clffn_program_key *key, const char *name,
                                cl_kernel *out) {
    cl_program prog;
    clffn_status st = clffn__get_program(&ctx->programs, key, &prog);
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
    const clffn_program_key key = {
        .activation = (int)ffn->cfg.activation, .gated = ffn->cfg.gated, .dropout = 1};
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

/* The context's shared scratch (made for its first FFN) as ffn's. */
static clffn_status take_shared(clffn_ffn *ffn) {
    clffn_context *ctx = ffn->ctx;
    if (!ctx->shared && !(ctx->shared = calloc(1, sizeof *ctx->shared))) {
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    ffn->ctx_shared = ctx->shared;
    ++ctx->shared->users;
    clffn__ffn_share_scratch(ffn, &ctx->shared->w, &ctx->shared->g);
    return CLFFN_SUCCESS;
}

/* Lets go of the context's shared scratch, releasing it with its last FFN. */
static void drop_shared(clffn_ffn *ffn) {
    struct clffn_shared_scratch *s = ffn->ctx_shared;
    if (!s || --s->users > 0) { return; }
    clffn__scratch_release(&s->w);
    clffn__scratch_release(&s->g);
    if (ffn->ctx->shared == s) { ffn->ctx->shared = NULL; }
    free(s);
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
    const clffn_program_key key = {.activation = (int)config->activation, .gated = config->gated};
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
    if (ctx->share_scratch && (st = take_shared(ffn)) != CLFFN_SUCCESS) {
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
    if (ffn->tail) {
        /* Complete already wherever the caller finished its queue; Mesa's rusticl 22.3 can
         * return from clFinish with the FFN's last kernel still running in its queue thread,
         * and a process that then exits corrupts the heap (docs/RELIABILITY.md, rusticl).
         * Waiting costs nothing elsewhere. */
        clWaitForEvents(1, &ffn->tail);
        clReleaseEvent(ffn->tail);
    }
    if (ffn->last_event) { clReleaseEvent(ffn->last_event); }
    if (ffn->last_queue) { clReleaseCommandQueue(ffn->last_queue); }
    if (ffn->prof_start) { clReleaseEvent(ffn->prof_start); }
    if (ffn->prof_end) { clReleaseEvent(ffn->prof_end); }
    clffn__ffn_weights_release(ffn);
    clffn__workspace_release(&ffn->ws);
    clffn__scratch_release(&ffn->scratch);
    clffn__wkernels_release(&ffn->wk);
    drop_shared(ffn);
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
