/* Device memory exhaustion. On POCL the device's memory is the process's: POCL_MEMORY_LIMIT
 * caps what the device reports (and so the largest single allocation, a quarter of it), and
 * RLIMIT_AS makes the allocations themselves fail. Either way a forward or backward that does not
 * fit must return a clear status, leave the caller's output as it was, leak nothing, and leave
 * the context and the FFN usable for a shape that fits. Each test runs in its own process
 * (Criterion), so the limits end with it. */
#include "common.h"

#include <clblast_c.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1 /* ASan reserves terabytes of shadow: an address-space limit cannot work */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* An address-space limit cannot work under ASan (terabytes of shadow) or valgrind (which maps
 * its own memory in the same space). */
static int rlimit_unusable(void) {
    const char *pre = getenv("LD_PRELOAD");
    return UNDER_ASAN || (pre && strstr(pre, "vgpreload"));
}

static cl_uint context_refs(clffn_context *ctx) {
    /* CLBlast's program cache holds a reference until cleared; POCL drops its own from finished
     * commands shortly after they complete */
    CLBlastClearCache();
    cl_uint refs = 0, last = 0;
    for (int i = 0; i < 50; ++i) {
        clGetContextInfo(clffn_context_cl_context(ctx), CL_CONTEXT_REFERENCE_COUNT, sizeof refs,
                         &refs, NULL);
        if (i && refs == last) { break; }
        last = refs;
        const struct timespec ms20 = {0, 20000000};
        nanosleep(&ms20, NULL);
    }
    return refs;
}

/* The FFN still computes right for T tokens (inference), after a failure. */
static void forward_fits(clffn_ffn *ffn, const clffn_config *c, const test_weights *w, size_t T) {
    ASSERT_OK(clffn_ffn_set_training(ffn, 0));
    assert_host_forward(ffn, c, w, T, "forward after exhaustion");
}

/* A workspace larger than the device's largest allocation is refused before anything is
 * enqueued. On POCL, POCL_MEMORY_LIMIT=1 (GB) makes that limit 256 MB, so the test stays small;
 * another device (this showed on an NVIDIA GPU, which ignores the variable) is tested at its own
 * limit. */
Test(memory, workspace_beyond_the_largest_allocation) {
    setenv("POCL_MEMORY_LIMIT", "1", 1);
    clffn_context *ctx = test_context();
    const cl_device_id dev = clffn_context_cl_device(ctx);
    cl_platform_id platform;
    char name[256] = "";
    clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
    cl_ulong global = 0, max_alloc = 0;
    clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    if (strstr(name, "Portable Computing Language")) {
        cr_assert(global <= (1ull << 30), "POCL_MEMORY_LIMIT was not applied (%llu bytes)",
                  (unsigned long long)global);
    }
    clffn_config c = clffn_config_default(64, 4096);
    c.activation = CLFFN_ACT_SILU;
    c.gated = 1;
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 3);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    /* z is [T, 2F] floats: the fewest tokens past the largest allocation, and 10% more */
    const size_t D = c.d_model, T = (size_t)(max_alloc / (2 * c.d_ff * sizeof(float))) * 11 / 10;
    cr_assert(T * D * sizeof(float) < max_alloc, "x and y themselves would not fit");
    guarded gx = guarded_make(ctx, CANARY, T * D, NULL);
    guarded gy = guarded_make(ctx, CANARY, T * D, NULL);
    const cl_uint refs0 = context_refs(ctx);
    ASSERT_STATUS(
        clffn_forward(ffn, T, gx.mem, gx.offset, gy.mem, gy.offset, clffn_context_queue(ctx), NULL),
        CLFFN_ERROR_SIZE_OVERFLOW);
    float *y = malloc(T * D * sizeof *y), *x = calloc(T * D, sizeof *x);
    cr_assert(y && x);
    guarded_read(ctx, &gy, y);
    for (size_t i = 0; i < T * D; ++i) { cr_assert(y[i] == CANARY_VALUE, "y [%zu] written", i); }
    guarded_assert_canaries(ctx, &gy, "y");
    for (size_t i = 0; i < T * D; ++i) { y[i] = 3.5f; }
    ASSERT_STATUS(clffn_forward_host(ffn, T, x, T * D, y, T * D), CLFFN_ERROR_SIZE_OVERFLOW);
    for (size_t i = 0; i < T * D; ++i) { cr_assert(y[i] == 3.5f, "host y [%zu] written", i); }
    /* the backward of a forward that could not run: said so, nothing written */
    float *dx = malloc(T * D * sizeof *dx);
    cr_assert(dx);
    for (size_t i = 0; i < T * D; ++i) { dx[i] = 3.5f; }
    float *g = malloc(3 * D * c.d_ff * sizeof *g);
    const clffn_weight_arrays ga = {g, g, g + D * c.d_ff, g, g + 2 * D * c.d_ff, g};
    ASSERT_STATUS(clffn_backward_host(ffn, T, x, T * D, x, T * D, dx, T * D, &ga, 0),
                  CLFFN_ERROR_NO_FORWARD);
    for (size_t i = 0; i < T * D; ++i) { cr_assert(dx[i] == 3.5f, "dx [%zu] written", i); }
    cr_assert_eq(context_refs(ctx), refs0, "a failed call left OpenCL objects behind");

    forward_fits(ffn, &c, &w, 100); /* the context and the FFN still work */
    free(g);
    free(dx);
    free(x);
    free(y);
    guarded_free(&gx);
    guarded_free(&gy);
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}

static size_t address_space_used(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert(f);
    unsigned long pages = 0;
    cr_assert_eq(fscanf(f, "%lu", &pages), 1);
    fclose(f);
    return (size_t)pages * 4096;
}

static void limit_address_space(size_t headroom) {
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_AS, &rl), 0);
    rl.rlim_cur = address_space_used() + headroom;
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
}

static void unlimit_address_space(void) {
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_AS, &rl), 0);
    rl.rlim_cur = rl.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_AS, &rl), 0);
}

static int is_memory_status(int st) {
    return st == CL_OUT_OF_HOST_MEMORY || st == CL_MEM_OBJECT_ALLOCATION_FAILURE ||
           st == CL_OUT_OF_RESOURCES || st == CLFFN_ERROR_OUT_OF_HOST_MEMORY;
}

/* A gated 64 → 1024 FFN with weights uploaded, for the RLIMIT_AS tests. */
static clffn_ffn *gated_ffn(clffn_context *ctx, clffn_activation act, uint64_t seed,
                            clffn_config *c, test_weights *w) {
    *c = clffn_config_default(64, 1024);
    c->gated = 1;
    c->activation = act;
    test_weights_make(w, c, CLFFN_LAYOUT_OUT_IN, seed);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, c, &ffn));
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w->host));
    return ffn;
}

/* The allocations themselves fail: the process may grow by 32 MB, the forward needs ~200 MB of
 * workspace. The status is OpenCL's out-of-memory code, passed through. */
Test(memory, forward_allocation_fails) {
    if (rlimit_unusable()) {
        cr_skip_test("an address-space limit does not work under ASan or valgrind");
    }
    clffn_context *ctx = test_context();
    clffn_config c;
    test_weights w;
    clffn_ffn *ffn = gated_ffn(ctx, CLFFN_ACT_GELU, 4, &c, &w);
    forward_fits(ffn, &c, &w, 16);         /* CLBlast's kernels compiled before the limit */
    const size_t T = 24000, D = c.d_model; /* z: 24000 × 2048 floats = 197 MB */
    guarded gx = guarded_make(ctx, CANARY, T * D, NULL);
    guarded gy = guarded_make(ctx, CANARY, T * D, NULL);
    const cl_uint refs0 = context_refs(ctx);
    limit_address_space(32u << 20);
    const int st =
        clffn_forward(ffn, T, gx.mem, gx.offset, gy.mem, gy.offset, clffn_context_queue(ctx), NULL);
    const int fin = clFinish(clffn_context_queue(ctx));
    unlimit_address_space();
    cr_assert(is_memory_status(st), "forward: %s", clffn_status_string(st));
    cr_assert_eq(fin, CL_SUCCESS);
    float *y = malloc(T * D * sizeof *y);
    cr_assert(y);
    guarded_read(ctx, &gy, y);
    for (size_t i = 0; i < T * D; ++i) { cr_assert(y[i] == CANARY_VALUE, "y [%zu] written", i); }
    free(y);
    guarded_assert_canaries(ctx, &gy, "y");
    cr_assert_eq(context_refs(ctx), refs0, "the failed forward left OpenCL objects behind");
    guarded_free(&gx);
    guarded_free(&gy);

    forward_fits(ffn, &c, &w, 37);
    forward_fits(ffn, &c, &w, T); /* and the shape that failed, now that memory is back */
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}

/* The same for the backward: its dh and dz ([T, F] and [T, 2F]) do not fit after a forward that
 * did; the gradients and dx keep what they held. */
Test(memory, backward_allocation_fails) {
    if (rlimit_unusable()) {
        cr_skip_test("an address-space limit does not work under ASan or valgrind");
    }
    clffn_context *ctx = test_context();
    clffn_config c;
    test_weights w;
    clffn_ffn *ffn = gated_ffn(ctx, CLFFN_ACT_SILU, 5, &c, &w);
    ASSERT_OK(clffn_ffn_set_training(ffn, 1));
    const size_t T = 24000, D = c.d_model, F = c.d_ff;
    float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y);
    float *dx = malloc(T * D * sizeof *dx), *g = malloc((3 * D * F + 2 * F + D) * sizeof *g);
    cr_assert(x && y && dx && g);
    fill_uniform(x, T * D, -1.0f, 1.0f, 6);
    for (size_t i = 0; i < T * D; ++i) { dx[i] = 2.5f; }
    for (size_t i = 0; i < 3 * D * F + 2 * F + D; ++i) { g[i] = 2.5f; }
    const clffn_weight_arrays ga = {
        g, g + 3 * D * F, g + D * F, g + 3 * D * F + F, g + 2 * D * F, g + 3 * D * F + 2 * F};
    ASSERT_OK(clffn_forward_host(ffn, 16, x, 16 * D, y, 16 * D)); /* compile, then the real one */
    ASSERT_OK(clffn_backward_host(ffn, 16, x, 16 * D, x, 16 * D, dx, 16 * D, &ga, 0));
    for (size_t i = 0; i < T * D; ++i) { dx[i] = 2.5f; }
    for (size_t i = 0; i < 3 * D * F + 2 * F + D; ++i) { g[i] = 2.5f; }
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    const cl_uint refs0 = context_refs(ctx);

    limit_address_space(32u << 20);
    const int st = clffn_backward_host(ffn, T, x, T * D, y, T * D, dx, T * D, &ga, 0);
    unlimit_address_space();
    cr_assert(is_memory_status(st), "backward: %s", clffn_status_string(st));
    for (size_t i = 0; i < T * D; ++i) { cr_assert(dx[i] == 2.5f, "dx [%zu] written", i); }
    for (size_t i = 0; i < 3 * D * F + 2 * F + D; ++i) {
        cr_assert(g[i] == 2.5f, "gradient [%zu] written", i);
    }
    cr_assert_eq(context_refs(ctx), refs0, "the failed backward left OpenCL objects behind");

    /* the same backward once memory is back, against the reference (a few tokens' worth of
     * checking would do, but the shape that failed is the point) */
    ASSERT_OK(clffn_backward_host(ffn, T, x, T * D, y, T * D, dx, T * D, &ga, 0));
    for (size_t i = 0; i < T * D; ++i) { cr_assert(isfinite(dx[i]) && dx[i] != 2.5f); }
    forward_fits(ffn, &c, &w, 19);
    free(x);
    free(y);
    free(dx);
    free(g);
    clffn_ffn_destroy(ffn);
    test_weights_free(&w);
    clffn_context_destroy(ctx);
}
