/* An FFN's weights: uploaded as f32 (kept in the context's layout), uploaded in their stored
 * type (kept as they are), initialised, or bound from the caller's buffers. */
#include "ffn.h"

#include "dtype.h"
#include "launch.h"

#include <stdlib.h>
#include <string.h>

/* Where an upload's buffers came from: each kind's pool generation (0: a buffer of its own),
 * and whether one was a slot the FFN's weights held, written over. */
typedef struct taken {
    unsigned gen[CLFFN_POOL_KINDS];
    bool over;
} taken;

/* A read-only buffer of `bytes` for the FFN's tensor `kind`: its slot in its layer's pool where
 * it is an expert (waiting, before a slot its weights hold is written over, for what may still
 * read them), else one of its own. */
static cl_mem take(clffn_ffn *ffn, clffn_pool_kind kind, size_t bytes, taken *t, cl_int *err) {
    if (!ffn->pools || ffn->ctx != ffn->pools->ctx) {
        return clffn__buffer(ffn->ctx, CL_MEM_READ_ONLY, bytes, err);
    }
    const bool held = ffn->pool_gen[kind] && ffn->pool_gen[kind] == ffn->pools->kind[kind].gen;
    const cl_event wait[2] = {ffn->tail, ffn->last_event};
    bool over = false;
    cl_mem m = clffn__pool_take(ffn->pools, kind, ffn->pool_slot, bytes, held, wait, 2,
                                &t->gen[kind], &over, err);
    t->over = t->over || over;
    return m;
}

static clffn_status upload(clffn_ffn *ffn, clffn_pool_kind kind, size_t n, const float *src,
                           taken *t, cl_mem *out) {
    cl_int err;
    clffn_context *ctx = ffn->ctx;
    cl_mem m = take(ffn, kind, n * sizeof(float), t, &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if (src) {
        err = clffn__write(ctx->queue, m, 0, n * sizeof(float), src);
        if (err != CL_SUCCESS) {
            clReleaseMemObject(m);
            return (clffn_status)err;
        }
    }
    *out = m;
    return CLFFN_SUCCESS;
}

/* Whether an array the config needs is NULL (the matrices always; a bias with its flag; V and
 * bv when gated). */
static bool missing(const clffn_config *c, const void *w1, const void *v, const void *w2,
                    const float *b1, const float *bv, const float *b2) {
    return !w1 || !w2 || (c->bias1 && !b1) || (c->bias2 && !b2) ||
           (c->gated && (!v || (c->bias_gate && !bv)));
}

/* The biases (f32), each of its flag. */
static clffn_status upload_biases(clffn_ffn *ffn, const float *b1, const float *bv, const float *b2,
                                  taken *t, cl_mem m[6]) {
    const clffn_config *c = &ffn->cfg;
    clffn_status st = CLFFN_SUCCESS;
    if (c->bias1) { st = upload(ffn, CLFFN_POOL_B1, c->d_ff, b1, t, &m[1]); }
    if (st == CLFFN_SUCCESS && c->gated && c->bias_gate) {
        st = upload(ffn, CLFFN_POOL_BV, c->d_ff, bv, t, &m[2]);
    }
    if (st == CLFFN_SUCCESS && c->bias2) {
        st = upload(ffn, CLFFN_POOL_B2, c->d_model, b2, t, &m[4]);
    }
    return st;
}

/* The new buffers in place of the old weights when every upload succeeded (st), else released:
 * a refused upload leaves the FFN's weights as they were. One that failed part-way through
 * writing over the slots an expert's weights held leaves it without weights. */
static clffn_status install(clffn_ffn *ffn, clffn_status st, cl_mem m[6], const taken *t,
                            clffn_layout kept, clffn_layout given, clffn_dtype dtype) {
    if (st != CLFFN_SUCCESS) {
        for (int i = 0; i < 6; ++i) {
            if (m[i]) { clReleaseMemObject(m[i]); }
        }
        if (t->over) { clffn__ffn_weights_release(ffn); }
        return st;
    }
    clffn__ffn_weights_release(ffn);
    const clffn_buffer bufs[6] = {{m[0], 0}, {m[1], 0}, {NULL, 0}, {m[2], 0}, {m[3], 0}, {m[4], 0}};
    clffn__ffn_weights_set(ffn, kept, given, ffn->cfg.gated != 0, dtype, bufs);
    memcpy(ffn->pool_gen, t->gen, sizeof ffn->pool_gen);
    return CLFFN_SUCCESS;
}

clffn_status clffn_ffn_upload_weights(clffn_ffn *ffn, clffn_layout layout,
                                      const clffn_host_weights *w) {
    if (!ffn || !w) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    const clffn_config *c = &ffn->cfg;
    if (missing(c, w->w1, w->v, w->w2, w->b1, w->bv, w->b2)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    clffn_context *ctx = ffn->ctx;
    const clffn_layout kept = ctx->weight_layout;
    const size_t D = c->d_model, F = c->d_ff;
    cl_mem m[6] = {NULL}; /* w1 (stacked with V when gated), b1, bv, w2, b2 */
    taken t = {{0}, false};
    const float *const first[2] = {w->w1, c->gated ? w->v : NULL}, *const second[2] = {w->w2, NULL};
    clffn_status st = upload(ffn, CLFFN_POOL_W1, clffn__n1(c) * D, NULL, &t, &m[0]);
    if (st == CLFFN_SUCCESS) {
        st = (clffn_status)clffn__write_weight(ctx->queue, m[0], kept, layout, F, D, first);
    }
    if (st == CLFFN_SUCCESS) { st = upload(ffn, CLFFN_POOL_W2, D * F, NULL, &t, &m[3]); }
    if (st == CLFFN_SUCCESS) {
        st = (clffn_status)clffn__write_weight(ctx->queue, m[3], kept, layout, D, F, second);
    }
    if (st == CLFFN_SUCCESS) { st = upload_biases(ffn, w->b1, w->bv, w->b2, &t, m); }
    return install(ffn, st, m, &t, kept, layout, CLFFN_DTYPE_F32);
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
    clffn__ffn_weights_release(ffn);
    clffn_buffer bufs[6] = {{NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}};
    for (size_t i = 0; i < 6; ++i) {
        if (!checks[i].needed) { continue; }
        clRetainMemObject(checks[i].b->mem);
        bufs[i] = *checks[i].b;
    }
    clffn__ffn_weights_set(ffn, layout, layout, stacked, CLFFN_DTYPE_F32, bufs);
    return CLFFN_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Weights in their stored type */

/* Bytes of one of W1's or V's rows and of W2's as stored (the quantized types' shapes checked
 * first), and whether each matrix fits one allocation: a status, with a message when refused. */
static clffn_status typed_sizes(clffn_ffn *ffn, clffn_layout layout, clffn_dtype t, size_t *first,
                                size_t *second) {
    const clffn_config *c = &ffn->cfg;
    const size_t D = c->d_model, F = c->d_ff;
    const char *name = clffn_dtype_name(t);
    if (clffn__dtype_quantized(t)) {
        if (layout != CLFFN_LAYOUT_OUT_IN) {
            return clffn__ffn_refuse(ffn, CLFFN_ERROR_INVALID_LAYOUT,
                                     "%s weights are [out, in] (GGUF's blocks run along the "
                                     "input dimension): use CLFFN_LAYOUT_OUT_IN",
                                     name);
        }
        const char *which = D % CLFFN_QK ? "d_model, the input dimension of W1 and V"
                                         : "d_ff, the input dimension of W2";
        if (D % CLFFN_QK || F % CLFFN_QK) {
            return clffn__ffn_refuse(ffn, CLFFN_ERROR_INVALID_ARGUMENT,
                                     "%s weights need %s, to be a multiple of %d, not %zu", name,
                                     which, CLFFN_QK, D % CLFFN_QK ? D : F);
        }
    }
    size_t n1 = 0, n2 = 0;
    const int oi = layout == CLFFN_LAYOUT_OUT_IN;
    clffn_status st = clffn_dtype_bytes(t, oi ? D : clffn__n1(c), &n1);      /* a row of W1|V */
    if (st == CLFFN_SUCCESS) { st = clffn_dtype_bytes(t, oi ? F : D, &n2); } /* of W2 */
    if (st != CLFFN_SUCCESS) { return st; }
    if (!clffn__mul_ok(n1, oi ? clffn__n1(c) : D, first) ||
        !clffn__mul_ok(n2, oi ? D : F, second) || (cl_ulong)*first > ffn->ctx->max_alloc ||
        (cl_ulong)*second > ffn->ctx->max_alloc) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    return CLFFN_SUCCESS;
}

/* W1 and V into one buffer of `bytes`, as clffn_device_weights stacks them: V's rows after
 * W1's ([2F, D], OUT_IN), or each row W1's values then V's ([D, 2F], IN_OUT). One mapped
 * transfer, as clffn__write_weight does for f32: a buffer written in parts at different offsets
 * loses a strict simulator's tracking of what was written (docs/RELIABILITY.md). */
static cl_int write_first(cl_command_queue q, cl_mem m, clffn_layout layout, size_t bytes,
                          size_t rows, const void *w1, const void *v) {
    if (!v) { return clffn__write(q, m, 0, bytes, w1); }
    cl_int err;
    unsigned char *dst = clffn__map_write(q, m, bytes, &err);
    if (err != CL_SUCCESS) { return err; }
    const unsigned char *const parts[2] = {w1, v};
    if (layout == CLFFN_LAYOUT_OUT_IN) {
        memcpy(dst, w1, bytes / 2);
        memcpy(dst + bytes / 2, v, bytes / 2);
    } else {
        const size_t half = bytes / 2 / rows; /* one row of one of them */
        for (size_t r = 0; r < rows; ++r) {
            for (size_t p = 0; p < 2; ++p) {
                memcpy(dst + (2 * r + p) * half, parts[p] + r * half, half);
            }
        }
    }
    return clffn__unmap(q, m, dst);
}

clffn_status clffn_ffn_upload_weights_typed(clffn_ffn *ffn, clffn_layout layout,
                                            const clffn_typed_weights *w) {
    if (!ffn || !w) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ffn->message[0] = '\0';
    const clffn_config *c = &ffn->cfg;
    if (w->dtype == CLFFN_DTYPE_F32) {
        const clffn_host_weights hw = {w->w1, w->b1, w->v, w->bv, w->w2, w->b2};
        return clffn_ffn_upload_weights(ffn, layout, &hw);
    }
    if (!clffn_dtype_name(w->dtype)) {
        return clffn__ffn_refuse(ffn, CLFFN_ERROR_INVALID_ARGUMENT, "unknown weight type %d",
                                 (int)w->dtype);
    }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    if (missing(c, w->w1, w->v, w->w2, w->b1, w->bv, w->b2)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    size_t first = 0, second = 0;
    clffn_status st = typed_sizes(ffn, layout, w->dtype, &first, &second);
    if (st != CLFFN_SUCCESS) { return st; }
    clffn_context *ctx = ffn->ctx;
    cl_mem m[6] = {NULL}; /* w1 (with V), b1, bv, w2, b2 */
    taken t = {{0}, false};
    cl_int err;
    m[0] = take(ffn, CLFFN_POOL_W1, first, &t, &err);
    if (err == CL_SUCCESS) { m[3] = take(ffn, CLFFN_POOL_W2, second, &t, &err); }
    if (err == CL_SUCCESS) {
        const size_t rows = layout == CLFFN_LAYOUT_OUT_IN ? clffn__n1(c) : c->d_model;
        err = write_first(ctx->queue, m[0], layout, first, rows, w->w1, c->gated ? w->v : NULL);
    }
    if (err == CL_SUCCESS) { err = clffn__write(ctx->queue, m[3], 0, second, w->w2); }
    st = err == CL_SUCCESS ? upload_biases(ffn, w->b1, w->bv, w->b2, &t, m) : (clffn_status)err;
    return install(ffn, st, m, &t, layout, layout, w->dtype);
}

clffn_dtype clffn_ffn_weight_dtype(const clffn_ffn *ffn) {
    return ffn && ffn->has_weights ? ffn->w1.dtype : CLFFN_DTYPE_F32;
}

size_t clffn_ffn_weight_bytes(const clffn_ffn *ffn) { return ffn ? ffn->weight_bytes : 0; }
