/* clffn-run with no checkpoint: the demo. The classic FFN (batch 64, seq 10, d_model 512, d_ff
 * 2048, ReLU, dropout 0.1 in inference mode) with nn.Linear's initialisation from a fixed seed,
 * timed, its hidden layer read back, and its output checked against the CPU reference. */
#include "run.h"
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { BATCH = 64, SEQ = 10, D_MODEL = 512, D_FF = 2048, REPS = 5 };
static const uint64_t WEIGHT_SEED = 42;

/* The demo's host arrays: one block of weights (W1, W2, b1, b2), x, y, the hidden layer read
 * back, and the reference. */
typedef struct demo_data {
    float *block, *x, *y, *hidden;
    double *ref;
    clffn_weight_arrays wa;
} demo_data;

static void demo_free(demo_data *d) {
    free(d->block), free(d->x), free(d->y), free(d->hidden), free(d->ref);
}

/* Allocates the arrays and fills the weights (as nn.Linear initialises them, on the host so the
 * reference sees the same ones) and x ~ U(-1, 1). 0, or -1 with the failure reported. */
static int demo_data_make(demo_data *d, const clffn_config *cfg) {
    const size_t T = (size_t)BATCH * SEQ;
    const size_t nw = 2 * (size_t)D_MODEL * D_FF + D_FF + D_MODEL;
    d->block = malloc(nw * sizeof *d->block);
    d->x = malloc(T * D_MODEL * sizeof *d->x);
    d->y = malloc(T * D_MODEL * sizeof *d->y);
    d->hidden = malloc(T * D_FF * sizeof *d->hidden);
    d->ref = malloc(T * D_MODEL * sizeof *d->ref);
    if (!d->block || !d->x || !d->y || !d->hidden || !d->ref) {
        run_report("out of memory");
        return -1;
    }
    float *b = d->block;
    const size_t w = (size_t)D_MODEL * D_FF;
    d->wa = (clffn_weight_arrays){b, b + 2 * w, NULL, NULL, b + w, b + 2 * w + D_FF};
    const clffn_status st = clffn_init_weights_host(cfg, CLFFN_INIT_TORCH_LINEAR, WEIGHT_SEED,
                                                    CLFFN_LAYOUT_OUT_IN, &d->wa);
    if (st != CLFFN_SUCCESS) {
        run_fail("initialising weights", st);
        return -1;
    }
    /* like torch.randn's spread without its tails; xorshift keeps it portable */
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < T * D_MODEL; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        d->x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    return 0;
}

/* The first forward (which builds CLBlast's kernels) and the best of REPS after it. */
static clffn_status demo_time(clffn_ffn *ffn, const demo_data *d, double *first, double *best) {
    const size_t n = (size_t)BATCH * SEQ * D_MODEL;
    const double t0 = tool_now_s();
    clffn_status st = clffn_forward_host(ffn, (size_t)BATCH * SEQ, d->x, n, d->y, n);
    *first = tool_now_s() - t0;
    *best = INFINITY;
    for (int r = 0; r < REPS && st == CLFFN_SUCCESS; ++r) {
        const double t1 = tool_now_s();
        st = clffn_forward_host(ffn, (size_t)BATCH * SEQ, d->x, n, d->y, n);
        const double dt = tool_now_s() - t1;
        if (dt < *best) { *best = dt; }
    }
    return st;
}

static void demo_print(const char *name, const clffn_config *cfg, size_t hidden_rows, double best,
                       double first, const tool_comparison *cmp) {
    const double flops = 2.0 * 2.0 * (double)BATCH * SEQ * D_MODEL * D_FF;
    printf("clffn %s — position-wise FFN demo\n", clffn_version_string());
    printf("device:        %s\n", name);
    printf("FFN:           d_model %d, d_ff %d, %s, dropout %.1f (inference mode)\n", D_MODEL, D_FF,
           clffn_activation_name(cfg->activation), (double)cfg->dropout);
    printf("input shape:   (%d, %d, %d)\n", BATCH, SEQ, D_MODEL);
    printf("hidden shape:  (%zu, %d, %d)   [w_1(x), read back]\n", hidden_rows / SEQ, SEQ, D_FF);
    printf("output shape:  (%d, %d, %d)\n", BATCH, SEQ, D_MODEL);
    printf(
        "time:          %.3f ms per forward (best of %d; first call %.3f s incl. kernel builds)\n",
        best * 1e3, REPS, first);
    printf("throughput:    %.1f GFLOP/s\n", flops / best * 1e-9);
    printf("max error:     %.3g vs CPU reference in double (tolerance %.3g): %s\n", cmp->max_err,
           cmp->tol, cmp->pass ? "PASS" : "FAIL");
}

/* The demo on an open device: the exit status. */
static int demo_run(clffn_context *ctx, clffn_ffn *ffn, const clffn_config *cfg, demo_data *d) {
    const size_t T = (size_t)BATCH * SEQ;
    char name[256];
    clffn_status st;
    if ((st = clffn_context_device_name(ctx, name, sizeof name)) != CLFFN_SUCCESS) {
        return run_fail("querying the device", st);
    }
    if (demo_data_make(d, cfg) != 0) { return EXIT_RUNTIME; }
    const clffn_host_weights hw = {d->wa.w1, d->wa.b1, NULL, NULL, d->wa.w2, d->wa.b2};
    if ((st = clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &hw)) != CLFFN_SUCCESS) {
        return run_fail("uploading weights", st);
    }
    double first, best;
    if ((st = demo_time(ffn, d, &first, &best)) != CLFFN_SUCCESS) {
        return run_fail("running the forward pass", st);
    }
    size_t ht = 0;
    if ((st = clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_PRE, d->hidden, T * D_FF, &ht)) !=
        CLFFN_SUCCESS) {
        return run_fail("reading the hidden tensor", st);
    }
    if ((st = clffn_reference_forward(cfg, CLFFN_LAYOUT_OUT_IN, &hw, T, d->x, 0, 0, 0, d->ref,
                                      NULL)) != CLFFN_SUCCESS) {
        return run_fail("running the CPU reference", st);
    }
    const tool_comparison cmp = tool_compare(d->y, d->ref, T * D_MODEL, 1e-5, 1e-6);
    demo_print(name, cfg, ht, best, first, &cmp);
    return cmp.pass ? 0 : EXIT_RUNTIME;
}

int run_demo(const char *device) {
    const clffn_config cfg = clffn_config_default(D_MODEL, D_FF); /* ReLU, biases, dropout 0.1 */
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    demo_data d = {0};
    clffn_status st = clffn_context_create_for_device(device, &ctx);
    if (st == CLFFN_PLATFORM_NOT_FOUND) {
        run_report("no OpenCL platform found; install one, e.g. `apt-get install "
                   "pocl-opencl-icd` for the CPU.");
        return EXIT_RUNTIME;
    }
    if (st != CLFFN_SUCCESS) { return run_fail("opening the device", st); }
    int rc;
    if ((st = clffn_ffn_create(ctx, &cfg, &ffn)) != CLFFN_SUCCESS) {
        rc = run_fail("creating the FFN", st);
        if (*clffn_context_build_log(ctx)) {
            fprintf(stderr, "%s\n", clffn_context_build_log(ctx));
        }
    } else {
        rc = demo_run(ctx, ffn, &cfg, &d);
    }
    demo_free(&d);
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    return rc;
}
