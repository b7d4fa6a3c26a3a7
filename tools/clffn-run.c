/* clffn-run: with no arguments, the demo — the seed tutorials' FFN (batch 64, seq 10,
 * d_model 512, d_ff 2048, ReLU, dropout 0.1 in inference mode, nn.Linear initialisation from a
 * fixed seed) on the default device, checked against the CPU reference.
 *
 * Exit status: 0 success, 1 device or runtime failure (or an error beyond tolerance), 2 usage. */
#include "clffn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BATCH = 64, SEQ = 10, D_MODEL = 512, D_FF = 2048, REPS = 5 };
static const uint64_t WEIGHT_SEED = 42;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, clffn_status st) {
    fprintf(stderr, "clffn-run: %s: %s\n", what, clffn_status_string(st));
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: clffn-run            run the demo FFN on the default device\n"
               "       clffn-run --help     this text\n"
               "The device comes from CLFFN_DEVICE (\"platform:device\" or a name substring),\n"
               "else the first GPU, else the first OpenCL device.\n");
}

static int demo(void) {
    const size_t T = (size_t)BATCH * SEQ;
    clffn_config cfg = clffn_config_default(D_MODEL, D_FF); /* ReLU, biases, dropout 0.1 */
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    int rc = 1;
    float *block = NULL, *x = NULL, *y = NULL, *hidden = NULL;
    double *ref = NULL;

    clffn_status st = clffn_context_create_default(&ctx);
    if (st == CLFFN_PLATFORM_NOT_FOUND) {
        fprintf(stderr, "clffn-run: no OpenCL platform found; install one, e.g. "
                        "`apt-get install pocl-opencl-icd` for the CPU.\n");
        return 1;
    }
    if (st != CLFFN_SUCCESS) { return fail("opening the default device", st); }
    char name[256];
    if ((st = clffn_context_device_name(ctx, name, sizeof name)) != CLFFN_SUCCESS) {
        rc = fail("querying the device", st);
        goto done;
    }
    if ((st = clffn_ffn_create(ctx, &cfg, &ffn)) != CLFFN_SUCCESS) {
        rc = fail("creating the FFN", st);
        if (*clffn_context_build_log(ctx)) { fprintf(stderr, "%s\n", clffn_context_build_log(ctx)); }
        goto done;
    }

    /* weights as nn.Linear initialises them, on the host so the reference sees the same ones */
    const size_t nw = 2 * (size_t)D_MODEL * D_FF + D_FF + D_MODEL;
    block = malloc(nw * sizeof *block);
    x = malloc(T * D_MODEL * sizeof *x);
    y = malloc(T * D_MODEL * sizeof *y);
    hidden = malloc(T * D_FF * sizeof *hidden);
    ref = malloc(T * D_MODEL * sizeof *ref);
    if (!block || !x || !y || !hidden || !ref) {
        fprintf(stderr, "clffn-run: out of memory\n");
        goto done;
    }
    const clffn_weight_arrays wa = {block, block + 2 * (size_t)D_MODEL * D_FF, NULL, NULL,
                                    block + (size_t)D_MODEL * D_FF,
                                    block + 2 * (size_t)D_MODEL * D_FF + D_FF};
    if ((st = clffn_init_weights_host(&cfg, CLFFN_INIT_TORCH_LINEAR, WEIGHT_SEED,
                                      CLFFN_LAYOUT_OUT_IN, &wa)) != CLFFN_SUCCESS) {
        rc = fail("initialising weights", st);
        goto done;
    }
    const clffn_host_weights hw = {wa.w1, wa.b1, NULL, NULL, wa.w2, wa.b2};
    if ((st = clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &hw)) != CLFFN_SUCCESS) {
        rc = fail("uploading weights", st);
        goto done;
    }
    /* x ~ U(-1, 1), like torch.randn's spread without its tails; xorshift keeps it portable */
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < T * D_MODEL; ++i) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }

    /* the first forward builds CLBlast's kernels; time the ones after it */
    const double t0 = now_s();
    st = clffn_forward_host(ffn, T, x, T * D_MODEL, y, T * D_MODEL);
    const double first = now_s() - t0;
    double best = INFINITY;
    for (int r = 0; r < REPS && st == CLFFN_SUCCESS; ++r) {
        const double t1 = now_s();
        st = clffn_forward_host(ffn, T, x, T * D_MODEL, y, T * D_MODEL);
        const double dt = now_s() - t1;
        if (dt < best) { best = dt; }
    }
    if (st != CLFFN_SUCCESS) {
        rc = fail("running the forward pass", st);
        goto done;
    }
    size_t ht = 0;
    if ((st = clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_PRE, hidden, T * D_FF, &ht)) != CLFFN_SUCCESS) {
        rc = fail("reading the hidden tensor", st);
        goto done;
    }

    if ((st = clffn_reference_forward(&cfg, CLFFN_LAYOUT_OUT_IN, &hw, T, x, 0, 0, 0, ref, NULL)) !=
        CLFFN_SUCCESS) {
        rc = fail("running the CPU reference", st);
        goto done;
    }
    double max_ref = 0.0, max_err = 0.0;
    for (size_t i = 0; i < T * D_MODEL; ++i) {
        max_ref = fmax(max_ref, fabs(ref[i]));
        max_err = fmax(max_err, fabs((double)y[i] - ref[i]));
        if (isnan(y[i])) { max_err = INFINITY; }
    }
    const double tol = 1e-5 * max_ref + 1e-6;
    const double flops = 2.0 * 2.0 * (double)T * D_MODEL * D_FF;

    printf("clffn %s — position-wise FFN demo\n", clffn_version_string());
    printf("device:        %s\n", name);
    printf("FFN:           d_model %d, d_ff %d, %s, dropout %.1f (inference mode)\n", D_MODEL,
           D_FF, clffn_activation_name(cfg.activation), (double)cfg.dropout);
    printf("input shape:   (%d, %d, %d)\n", BATCH, SEQ, D_MODEL);
    printf("hidden shape:  (%d, %d, %zu)   [w_1(x), read back]\n", BATCH, SEQ, ht / SEQ / BATCH * D_FF);
    printf("output shape:  (%d, %d, %d)\n", BATCH, SEQ, D_MODEL);
    printf("time:          %.3f ms per forward (best of %d; first call %.3f s incl. kernel builds)\n",
           best * 1e3, REPS, first);
    printf("throughput:    %.1f GFLOP/s\n", flops / best * 1e-9);
    printf("max error:     %.3g vs CPU reference in double (tolerance %.3g): %s\n", max_err, tol,
           max_err <= tol ? "PASS" : "FAIL");
    rc = max_err <= tol ? 0 : 1;

done:
    free(block);
    free(x);
    free(y);
    free(hidden);
    free(ref);
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 1) { return demo(); }
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "clffn-run: unknown argument '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
