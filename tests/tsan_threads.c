/* The thread test for ThreadSanitizer builds (-DCLFFN_SANITIZE=thread), as a plain program:
 * Criterion's runner cannot start under TSan ("Could not initialize inheritable arena"), while
 * POCL and CLBlast run fine. 8 threads × 100 host-level forwards on two shared contexts (below),
 * each thread with its own FFN; every result must equal the single-threaded one bit for bit. TSan
 * aborts the run on any report (halt_on_error=1 is set by ctest), so a clean exit means no
 * race was seen. test_threads.c runs the same check, and the device-level one, under Criterion. */
#define CLFFN_HOOKS /* clffn_context_set_xgemm */
#include "clffn.h"
#include "xgemm_sets.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define ROUNDS 100
#define TOK 9
#define DM 24
#define DF 40

/* two contexts on the device whose products want different Xgemm sets (TOK tokens are on the
 * large side of the first's threshold and the few side of the second's): odd threads use the
 * second, so the threads hold the device in turns to switch CLBlast's parameters */
static clffn_context *ctx[2];
static clffn_config cfg;
static float x[TOK * DM], want[2][TOK * DM];

static void *worker(void *arg) {
    const int k = (int)(size_t)arg % 2;
    clffn_ffn *ffn = NULL;
    float y[TOK * DM];
    if (clffn_ffn_create(ctx[k], &cfg, &ffn) != CLFFN_SUCCESS ||
        clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, 7) != CLFFN_SUCCESS) {
        clffn_ffn_destroy(ffn);
        return (void *)1;
    }
    long bad = 0;
    for (int r = 0; r < ROUNDS; ++r) {
        if (clffn_forward_host(ffn, TOK, x, TOK * DM, y, TOK * DM) != CLFFN_SUCCESS ||
            memcmp(y, want[k], sizeof y) != 0) {
            ++bad;
        }
    }
    clffn_ffn_destroy(ffn);
    return (void *)bad;
}

int main(void) {
    cfg = clffn_config_default(DM, DF);
    cfg.gated = 1;
    cfg.activation = CLFFN_ACT_SILU;
    for (int i = 0; i < TOK * DM; ++i) { x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f; }
    for (int k = 0; k < 2; ++k) {
        clffn_ffn *ffn = NULL;
        if (clffn_context_create_default(&ctx[k]) != CLFFN_SUCCESS ||
            /* CLBlast's products, whose sets the threads switch, whatever the profile */
            clffn_context_set_kernel_max_tokens(ctx[k], CLFFN_KERNELS_F32, 0) != CLFFN_SUCCESS ||
            clffn_context_set_xgemm(ctx[k], 16, test_xgemm_names, test_xgemm_wide,
                                    test_xgemm_narrow, k ? 64 : 1) != CLFFN_SUCCESS ||
            clffn_ffn_create(ctx[k], &cfg, &ffn) != CLFFN_SUCCESS ||
            clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, 7) != CLFFN_SUCCESS ||
            clffn_forward_host(ffn, TOK, x, TOK * DM, want[k], TOK * DM) != CLFFN_SUCCESS) {
            return 1;
        }
        clffn_ffn_destroy(ffn);
    }
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; ++t) { pthread_create(&th[t], NULL, worker, (void *)(size_t)t); }
    long bad = 0;
    for (int t = 0; t < THREADS; ++t) {
        void *r = NULL;
        pthread_join(th[t], &r);
        bad += (long)r;
    }
    clffn_context_destroy(ctx[0]);
    clffn_context_destroy(ctx[1]);
    printf("%d threads x %d forwards: %ld differed or failed\n", THREADS, ROUNDS, bad);
    return bad != 0;
}
