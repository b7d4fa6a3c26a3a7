/* What the mixture-of-experts layer does inside that its API does not show: clffn_moe_route_few,
 * which routes, counts and places a few choices in one launch, against the three kernels it
 * stands for (cl/moe.cl); and the one scratch that the experts on the layer's context share. */
#include "clffn_defs.h"
#include "moe.h" /* the routing kernels' choice (few_choices), the experts' scratch */
#include "moe_data.h"

#include <stdlib.h>
#include <string.h>

/* n 32-bit values of one of a layer's buffers. */
static uint32_t *read_u32(clffn_moe *moe, cl_mem m, size_t n) {
    uint32_t *out = malloc(n * sizeof *out);
    cr_assert(out);
    cr_assert_eq(
        clEnqueueReadBuffer(moe->ctx->queue, m, CL_TRUE, 0, n * sizeof *out, out, 0, NULL, NULL),
        CL_SUCCESS);
    return out;
}

/* clffn_moe_route_few (route, count and place in one work-group, up to CLFFN_MOE_LANES choices:
 * cl/moe.cl) against the three kernels it stands for, on a second layer with few_choices 0: the
 * same choices, weights, counts, list of experts with rows, slots and outputs, to the bit, with
 * the counts on the device (where T allows) and read back. The same layer without its
 * route_few kernel fails such a forward, so the first layer's ran it. */
static void route_few_check(clffn_moe *moe, const moe_data *m, const moe_case *mc,
                            const char *what) {
    const size_t T = mc->tokens, D = m->c.expert.d_model, E = m->c.experts, n = T * m->c.top_k;
    cr_assert(n <= moe->few_choices && moe->few_choices == CLFFN_MOE_LANES, "%s", what);
    clffn_moe *l[2] = {moe, moe_make(moe->ctx, m)};
    l[1]->few_choices = 0;
    float *y = malloc(2 * T * D * sizeof *y), *wt = malloc(2 * n * sizeof *wt);
    int32_t *ch = malloc(2 * n * sizeof *ch);
    cr_assert(y && wt && ch);
    for (int host = 0; host < 2; ++host) {
        uint32_t *counts[2], *slot[2];
        for (int i = 0; i < 2; ++i) {
            ASSERT_OK(
                clffn_moe_set_counts(l[i], host ? CLFFN_MOE_COUNTS_HOST : CLFFN_MOE_COUNTS_DEVICE));
            ASSERT_OK(clffn_moe_forward_host(l[i], T, m->x, T * D, y + i * T * D, T * D, ch + i * n,
                                             wt + i * n));
            cr_assert_eq(l[i]->last_counted, !host && T <= CLFFN_MAX_KERNEL_TOKENS, "%s", what);
            counts[i] = read_u32(l[i], l[i]->counts, 2 * E + 1);
            slot[i] = read_u32(l[i], l[i]->slot, n);
        }
        cr_assert(!memcmp(ch, ch + n, n * sizeof *ch) && !memcmp(wt, wt + n, n * sizeof *wt),
                  "%s, host %d: the choice differs", what, host);
        cr_assert(!memcmp(counts[0], counts[1], (2 * E + 1) * sizeof *counts[0]),
                  "%s, host %d: the counts or the list differ", what, host);
        cr_assert(!memcmp(slot[0], slot[1], n * sizeof *slot[0]), "%s, host %d: the slots differ",
                  what, host);
        cr_assert(!memcmp(y, y + T * D, T * D * sizeof *y), "%s, host %d: y differs", what, host);
        for (int i = 0; i < 2; ++i) { free(counts[i]), free(slot[i]); }
    }
    cl_kernel kept = moe->route_few;
    moe->route_few = NULL;
    ASSERT_STATUS(clffn_moe_forward_host(moe, T, m->x, T * D, y, T * D, NULL, NULL),
                  (clffn_status)CL_INVALID_KERNEL);
    moe->route_few = kept;
    check_against_reference(moe, m, T, what);
    clffn_moe_destroy(l[1]);
    free(y), free(wt), free(ch);
}

Test(moe, route_few_gives_the_three_kernels_bits, .timeout = 300) {
    static const moe_case few[] = {
        {1, 8, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 0, 1, CLFFN_ACT_SILU, 0, 0},
        {16, 8, 4, CLFFN_ROUTING_TOPK, 1, 1, 0, CLFFN_ACT_GELU, 0, 0},            /* n = 64 */
        {3, 70, 1, CLFFN_ROUTING_TOPK_NORMALIZED, 0, 1, 1, CLFFN_ACT_SILU, 0, 0}, /* E > lanes */
        {8, 16, 8, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 0, 1, CLFFN_ACT_SILU, 1, 24},
        {32, 8, 2, CLFFN_ROUTING_TOPK, 0, 1, 1, CLFFN_ACT_RELU, 0, 0}, /* counts read back */
    };
    f32_kernel_max = CLFFN_MAX_KERNEL_TOKENS;
    each_case(few, sizeof few / sizeof few[0], 32, 40, 1700, route_few_check);
}

/* The router's logits a work-item each (clffn_moe_logits_rows, a CPU device's form) and a
 * work-group of CLFFN_MOE_LANES each (clffn_moe_logits) give the same bits: the probabilities
 * and the shared expert's gate, from x and a router drawn at random (so that the order of the
 * sums shows), D of 40 (lanes only partly filled) and 200 (three rows of lanes and a tail). */
Test(moe, router_logits_alike_in_both_forms, .timeout = 300) {
    static const moe_case c = {5, 70, 3, CLFFN_ROUTING_TOPK, 1, 1, 1, CLFFN_ACT_SILU, 1, 0};
    clffn_context *ctx = test_context();
    for (size_t D = 40; D <= 200; D += 160) {
        moe_data m;
        data_make(&m, &c, D, 24, 90 + D);
        fill_uniform(m.x, c.tokens * D, -1.0f, 1.0f, 7);
        fill_uniform(m.router, (c.experts + 1) * D, -0.3f, 0.3f, 8);
        clffn_moe *l[2] = {moe_make(ctx, &m), moe_make(ctx, &m)};
        l[1]->router_items = !l[0]->router_items;
        uint32_t *probs[2], *gate[2];
        float *y = malloc(c.tokens * D * sizeof *y);
        cr_assert(y);
        for (int i = 0; i < 2; ++i) {
            ASSERT_OK(clffn_moe_forward_host(l[i], c.tokens, m.x, c.tokens * D, y, c.tokens * D,
                                             NULL, NULL));
            probs[i] = read_u32(l[i], l[i]->probs, c.tokens * c.experts);
            gate[i] = read_u32(l[i], l[i]->gate, c.tokens);
        }
        cr_assert(!memcmp(probs[0], probs[1], c.tokens * c.experts * 4), "D %zu: probs", D);
        cr_assert(!memcmp(gate[0], gate[1], c.tokens * 4), "D %zu: the shared expert's gate", D);
        for (int i = 0; i < 2; ++i) { free(probs[i]), free(gate[i]), clffn_moe_destroy(l[i]); }
        free(y);
        data_free(&m);
    }
    clffn_context_destroy(ctx);
}

/* The experts on a layer's context share one scratch for their dequantized blocks and one for
 * CLBlast's copies (moe.h: one expert's at a time, not one an expert), and the layer computes
 * what the reference does on the dequantized weights with them, as they grow from one expert
 * and one token count to the next: experts in four types and a shared expert, 40 then 200
 * tokens (every product over f32 blocks on CLBlast, the crossover set below 40 whatever the
 * device's profile keeps the kernels to). No expert holds a scratch of its own. */
Test(moe, experts_share_one_scratch, .timeout = 300) {
    const moe_case mc = {200, 4, 2, CLFFN_ROUTING_TOPK_NORMALIZED, 1, 1, 1, CLFFN_ACT_SILU, 0, 0};
    static const clffn_dtype types[5] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_F16, CLFFN_DTYPE_Q4_0,
                                         CLFFN_DTYPE_BF16, CLFFN_DTYPE_Q8_0};
    moe_data m;
    data_make(&m, &mc, 64, 96, 1800);
    typed_set s[5];
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED, 16));
    ASSERT_OK(clffn_context_set_kernel_max_tokens(ctx, CLFFN_KERNELS_COMPRESSED_LARGE, 16));
    clffn_moe *moe = NULL;
    ASSERT_OK(clffn_moe_create(ctx, &m.c, &moe));
    ASSERT_OK(clffn_moe_upload_router(moe, m.router, m.bias));
    for (size_t e = 0; e < m.n_w; ++e) {
        const clffn_config ce = expert_config(&m, e);
        typed_make(&s[e], &ce, &m.w[e], types[e], CLFFN_LAYOUT_OUT_IN);
        m.hw[e] = s[e].ref; /* the reference takes the values the device holds */
        ASSERT_OK(clffn_ffn_upload_weights_typed(clffn_moe_expert(moe, e), CLFFN_LAYOUT_OUT_IN,
                                                 &s[e].typed));
    }
    check_against_reference(moe, &m, 40, "shared scratch, 40 tokens");
    check_against_reference(moe, &m, 200, "shared scratch, 200 tokens");
    /* CLBlast's copies only where its kernels need them (none on some devices' parameters) */
    cr_assert(moe->wscratch.mem, "the layer's scratch was used");
    for (size_t e = 0; e < m.n_w; ++e) {
        const clffn_ffn *f = clffn_moe_expert(moe, e);
        cr_assert(f->wk.shared == &moe->wscratch && f->shared_scratch == &moe->gscratch &&
                      !f->wk.own.mem && !f->scratch.mem,
                  "expert %zu has a scratch of its own", e);
    }
    clffn_moe_destroy(moe);
    for (size_t e = 0; e < m.n_w; ++e) { typed_free(&s[e]); }
    data_free(&m);
    clffn_context_destroy(ctx);
}
