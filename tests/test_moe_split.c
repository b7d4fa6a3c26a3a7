/* A mixture-of-experts layer split over an in-process group (clffn_moe_create_split), and one
 * partly held elsewhere (clffn_moe_create_partial, its other experts in clffn_moe_holders that
 * stand for other processes), against the same layer on one context. All contexts share the
 * test device, so each expert runs the kernels the whole layer runs on the same rows, and
 * everything must be the same bits: the choice, y, dx, the router's gradients and every
 * expert's, accumulated twice; dx alone; a layer with a gated shared expert; experts kept in
 * f16 at few tokens, where the whole layer keeps its counts on the device and runs each expert's
 * kernels as built for the pass's tokens; the owners; an exchange that fails; bad arguments. */
#include "common.h"
#include "moe.h" /* an expert's context, the layer's scratch */

#include <stdlib.h>
#include <string.h>

enum { D = 32, F = 40, E = 6, K = 2, T = 13, MAXG = 3 };

/* Router and experts of both layers, and the inputs: tokens ≤ T of them, the experts in dtype. */
typedef struct split_data {
    clffn_moe_config c;
    size_t tokens;
    clffn_dtype dtype;
    typed_set typed[E + 1];
    size_t rows, n_w; /* the router's rows; experts with weights (the shared one last) */
    float x[T * D], dy[T * D], router[(E + 1) * D], bias[E + 1];
    test_weights w[E + 1];
} split_data;

static void data_make(split_data *d, int shared_gate, clffn_dtype dtype, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->tokens = dtype == CLFFN_DTYPE_F32 ? T : 5; /* few: the counted pass of compressed experts */
    d->dtype = dtype;
    d->c = clffn_moe_config_default(D, F, E, K);
    d->c.routing = shared_gate ? CLFFN_ROUTING_TOPK : CLFFN_ROUTING_TOPK_NORMALIZED;
    d->c.router_bias = 1;
    d->c.shared_expert = shared_gate;
    d->c.shared_gate = shared_gate;
    d->rows = E + (shared_gate ? 1 : 0);
    d->n_w = E + (shared_gate ? 1 : 0);
    fill_uniform(d->x, T * D, -1.0f, 1.0f, seed);
    fill_uniform(d->dy, T * D, -1.0f, 1.0f, seed + 1);
    fill_uniform(d->router, d->rows * D, -0.5f, 0.5f, seed + 2);
    fill_uniform(d->bias, d->rows, -0.25f, 0.25f, seed + 3);
    for (size_t e = 0; e < d->n_w; ++e) {
        test_weights_make(&d->w[e], &d->c.expert, CLFFN_LAYOUT_OUT_IN, seed + 10 + e);
        if (dtype != CLFFN_DTYPE_F32) {
            typed_make(&d->typed[e], &d->c.expert, &d->w[e], dtype, CLFFN_LAYOUT_OUT_IN);
        }
    }
}

static void data_free(split_data *d) {
    for (size_t e = 0; e < d->n_w; ++e) {
        if (d->dtype != CLFFN_DTYPE_F32) { typed_free(&d->typed[e]); }
        test_weights_free(&d->w[e]);
    }
}

/* The experts [*first, *first + return) that owner r of count holds. */
static size_t held_by(int r, int count, size_t *first) {
    size_t n = 0;
    *first = E;
    for (size_t e = 0; e < E; ++e) {
        if (clffn_moe_expert_owner(e, E, count) == r) {
            *first = n ? *first : e;
            ++n;
        }
    }
    return n;
}

/* The other processes of a partial layer, in this one: holder r (1 ≤ r < count) on ctx[r]. */
typedef struct holders {
    int count, calls;
    clffn_status fail; /* what the exchange returns instead of running, when set */
    clffn_moe_holder *h[MAXG];
    const clffn_weight_arrays *grads[MAXG]; /* holder r's experts' gradient arrays */
} holders;

/* The exchange: each holder's rows, a contiguous run since the owners go up with e. */
static clffn_status exchange(void *user, int pass, const size_t *rows, const float *in,
                             float *out) {
    holders *hs = user;
    ++hs->calls;
    if (hs->fail != CLFFN_SUCCESS) { return hs->fail; }
    size_t at = 0;
    for (int r = 1; r < hs->count; ++r) {
        size_t first, n = 0;
        const size_t held = held_by(r, hs->count, &first);
        for (size_t e = first; e < first + held; ++e) { n += rows[e]; }
        const clffn_status st =
            clffn_moe_holder_run(hs->h[r], pass, rows, in + at * D, out + at * D, hs->grads[r]);
        if (st != CLFFN_SUCCESS) { return st; }
        at += n;
    }
    return CLFFN_SUCCESS;
}

static void upload(clffn_ffn *f, const split_data *d, size_t e) {
    cr_assert(f, "expert %zu", e);
    if (d->dtype == CLFFN_DTYPE_F32) {
        ASSERT_OK(clffn_ffn_upload_weights(f, CLFFN_LAYOUT_OUT_IN, &d->w[e].host));
    } else {
        ASSERT_OK(clffn_ffn_upload_weights_typed(f, CLFFN_LAYOUT_OUT_IN, &d->typed[e].typed));
    }
}

/* A split layer over count contexts; with hs, a partial one holding owner 0's experts on
 * ctx[0], the others' in hs's holders. */
static clffn_moe *layer(clffn_context *const *ctx, int count, const split_data *d, holders *hs) {
    clffn_moe *moe = NULL;
    size_t first;
    const size_t held = held_by(0, count, &first);
    if (hs) {
        ASSERT_OK(clffn_moe_create_partial(ctx[0], &d->c, first, held, exchange, hs, &moe));
        hs->count = count, hs->calls = 0, hs->fail = CLFFN_SUCCESS;
        for (int r = 1; r < count; ++r) {
            const size_t n = held_by(r, count, &first);
            ASSERT_OK(clffn_moe_holder_create(ctx[r], &d->c, first, n, &hs->h[r]));
            for (size_t e = first; e < first + n; ++e) {
                upload(clffn_moe_holder_expert(hs->h[r], e), d, e);
                cr_assert(!clffn_moe_expert(moe, e), "expert %zu is held elsewhere", e);
            }
        }
    } else {
        ASSERT_OK(clffn_moe_create_split(ctx, count, &d->c, &moe));
    }
    ASSERT_OK(clffn_moe_upload_router(moe, d->router, d->bias));
    if (count % 2) { ASSERT_OK(clffn_moe_set_grouping(moe, 1)); } /* no effect on a split one */
    for (size_t e = 0; e < d->n_w; ++e) {
        if (!hs || e >= E || clffn_moe_expert_owner(e, E, count) == 0) {
            upload(clffn_moe_expert(moe, e), d, e);
            /* a split layer's experts are in no pool: one of E slots would take room for the
             * experts held elsewhere (one context's layer pools them) */
            const unsigned gen = clffn_moe_expert(moe, e)->pool_gen[CLFFN_POOL_W1];
            cr_assert(e >= E || (count > 1 ? gen == 0 : gen != 0), "%d contexts, expert %zu", count,
                      e);
            /* the experts on the layer's context share its scratch, the others have their own:
             * they run at once, a thread a context */
            const clffn_ffn *f = clffn_moe_expert(moe, e);
            const int here = f->ctx == ctx[0];
            cr_assert(here ? f->wk.shared == &moe->wscratch && f->shared_scratch == &moe->gscratch
                           : !f->wk.shared && !f->shared_scratch,
                      "%d contexts, expert %zu: the scratch", count, e);
        }
    }
    for (int r = 1; hs && r < count; ++r) { /* a holder's experts share one of the holder's */
        size_t e0;
        const size_t n = held_by(r, count, &e0);
        const clffn_ffn *f0 = clffn_moe_holder_expert(hs->h[r], e0);
        for (size_t e = e0; e < e0 + n; ++e) {
            const clffn_ffn *f = clffn_moe_holder_expert(hs->h[r], e);
            cr_assert(f->wk.shared && f->wk.shared == f0->wk.shared && f->shared_scratch &&
                          f->shared_scratch == f0->shared_scratch,
                      "holder %d, expert %zu: the scratch", r, e);
        }
    }
    return moe;
}

static void holders_free(holders *hs) {
    for (int r = 1; hs && r < hs->count; ++r) { clffn_moe_holder_destroy(hs->h[r]); }
}

/* What one layer gives: y, the choice, dx, the router's gradients, each expert's. */
typedef struct outputs {
    float y[T * D], wt[T * K], dx[T * D], rg[(E + 1) * D], rbg[E + 1];
    int32_t ch[T * K];
    float *g[E + 1][6];
    size_t n[E + 1][6];
} outputs;

static void run(clffn_moe *moe, const split_data *d, int with_grads, outputs *o, holders *hs) {
    const size_t Fd = F * D;
    clffn_weight_arrays eg[E + 1];
    for (size_t e = 0; e < d->n_w; ++e) {
        const size_t n[6] = {Fd, 0, Fd, 0, Fd, 0}; /* SwiGLU experts without biases */
        for (int i = 0; i < 6; ++i) {
            o->n[e][i] = n[i];
            o->g[e][i] = n[i] ? calloc(n[i], sizeof(float)) : NULL;
            cr_assert(!n[i] || o->g[e][i]);
        }
        const clffn_weight_arrays a = {o->g[e][0], NULL, o->g[e][2], NULL, o->g[e][4], NULL};
        eg[e] = a;
    }
    for (int r = 1; hs && r < hs->count; ++r) { /* the holders' experts' arrays */
        size_t first;
        held_by(r, hs->count, &first);
        hs->grads[r] = with_grads ? &eg[first] : NULL;
    }
    const size_t n = d->tokens;
    ASSERT_OK(clffn_moe_forward_host(moe, n, d->x, n * D, o->y, n * D, o->ch, o->wt));
    for (int pass = 0; pass < 2; ++pass) { /* the second accumulates onto the first */
        ASSERT_OK(clffn_moe_backward_host(moe, n, d->dy, n * D, o->dx, n * D, o->rg, o->rbg,
                                          with_grads ? eg : NULL, pass));
    }
}

static void outputs_free(outputs *o, size_t n_w) {
    for (size_t e = 0; e < n_w; ++e) {
        for (int i = 0; i < 6; ++i) { free(o->g[e][i]); }
    }
}

static void same_bits(const void *a, const void *b, size_t bytes, const char *what, int count) {
    cr_assert(!memcmp(a, b, bytes), "%s over %d contexts differs from one context's", what, count);
}

static void compare(int shared_gate, int with_grads, int partial, clffn_dtype dtype) {
    clffn_context *ctx[MAXG];
    for (int i = 0; i < MAXG; ++i) { ctx[i] = test_context(); }
    split_data *d = malloc(sizeof *d);
    outputs *one = calloc(1, sizeof *one), *many = calloc(1, sizeof *many);
    cr_assert(d && one && many);
    data_make(d, shared_gate, dtype, 40 + (uint64_t)shared_gate);
    clffn_moe *ref = layer(ctx, 1, d, NULL);
    run(ref, d, with_grads, one, NULL);
    holders hs;
    memset(&hs, 0, sizeof hs);
    for (int count = 2; count <= MAXG; ++count) {
        clffn_moe *moe = layer(ctx, count, d, partial ? &hs : NULL);
        for (size_t e = 0; !partial && e < E; ++e) { /* the experts live where the owners are */
            const int owner = clffn_moe_expert_owner(e, E, count);
            cr_assert(clffn_moe_expert(moe, e)->ctx == ctx[owner], "expert %zu", e);
        }
        run(moe, d, with_grads, many, partial ? &hs : NULL);
        cr_assert(!partial || hs.calls == 3, "%d exchanges for a forward and two backwards",
                  hs.calls);
        same_bits(one->ch, many->ch, sizeof one->ch, "the choice", count);
        same_bits(one->y, many->y, sizeof one->y, "y", count);
        same_bits(one->dx, many->dx, sizeof one->dx, "dx", count);
        same_bits(one->rg, many->rg, d->rows * D * sizeof(float), "the router's gradient", count);
        same_bits(one->rbg, many->rbg, d->rows * sizeof(float), "the router bias's", count);
        for (size_t e = 0; with_grads && e < d->n_w; ++e) {
            for (int i = 0; i < 6; ++i) {
                if (!one->n[e][i]) { continue; }
                same_bits(one->g[e][i], many->g[e][i], one->n[e][i] * sizeof(float),
                          "an expert's gradient", count);
            }
        }
        size_t zeros = 0; /* dx carries every expert's rows and the router's term */
        for (size_t i = 0; i < d->tokens * D; ++i) { zeros += many->dx[i] == 0.0f; }
        cr_assert(zeros < d->tokens * D / 10, "dx is %zu zeros of %zu", zeros, d->tokens * D);
        outputs_free(many, d->n_w);
        memset(many, 0, sizeof *many);
        clffn_moe_destroy(moe);
        holders_free(partial ? &hs : NULL);
    }
    outputs_free(one, d->n_w);
    clffn_moe_destroy(ref);
    data_free(d);
    free(d), free(one), free(many);
    for (int i = 0; i < MAXG; ++i) { clffn_context_destroy(ctx[i]); }
}

Test(moe_split, equals_one_context, .timeout = 300) { compare(0, 1, 0, CLFFN_DTYPE_F32); }
Test(moe_split, with_a_gated_shared_expert, .timeout = 300) { compare(1, 1, 0, CLFFN_DTYPE_F32); }
Test(moe_split, dx_alone, .timeout = 300) { compare(0, 0, 0, CLFFN_DTYPE_F32); }
Test(moe_split, f16_experts_few_tokens, .timeout = 300) { compare(1, 0, 0, CLFFN_DTYPE_F16); }
Test(moe_partial, equals_one_context, .timeout = 300) { compare(0, 1, 1, CLFFN_DTYPE_F32); }
Test(moe_partial, with_a_gated_shared_expert, .timeout = 300) { compare(1, 1, 1, CLFFN_DTYPE_F32); }
Test(moe_partial, dx_alone, .timeout = 300) { compare(0, 0, 1, CLFFN_DTYPE_F32); }
Test(moe_partial, f16_experts_few_tokens, .timeout = 300) { compare(1, 0, 1, CLFFN_DTYPE_F16); }

/* Contiguous runs, the lower experts first, every context some; -1 out of range. */
Test(moe_split, owners) {
    for (int count = 1; count <= 8; ++count) {
        int prev = 0, seen[8] = {0};
        for (size_t e = 0; e < 8; ++e) {
            const int o = clffn_moe_expert_owner(e, 8, count);
            cr_assert(o >= prev && o < count, "expert %zu of 8 over %d: %d", e, count, o);
            prev = o, seen[o] = 1;
        }
        for (int i = 0; i < count; ++i) {
            cr_assert(seen[i], "context %d of %d owns none", i, count);
        }
    }
    cr_assert(clffn_moe_expert_owner(8, 8, 2) == -1 && clffn_moe_expert_owner(0, 0, 2) == -1 &&
              clffn_moe_expert_owner(0, 8, 0) == -1);
}

/* Bad groups get their status and no layer; the device-level backward of a split layer takes
 * no expert gradient buffers. */
Test(moe_split, bad_arguments) {
    clffn_context *ctx[2] = {test_context(), test_context()}, *holes[2] = {ctx[0], NULL};
    const clffn_moe_config c = clffn_moe_config_default(D, F, E, K);
    clffn_moe *moe = (clffn_moe *)&c; /* must stay as it is on error */
    cr_assert(clffn_moe_create_split(NULL, 2, &c, &moe) == CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert(clffn_moe_create_split(holes, 2, &c, &moe) == CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert(clffn_moe_create_split(ctx, 0, &c, &moe) == CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(clffn_moe_create_split(ctx, E + 1, &c, &moe) == CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(moe == (clffn_moe *)&c);
    split_data *d = malloc(sizeof *d);
    cr_assert(d);
    data_make(d, 0, CLFFN_DTYPE_F32, 7);
    moe = layer(ctx, 2, d, NULL);
    cl_int err;
    const size_t bytes = T * D * sizeof(float);
    cl_mem x =
        clCreateBuffer(clffn_context_cl_context(ctx[0]), CL_MEM_READ_WRITE, bytes, NULL, &err);
    cr_assert(err == CL_SUCCESS);
    cl_command_queue q = clffn_context_queue(ctx[0]);
    ASSERT_OK((clffn_status)clEnqueueWriteBuffer(q, x, CL_TRUE, 0, bytes, d->x, 0, NULL, NULL));
    ASSERT_OK(clffn_moe_forward(moe, T, x, 0, x, 0, q));
    clffn_device_weights ew[E];
    memset(ew, 0, sizeof ew);
    const clffn_moe_grads g = {{NULL, 0}, {NULL, 0}, ew};
    cr_assert(clffn_moe_backward(moe, T, x, 0, x, 0, NULL, 0, &g, 0, q) ==
              CLFFN_ERROR_INVALID_ARGUMENT);
    clReleaseMemObject(x);
    clffn_moe_destroy(moe);
    data_free(d);
    free(d);
    clffn_context_destroy(ctx[0]), clffn_context_destroy(ctx[1]);
}

/* An exchange that fails fails the pass with its status, and leaves the caller's arrays as
 * they were; the next pass, the exchange working again, is right. */
Test(moe_partial, a_failing_exchange, .timeout = 300) {
    clffn_context *ctx[2] = {test_context(), test_context()};
    split_data *d = malloc(sizeof *d);
    outputs *o = calloc(1, sizeof *o);
    float *y = malloc(T * D * sizeof *y);
    cr_assert(d && o && y);
    data_make(d, 0, CLFFN_DTYPE_F32, 11);
    holders hs;
    memset(&hs, 0, sizeof hs);
    clffn_moe *moe = layer(ctx, 2, d, &hs);
    hs.fail = (clffn_status)CL_MEM_OBJECT_ALLOCATION_FAILURE;
    for (size_t i = 0; i < T * D; ++i) { y[i] = 7.0f; }
    cr_assert(clffn_moe_forward_host(moe, T, d->x, T * D, y, T * D, NULL, NULL) ==
              (clffn_status)CL_MEM_OBJECT_ALLOCATION_FAILURE);
    for (size_t i = 0; i < T * D; ++i) { cr_assert(y[i] == 7.0f, "y[%zu] written", i); }
    cr_assert(hs.calls == 1);
    hs.fail = CLFFN_SUCCESS;
    run(moe, d, 0, o, &hs);
    clffn_moe *whole = layer(ctx, 1, d, NULL);
    ASSERT_OK(clffn_moe_forward_host(whole, T, d->x, T * D, y, T * D, NULL, NULL));
    same_bits(y, o->y, T * D * sizeof *y, "y after a failed pass", 2);
    clffn_moe_destroy(whole);
    clffn_moe_destroy(moe);
    holders_free(&hs);
    outputs_free(o, d->n_w);
    data_free(d);
    free(d), free(o), free(y);
    clffn_context_destroy(ctx[0]), clffn_context_destroy(ctx[1]);
}

/* Bad partial layers and holders get their status and nothing; a holder differentiates only
 * its last forward's rows. */
Test(moe_partial, bad_arguments) {
    clffn_context *ctx = test_context();
    const clffn_moe_config c = clffn_moe_config_default(D, F, E, K);
    clffn_moe *moe = (clffn_moe *)&c;
    clffn_moe_holder *h = (clffn_moe_holder *)&c;
    holders hs;
    memset(&hs, 0, sizeof hs);
    cr_assert(clffn_moe_create_partial(ctx, &c, 0, 2, NULL, &hs, &moe) ==
              CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert(clffn_moe_create_partial(ctx, &c, 0, 0, exchange, &hs, &moe) ==
              CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(clffn_moe_create_partial(ctx, &c, 4, E - 3, exchange, &hs, &moe) ==
              CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(clffn_moe_create_partial(ctx, &c, SIZE_MAX, 2, exchange, &hs, &moe) ==
              CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(clffn_moe_holder_create(NULL, &c, 0, 2, &h) == CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert(clffn_moe_holder_create(ctx, &c, 2, E - 1, &h) == CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert(moe == (clffn_moe *)&c && h == (clffn_moe_holder *)&c);
    ASSERT_OK(clffn_moe_holder_create(ctx, &c, 2, 3, &h));
    cr_assert(clffn_moe_holder_expert(h, 1) == NULL && clffn_moe_holder_expert(h, 5) == NULL);
    cr_assert(clffn_moe_holder_expert(h, 2) != NULL && clffn_moe_holder_expert(h, 4) != NULL);
    size_t rows[E] = {0, 0, 1, 0, 0, 0};
    float in[D] = {0}, out[D];
    cr_assert(clffn_moe_holder_run(h, CLFFN_MOE_PASS_BACKWARD, rows, in, out, NULL) ==
              CLFFN_ERROR_NO_FORWARD);
    cr_assert(clffn_moe_holder_run(h, 0, rows, NULL, out, NULL) == CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert(clffn_moe_holder_run(h, 0, rows, in, out, NULL) == CLFFN_ERROR_NO_WEIGHTS);
    clffn_moe_holder_destroy(h);
    clffn_context_destroy(ctx);
}
