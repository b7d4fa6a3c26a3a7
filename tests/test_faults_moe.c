/* Allocation failures in a mixture-of-experts layer (4 experts, k = 2, a shared one; the
 * fault-injection build of the library, as test_faults.c): its creation and forward with host
 * allocation n failing, then device allocation n, and its backward after a clean forward with
 * device allocation n failing. Each failure is a status, the caller's outputs keep what they
 * held, nothing leaks, and a run with nothing failing gives a clean run's values. The device
 * sweeps run three times: with the expert counts read back, and kept on the device (f32 experts
 * on clffn's own kernels; the backward then runs the routing again), at 3 tokens and at 20 (the
 * experts' rows in tiles). */
#include "clffn.h"
#include "fault.h"
#include "internal.h"
#include "moe.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

enum { D = 16, F = 24, TMAX = 20, ME = 4 };

static size_t T = 3; /* the sweep's tokens */
static int kept = 0; /* whether its forward keeps the counts on the device */

/* The layer with its weights (router and experts in steps of 1/8 and 1/32), or a status. */
static int moe_make(clffn_context *ctx, clffn_moe **out) {
    clffn_moe_config c = clffn_moe_config_default(D, F, ME, 2);
    c.shared_expert = 1;
    float router[ME * D], w[3 * F * D];
    for (size_t i = 0; i < ME * D; ++i) { router[i] = (float)((int)(i % 9) - 4) / 8.0f; }
    for (size_t i = 0; i < 3 * F * D; ++i) { w[i] = (float)((int)(i % 11) - 5) / 32.0f; }
    const clffn_host_weights hw = {w, NULL, w + F * D, NULL, w + 2 * F * D, NULL};
    clffn_moe *moe = NULL;
    int st = clffn_moe_create(ctx, &c, &moe);
    if (st == CLFFN_SUCCESS) { /* f32 experts in tiles, where only q8_0's and q4_0's would be */
        moe->group.tiles_any_type = true;
        st = clffn_moe_upload_router(moe, router, NULL);
    }
    for (size_t e = 0; e <= ME && st == CLFFN_SUCCESS; ++e) {
        st = clffn_ffn_upload_weights(clffn_moe_expert(moe, e), CLFFN_LAYOUT_OUT_IN, &hw);
    }
    if (st != CLFFN_SUCCESS) { clffn_moe_destroy(moe), moe = NULL; }
    *out = moe;
    return st;
}

static const float *input(void) {
    static float x[TMAX * D];
    for (size_t i = 0; i < T * D; ++i) { x[i] = (float)((int)(i % 13) - 6) / 8.0f; }
    return x;
}

/* Forward (backward = 0: made, run and destroyed while armed) or backward (backward = 1: the
 * forward unarmed first) into out [T·D]. */
static int run_once(clffn_context *ctx, int backward, int device, long n, float *out,
                    long *failed) {
    clffn_moe *moe = NULL;
    float y[TMAX * D], rg[ME * D];
    int st = CLFFN_SUCCESS;
    if (backward) {
        st = moe_make(ctx, &moe);
        if (st == CLFFN_SUCCESS) {
            st = clffn_moe_forward_host(moe, T, input(), T * D, y, T * D, NULL, NULL);
        }
        cr_assert_eq(st, CLFFN_SUCCESS, "the forward before the backward");
    }
    device ? clffn__fi_arm_device(n, 0) : clffn__fi_arm(n, 0);
    if (!backward) {
        st = moe_make(ctx, &moe);
        if (st == CLFFN_SUCCESS) {
            st = clffn_moe_forward_host(moe, T, input(), T * D, out, T * D, NULL, NULL);
        }
        cr_assert(st != CLFFN_SUCCESS || clffn_moe_counts_kept(moe) == kept,
                  "the counts were not where the sweep asks");
    } else {
        st = clffn_moe_backward_host(moe, T, input(), T * D, out, T * D, rg, NULL, NULL, 0);
    }
    *failed = device ? clffn__fi_device_failed() : clffn__fi_failed();
    device ? clffn__fi_arm_device(0, 0) : clffn__fi_arm(0, 0);
    clffn_moe_destroy(moe);
    return st;
}

/* counted: 0 the counts read back, 1 kept (3 tokens), 2 kept past a pass (20 tokens, tiles) */
static void sweep(int backward, int device, int counted) {
    clffn_context *ctx = NULL;
    cr_assert_eq(clffn_context_create_default(&ctx), CLFFN_SUCCESS);
    const size_t kmax[3] = {0, CLFFN_MAX_KERNEL_TOKENS, (size_t)1 << 30};
    cr_assert_eq(clffn_context_set_kernel_max_tokens(ctx, 0, kmax[counted]), CLFFN_SUCCESS);
    T = counted == 2 ? TMAX : 3;
    kept = counted != 0;
    float clean[TMAX * D], out[TMAX * D];
    long failed;
    cr_assert_eq(run_once(ctx, backward, device, 0, clean, &failed), CLFFN_SUCCESS);
    const long live0 = clffn__fi_live();
    long n = 1;
    for (;; ++n) {
        for (size_t i = 0; i < T * D; ++i) { out[i] = -3.0f; }
        const int st = run_once(ctx, backward, device, n, out, &failed);
        cr_assert_eq(clffn__fi_live(), live0, "allocation %ld failing: blocks leaked", n);
        if (failed == 0) {
            cr_assert_eq(st, CLFFN_SUCCESS);
            for (size_t i = 0; i < T * D; ++i) {
                cr_assert(fabsf(out[i] - clean[i]) <= 1e-6f * (1.0f + fabsf(clean[i])));
            }
            break;
        }
        cr_assert_eq(st, device ? CL_MEM_OBJECT_ALLOCATION_FAILURE : CLFFN_ERROR_OUT_OF_HOST_MEMORY,
                     "%s %s allocation %ld failing: %s", backward ? "backward" : "forward",
                     device ? "device" : "host", n, clffn_status_string(st));
        for (size_t i = 0; i < T * D; ++i) { cr_assert(out[i] == -3.0f, "out[%zu] changed", i); }
        cr_assert(n < 10000, "no end to the allocations");
    }
    cr_assert(n > 2, "fewer than two allocations failed in turn; vacuous");
    clffn_context_destroy(ctx);
}

Test(faults_moe, forward_host_allocations) { sweep(0, 0, 0); }
Test(faults_moe, forward_device_allocations) { sweep(0, 1, 0); }
Test(faults_moe, backward_device_allocations) { sweep(1, 1, 0); }
Test(faults_moe, forward_device_allocations_counts_on_device) { sweep(0, 1, 1); }
Test(faults_moe, backward_device_allocations_counts_on_device) { sweep(1, 1, 1); }
Test(faults_moe, forward_device_allocations_in_tiles) { sweep(0, 1, 2); }
Test(faults_moe, backward_device_allocations_in_tiles) { sweep(1, 1, 2); }
