/* clffn-bench-gemms: each SGEMM of the FFN's forward and backward alone, on the context's tuned
 * CLBlast, with the operand arrangement clffn uses (row-major, OUT_IN weights), so a slow pass
 * can be traced to one product. Buffers are filled first: an untouched POCL buffer reads the
 * kernel's shared zero page and makes every product look faster than it is. Each product runs
 * through clffn_sgemm, the library's own path, with the context's K-block or --k-block's.
 *   clffn-bench-gemms [--tokens T] [--d-model D] [--d-ff F] [--gated] [--reps N] [--k-block N] */
#define CLFFN_HOOKS /* clffn_sgemm, the path the library runs */
#include "clffn.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The value of option name into *out (left as it is when the option is absent); -1 when it is
 * not an integer in [min, max]. */
static int arg(int argc, char **argv, const char *name, size_t min, size_t max, size_t *out) {
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], name) != 0) { continue; }
        if (tool_parse_size(i + 1 < argc ? argv[i + 1] : NULL, min, max, out) != 0) {
            fprintf(stderr, "clffn-bench-gemms: %s needs an integer %zu ... %zu\n", name, min, max);
            return -1;
        }
    }
    return 0;
}

static int tool_main(int argc, char **argv) {
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            puts("usage: clffn-bench-gemms [--tokens T] [--d-model D] [--d-ff F] [--gated] [--reps "
                 "N]\n"
                 "                         [--k-block N]   (default: the tuning profile's block)");
            return 0;
        }
    }
    int gated = 0;
    for (int i = 1; i < argc; ++i) { gated |= strcmp(argv[i], "--gated") == 0; }
    size_t T = 2048, D = 1024, F = 2816, reps = 3, k_block = 0;
    const size_t big = (size_t)1 << 30;
    if (arg(argc, argv, "--tokens", 1, big, &T) || arg(argc, argv, "--d-model", 1, big, &D) ||
        arg(argc, argv, "--d-ff", 1, big, &F) || arg(argc, argv, "--reps", 1, 100000, &reps) ||
        arg(argc, argv, "--k-block", 0, CLFFN_MAX_GEMM_K_BLOCK, &k_block)) {
        return 2;
    }
    const size_t N1 = gated ? 2 * F : F;
    clffn_context *ctx = NULL;
    int st = clffn_context_create_default(&ctx);
    if (st != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-bench-gemms: %s\n", clffn_status_string(st));
        return 1;
    }
    for (int i = 1; i < argc; ++i) { /* else the tuning profile's block */
        if (strcmp(argv[i], "--k-block") == 0) { clffn_context_set_gemm_k_block(ctx, k_block); }
    }
    k_block = clffn_context_gemm_k_block(ctx);
    cl_context cx = clffn_context_cl_context(ctx);
    cl_command_queue q = clffn_context_queue(ctx);
    /* A holds every first operand (x, h, dy, dz: [T, max(N1, D)]); B every second one (the
     * weights [N1, D], h [T, F], x [T, D]); C every product */
    const size_t na = T * (N1 > D ? N1 : D);
    size_t nw = N1 * D;
    if (T * F > nw) { nw = T * F; }
    if (T * D > nw) { nw = T * D; }
    const size_t nc = na > nw ? na : nw;
    cl_int err = CL_SUCCESS;
    cl_mem A = clCreateBuffer(cx, CL_MEM_READ_WRITE, na * 4, NULL, &err);
    cl_mem B = err == CL_SUCCESS ? clCreateBuffer(cx, CL_MEM_READ_WRITE, nw * 4, NULL, &err) : NULL;
    cl_mem C = err == CL_SUCCESS ? clCreateBuffer(cx, CL_MEM_READ_WRITE, nc * 4, NULL, &err) : NULL;
    const float va = 0.37f, vb = -0.21f, vc = 0.1f;
    if (err == CL_SUCCESS) { err = clEnqueueFillBuffer(q, A, &va, 4, 0, na * 4, 0, NULL, NULL); }
    if (err == CL_SUCCESS) { err = clEnqueueFillBuffer(q, B, &vb, 4, 0, nw * 4, 0, NULL, NULL); }
    if (err == CL_SUCCESS) { err = clEnqueueFillBuffer(q, C, &vc, 4, 0, nc * 4, 0, NULL, NULL); }
    if (err == CL_SUCCESS) { err = clFinish(q); }
    int rc = 0;
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clffn-bench-gemms: buffers: %s\n", clffn_status_string(err));
        rc = 1;
    }
    const struct {
        const char *name;
        clffn_transpose ta, tb;
        size_t m, n, k, lda, ldb, ldc;
    } g[] = {
        {"forward 1: x·[W1|V]^T", CLFFN_NO_TRANS, CLFFN_TRANS, T, N1, D, D, D, N1},
        {"forward 2: h·W2^T", CLFFN_NO_TRANS, CLFFN_TRANS, T, D, F, F, F, D},
        {"backward dh = dy·W2", CLFFN_NO_TRANS, CLFFN_NO_TRANS, T, F, D, D, F, F},
        {"backward dW2 = dy^T·h", CLFFN_TRANS, CLFFN_NO_TRANS, D, F, T, D, F, F},
        {"backward dW1|dV = dz^T·x", CLFFN_TRANS, CLFFN_NO_TRANS, N1, D, T, N1, D, D},
        {"backward dx = dz·[W1|V]", CLFFN_NO_TRANS, CLFFN_NO_TRANS, T, D, N1, N1, D, D},
    };
    printf("%zu tokens, %zu -> %zu%s, K-block %zu, best of %zu after one untimed call\n", T, D, F,
           gated ? " gated" : "", k_block, reps);
    for (size_t i = 0; rc == 0 && i < sizeof g / sizeof g[0]; ++i) {
        double best = 1e30;
        for (size_t r = 0; r <= reps; ++r) {
            const double t0 = tool_now_s();
            err = clffn_sgemm(ctx, g[i].ta, g[i].tb, g[i].m, g[i].n, g[i].k, 1.0f, A, 0, g[i].lda,
                              B, 0, g[i].ldb, 0.0f, C, 0, g[i].ldc, q, NULL);
            if (err == CL_SUCCESS) { err = clFinish(q); }
            if (err != CL_SUCCESS) {
                fprintf(stderr, "clffn-bench-gemms: %s: %s\n", g[i].name, clffn_status_string(err));
                rc = 1;
                break;
            }
            const double t = tool_now_s() - t0;
            if (r > 0 && t < best) { best = t; }
        }
        if (rc != 0) { break; }
        printf("%-26s %9.1f ms %7.1f GFLOP/s\n", g[i].name, best * 1e3,
               2.0 * (double)g[i].m * (double)g[i].n * (double)g[i].k / best * 1e-9);
    }
    const cl_mem bufs[] = {A, B, C};
    for (size_t i = 0; i < 3; ++i) {
        if (bufs[i]) { clReleaseMemObject(bufs[i]); }
    }
    clffn_context_destroy(ctx);
    return rc;
}

int main(int argc, char **argv) { return tool_exit("clffn-bench-gemms", tool_main(argc, argv)); }
