/* FFNs sharing their context's scratch (clffn_context_set_shared_scratch): the same bits as FFNs
 * with scratch of their own, forward and backward interleaved across layers, one scratch of
 * each kind as large as the largest of theirs, released with its last user; mixture-of-experts
 * layers' experts on it too. */
#include "common.h"
#include "ffn.h" /* the FFNs' scratch */
#include "moe.h" /* the experts */
#include "moe_data.h"

#include <stdlib.h>
#include <string.h>

enum { T = 40, LAYERS = 3 };

/* Three layers a model might stack: compressed weights past the kernels' crossover (their
 * products dequantize blocks for SGEMM, each FFN into its scratch) and f32 ones (CLBlast's pad
 * copies at 40 tokens), one gated. */
static const struct layer_case {
    size_t D, F;
    int gated;
    clffn_dtype dtype;
} LAYER_CASES[LAYERS] = {
    {64, 96, 1, CLFFN_DTYPE_F16},
    {96, 160, 0, CLFFN_DTYPE_Q8_0},
    {64, 72, 0, CLFFN_DTYPE_F32},
};

typedef struct layer {
    clffn_config c;
    test_weights w;
    typed_set ts;
    clffn_ffn *ffn;
    float *x, *dy, *y, *dx;
} layer;

/* A context whose compressed products all go through dequantized blocks, each product's whole
 * inner dimension one block (the GPU profiles' way, where the scratch is largest). */
static clffn_context *scratch_context(int shared) {
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED, 0));
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_F32, 0));
    ASSERT_OK(clffn_context_set_gemm_k_block(ctx, 0));
    ASSERT_OK(clffn_context_set_shared_scratch(ctx, shared));
    cr_assert_eq(clffn_context_shared_scratch(ctx), shared);
    return ctx;
}

static void layer_make(layer *L, clffn_context *ctx, int i) {
    const struct layer_case *lc = &LAYER_CASES[i];
    L->c = clffn_config_default(lc->D, lc->F);
    L->c.gated = lc->gated;
    L->c.activation = lc->gated ? CLFFN_ACT_SILU : CLFFN_ACT_GELU;
    test_weights_make(&L->w, &L->c, CLFFN_LAYOUT_OUT_IN, 50 + (uint64_t)i);
    typed_make(&L->ts, &L->c, &L->w, lc->dtype, CLFFN_LAYOUT_OUT_IN);
    ASSERT_OK(clffn_ffn_create(ctx, &L->c, &L->ffn));
    ASSERT_OK(clffn_ffn_upload_weights_typed(L->ffn, CLFFN_LAYOUT_OUT_IN, &L->ts.typed));
    const size_t n = T * lc->D;
    L->x = malloc(n * sizeof *L->x), L->dy = malloc(n * sizeof *L->dy);
    L->y = malloc(n * sizeof *L->y), L->dx = malloc(n * sizeof *L->dx);
    cr_assert(L->x && L->dy && L->y && L->dx);
    fill_uniform(L->x, n, -1, 1, 60 + (uint64_t)i);
    fill_uniform(L->dy, n, -1, 1, 70 + (uint64_t)i);
}

static void layer_free(layer *L) {
    clffn_ffn_destroy(L->ffn);
    typed_free(&L->ts);
    test_weights_free(&L->w);
    free(L->x), free(L->dy), free(L->y), free(L->dx);
}

/* Every layer's forward, then every backward (∂x) in reverse, as a model's training step runs
 * them: each backward after other layers' forwards have used the scratch. */
static void run_layers(layer *Ls) {
    for (int i = 0; i < LAYERS; ++i) {
        const size_t n = T * Ls[i].c.d_model;
        ASSERT_OK(clffn_forward_host(Ls[i].ffn, T, Ls[i].x, n, Ls[i].y, n));
    }
    for (int i = LAYERS - 1; i >= 0; --i) {
        const size_t n = T * Ls[i].c.d_model;
        ASSERT_OK(clffn_backward_host(Ls[i].ffn, T, Ls[i].x, n, Ls[i].dy, n, Ls[i].dx, n, NULL, 0));
    }
}

/* The layers on a context that shares its scratch give the bits of the same layers each with
 * scratch of its own (and y matches the double reference); the shared scratch of each kind is
 * the largest of theirs, and no layer holds one of its own. */
Test(scratch, shared_by_the_layers, .timeout = 300) {
    clffn_context *own_ctx = scratch_context(0), *ctx = scratch_context(1);
    layer own[LAYERS], shared[LAYERS];
    for (int i = 0; i < LAYERS; ++i) {
        layer_make(&own[i], own_ctx, i);
        layer_make(&shared[i], ctx, i);
    }
    run_layers(own);
    run_layers(shared);
    size_t most_w = 0, most_g = 0;
    for (int i = 0; i < LAYERS; ++i) {
        const size_t n = T * own[i].c.d_model;
        double *ref = malloc(n * sizeof *ref);
        cr_assert(ref);
        ASSERT_OK(clffn_reference_forward(&own[i].c, CLFFN_LAYOUT_OUT_IN, &own[i].ts.ref, T,
                                          own[i].x, 0, 0, 0, ref, NULL));
        assert_close(shared[i].y, ref, n, act_rtol(own[i].c.activation), "shared scratch, y");
        free(ref);
        cr_assert(memcmp(own[i].y, shared[i].y, n * sizeof(float)) == 0, "layer %d: y", i);
        cr_assert(memcmp(own[i].dx, shared[i].dx, n * sizeof(float)) == 0, "layer %d: dx", i);
        const clffn_ffn *o = own[i].ffn, *s = shared[i].ffn;
        if (o->wk.own.bytes > most_w) { most_w = o->wk.own.bytes; }
        if (o->scratch.bytes > most_g) { most_g = o->scratch.bytes; }
        cr_assert(s->wk.shared == &ctx->shared->w && s->shared_scratch == &ctx->shared->g);
        cr_assert(s->wk.own.mem == NULL && s->scratch.mem == NULL, "layer %d has its own", i);
    }
    /* the compressed layers dequantized whole products into it: W1|V of layer 0, 192 × 64 */
    cr_assert(most_w >= 192 * 64 * sizeof(float), "%zu", most_w);
    cr_assert_eq(ctx->shared->w.bytes, most_w);
    cr_assert_eq(ctx->shared->g.bytes, most_g);
    cr_assert_eq(ctx->shared->users, LAYERS);
    /* a layer made after sharing is turned off keeps its own; the others still share */
    ASSERT_OK(clffn_context_set_shared_scratch(ctx, 0));
    cr_assert_eq(clffn_context_shared_scratch(ctx), 0);
    layer late;
    layer_make(&late, ctx, 0);
    cr_assert(late.ffn->ctx_shared == NULL && late.ffn->wk.shared == NULL);
    layer_free(&late);
    for (int i = 0; i < LAYERS; ++i) {
        cr_assert_not_null(ctx->shared, "released with layer %d of %d left", i, LAYERS);
        layer_free(&shared[i]);
        layer_free(&own[i]);
    }
    cr_assert_null(ctx->shared, "not released with its last user");
    ASSERT_STATUS(clffn_context_set_shared_scratch(NULL, 1), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_eq(clffn_context_shared_scratch(NULL), 0);
    clffn_context_destroy(ctx);
    clffn_context_destroy(own_ctx);
}

/* A mixture-of-experts layer made on a sharing context runs its experts on the context's
 * scratch (not a layer's own), beside a dense layer on it, and matches the reference. */
Test(scratch, experts_share_the_context_scratch, .timeout = 300) {
    clffn_context *ctx = scratch_context(1);
    const moe_case mc = {33, 8, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 1, 1, CLFFN_ACT_SILU, 0, 0};
    moe_data m;
    data_make(&m, &mc, 64, 96, 11);
    clffn_moe *moe = moe_make(ctx, &m);
    layer dense;
    layer_make(&dense, ctx, 1);
    for (size_t e = 0; e < moe->n_ffn; ++e) {
        cr_assert(moe->ffn[e]->wk.shared == &ctx->shared->w, "expert %zu", e);
        cr_assert(moe->ffn[e]->shared_scratch == &ctx->shared->g, "expert %zu", e);
    }
    for (int round = 0; round < 2; ++round) {
        check_against_reference(moe, &m, mc.tokens, "experts on the context's scratch");
        const size_t n = T * dense.c.d_model;
        ASSERT_OK(clffn_forward_host(dense.ffn, T, dense.x, n, dense.y, n));
        double *ref = malloc(n * sizeof *ref);
        cr_assert(ref);
        ASSERT_OK(clffn_reference_forward(&dense.c, CLFFN_LAYOUT_OUT_IN, &dense.ts.ref, T, dense.x,
                                          0, 0, 0, ref, NULL));
        assert_close(dense.y, ref, n, act_rtol(dense.c.activation), "dense beside the experts");
        free(ref);
    }
    cr_assert_eq(moe->wscratch.mem, NULL);
    cr_assert_eq(ctx->shared->users, moe->n_ffn + 1);
    layer_free(&dense);
    clffn_moe_destroy(moe);
    cr_assert_null(ctx->shared);
    data_free(&m);
    clffn_context_destroy(ctx);
}
