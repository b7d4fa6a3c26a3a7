/* A mixture-of-experts layer split over three contexts (clffn_moe_create_split), for
 * ThreadSanitizer builds as a plain program (as tsan_threads.c, and for the same reason): the
 * experts on the second and third contexts run on threads of their own while the first
 * context's run in the caller's. Ten forwards and backwards must equal the unsplit layer's bit
 * for bit; TSan aborts the run on any report (halt_on_error=1, set by ctest), so a clean exit
 * means no race was seen. test_moe_split.c checks the values under Criterion. */
#include "clffn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 24, F = 40, E = 6, K = 2, T = 11, ROUNDS = 10, GROUP = 3 };

static float x[T * D], dy[T * D], router[E * D];

static clffn_moe *layer(clffn_context *const *ctx, int count, const float *w) {
    const clffn_moe_config c = clffn_moe_config_default(D, F, E, K);
    clffn_moe *moe = NULL;
    int ok = clffn_moe_create_split(ctx, count, &c, &moe) == CLFFN_SUCCESS &&
             clffn_moe_upload_router(moe, router, NULL) == CLFFN_SUCCESS;
    for (size_t e = 0; ok && e < E; ++e) { /* expert e: w shifted by e, so each differs */
        const clffn_host_weights hw = {w + e, NULL, w + e + F * D, NULL, w + e + 2 * F * D, NULL};
        ok = clffn_ffn_upload_weights(clffn_moe_expert(moe, e), CLFFN_LAYOUT_OUT_IN, &hw) ==
             CLFFN_SUCCESS;
    }
    if (!ok) { clffn_moe_destroy(moe), moe = NULL; }
    return moe;
}

/* y and dx of one forward and backward into out [2·T·D]. */
static int pass(clffn_moe *moe, float *out) {
    return clffn_moe_forward_host(moe, T, x, T * D, out, T * D, NULL, NULL) == CLFFN_SUCCESS &&
           clffn_moe_backward_host(moe, T, dy, T * D, out + T * D, T * D, NULL, NULL, NULL, 0) ==
               CLFFN_SUCCESS;
}

int main(void) {
    static float w[3 * F * D + E], want[2 * T * D], got[2 * T * D];
    unsigned s = 12345u;
    for (size_t i = 0; i < sizeof w / sizeof *w; ++i) {
        s = s * 1103515245u + 12345u;
        w[i] = (float)((int)(s >> 16) % 201 - 100) / 400.0f;
    }
    for (size_t i = 0; i < T * D; ++i) {
        x[i] = (float)((int)(i * 7 % 31) - 15) / 16.0f, dy[i] = (float)((int)(i % 5) - 2) / 4.0f;
    }
    for (size_t i = 0; i < E * D; ++i) { router[i] = (float)((int)(i * 3 % 17) - 8) / 16.0f; }
    clffn_context *ctx[GROUP] = {NULL};
    int ok = 1;
    for (int i = 0; ok && i < GROUP; ++i) {
        ok = clffn_context_create_default(&ctx[i]) == CLFFN_SUCCESS;
    }
    clffn_moe *one = ok ? layer(ctx, 1, w) : NULL, *split = ok ? layer(ctx, GROUP, w) : NULL;
    ok = one && split && pass(one, want);
    long bad = 0;
    for (int r = 0; ok && r < ROUNDS; ++r) {
        ok = pass(split, got);
        bad += ok && memcmp(got, want, sizeof got) != 0;
    }
    clffn_moe_destroy(one), clffn_moe_destroy(split);
    for (int i = 0; i < GROUP; ++i) { clffn_context_destroy(ctx[i]); }
    if (!ok || bad) {
        fprintf(stderr, "tsan_moe_split: %s\n", ok ? "a split pass differs" : "a call failed");
        return 1;
    }
    printf("tsan_moe_split: %d split passes over %d contexts equal the unsplit layer's\n", ROUNDS,
           GROUP);
    return 0;
}
