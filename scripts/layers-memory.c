/* A stack of SwiGLU FFN layers with weights in a stored type, each run in turn on one batch of
 * tokens as a model's layers run, with each layer keeping its own scratch or with the layers
 * sharing their context's (clffn_context_set_shared_scratch): the process's peak memory after
 * the forwards, and a checksum of the output, which must not depend on the sharing.
 *
 *   cc -O2 -o /tmp/layers-memory scripts/layers-memory.c -Iinclude -Lbuild -lclffn \
 *      -Wl,-rpath,$PWD/build -lOpenCL
 *   /tmp/layers-memory own|shared [LAYERS D F TOKENS TYPE]     (default 4 2048 5632 300 f16)
 *
 * On a CPU device the device's buffers are the process's memory, so its peak shows the
 * scratch. The GPU profiles dequantize each product's whole inner dimension at once
 * (GEMM_K_BLOCK 0), the POCL profile in blocks of 256; a profile file under CLFFN_TUNE_DIR
 * with "GEMM_K_BLOCK": 0 makes POCL do as a GPU does (docs/PERFORMANCE.md). */
#include "clffn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static int fail(const char *what, clffn_status st) {
    fprintf(stderr, "layers-memory: %s: %s\n", what, clffn_status_string(st));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "own") && strcmp(argv[1], "shared"))) {
        fprintf(stderr, "usage: layers-memory own|shared [LAYERS D F TOKENS TYPE]\n");
        return 2;
    }
    const int shared = !strcmp(argv[1], "shared");
    const int L = argc > 2 ? atoi(argv[2]) : 4;
    const size_t D = argc > 3 ? strtoul(argv[3], NULL, 10) : 2048;
    const size_t F = argc > 4 ? strtoul(argv[4], NULL, 10) : 5632;
    const size_t T = argc > 5 ? strtoul(argv[5], NULL, 10) : 300;
    clffn_dtype type = CLFFN_DTYPE_F16;
    if ((argc > 6 && clffn_dtype_parse(argv[6], &type) != CLFFN_SUCCESS) || L < 1 || !D || !F ||
        !T) {
        fprintf(stderr, "layers-memory: bad arguments\n");
        return 2;
    }
    clffn_context *ctx = NULL;
    clffn_status st = clffn_context_create_default(&ctx);
    if (st != CLFFN_SUCCESS) { return fail("opening the device", st); }
    if ((st = clffn_context_set_shared_scratch(ctx, shared)) != CLFFN_SUCCESS) {
        return fail("sharing the scratch", st);
    }
    clffn_config c = clffn_config_default(D, F);
    c.gated = 1, c.activation = CLFFN_ACT_SILU, c.bias1 = c.bias2 = c.bias_gate = 0;
    size_t bytes;
    if ((st = clffn_dtype_bytes(type, D * F, &bytes)) != CLFFN_SUCCESS) {
        return fail("sizing the weights", st);
    }
    float *w = malloc(D * F * sizeof *w), *x = malloc(T * D * sizeof *x);
    float *y = malloc(T * D * sizeof *y);
    void *q[3] = {malloc(bytes), malloc(bytes), malloc(bytes)};
    clffn_ffn **ffn = calloc((size_t)L, sizeof *ffn);
    if (!w || !x || !y || !q[0] || !q[1] || !q[2] || !ffn) { return 1; }
    uint64_t s = 1;
    for (int m = 0; m < 3; ++m) { /* uniform in ±1/sqrt(fan-in), as nn.Linear starts */
        const float scale = 2.0f / (float)(m == 2 ? F : D);
        for (size_t i = 0; i < D * F; ++i) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * scale * 16.0f;
        }
        if ((st = clffn_convert_weights(type, w, D * F, q[m], bytes)) != CLFFN_SUCCESS) {
            return fail("converting the weights", st);
        }
    }
    free(w);
    const clffn_typed_weights tw = {type, q[0], q[1], q[2], NULL, NULL, NULL};
    for (int l = 0; l < L; ++l) {
        if ((st = clffn_ffn_create(ctx, &c, &ffn[l])) != CLFFN_SUCCESS ||
            (st = clffn_ffn_upload_weights_typed(ffn[l], CLFFN_LAYOUT_OUT_IN, &tw)) !=
                CLFFN_SUCCESS) {
            return fail("making a layer", st);
        }
    }
    free(q[0]), free(q[1]), free(q[2]);
    for (size_t i = 0; i < T * D; ++i) { x[i] = (float)(i % 17) / 17.0f - 0.5f; }
    for (int l = 0; l < L; ++l) { /* x + FFN(x), layer by layer */
        if ((st = clffn_forward_host(ffn[l], T, x, T * D, y, T * D)) != CLFFN_SUCCESS) {
            return fail("a forward", st);
        }
        for (size_t i = 0; i < T * D; ++i) { x[i] += y[i]; }
    }
    double sum = 0;
    for (size_t i = 0; i < T * D; ++i) { sum += x[i] < 0 ? -x[i] : x[i]; }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("%s scratch: %d layers of %zu -> %zu, %zu tokens, %s: peak %ld MB, sum |y| %.9g\n",
           shared ? "shared" : "own", L, D, F, T, clffn_dtype_name(type), ru.ru_maxrss / 1024, sum);
    for (int l = 0; l < L; ++l) { clffn_ffn_destroy(ffn[l]); }
    clffn_context_destroy(ctx);
    free(ffn), free(x), free(y);
    return 0;
}
