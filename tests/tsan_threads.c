/* The thread test for ThreadSanitizer builds (-DCLFFN_SANITIZE=thread), as a plain program:
 * Criterion's runner cannot start under TSan ("Could not initialize inheritable arena"), while
 * POCL and CLBlast run fine. 8 threads × 100 host-level forwards on one shared context, each
 * thread with its own FFN; every result must equal the single-threaded one bit for bit. TSan
 * aborts the run on any report (halt_on_error=1 is set by ctest), so a clean exit means no
 * race was seen. test_threads.c runs the same check, and the device-level one, under Criterion. */
#include "clffn.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define ROUNDS 100
#define TOK 9
#define DM 24
#define DF 40

static clffn_context *ctx;
static clffn_config cfg;
static float x[TOK * DM], want[TOK * DM];

static void *worker(void *arg) {
    (void)arg;
    clffn_ffn *ffn = NULL;
    float y[TOK * DM];
    if (clffn_ffn_create(ctx, &cfg, &ffn) != CLFFN_SUCCESS ||
        clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, 7) != CLFFN_SUCCESS) {
        clffn_ffn_destroy(ffn);
        return (void *)1;
    }
    long bad = 0;
    for (int r = 0; r < ROUNDS; ++r) {
        if (clffn_forward_host(ffn, TOK, x, TOK * DM, y, TOK * DM) != CLFFN_SUCCESS ||
            memcmp(y, want, sizeof y) != 0) {
            ++bad;
        }
    }
    clffn_ffn_destroy(ffn);
    return (void *)bad;
}

int main(void) {
    if (clffn_context_create_default(&ctx) != CLFFN_SUCCESS) { return 1; }
    cfg = clffn_config_default(DM, DF);
    cfg.gated = 1;
    cfg.activation = CLFFN_ACT_SILU;
    for (int i = 0; i < TOK * DM; ++i) { x[i] = (float)((i * 7) % 13) / 13.0f - 0.5f; }
    clffn_ffn *ffn = NULL;
    if (clffn_ffn_create(ctx, &cfg, &ffn) != CLFFN_SUCCESS ||
        clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, 7) != CLFFN_SUCCESS ||
        clffn_forward_host(ffn, TOK, x, TOK * DM, want, TOK * DM) != CLFFN_SUCCESS) {
        return 1;
    }
    clffn_ffn_destroy(ffn);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; ++t) { pthread_create(&th[t], NULL, worker, NULL); }
    long bad = 0;
    for (int t = 0; t < THREADS; ++t) {
        void *r = NULL;
        pthread_join(th[t], &r);
        bad += (long)r;
    }
    clffn_context_destroy(ctx);
    printf("%d threads x %d forwards: %ld differed or failed\n", THREADS, ROUNDS, bad);
    return bad != 0;
}
