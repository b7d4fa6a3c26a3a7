/* clffn-train: a small training demo. Fits an FFN (with the residual, as in a transformer block)
 * to a fixed target function — a "teacher" FFN of the same shape with other weights (seed 99,
 * computed by the CPU reference) — with plain SGD or Adam on the host and clffn's forward and
 * backward on the device, and prints the loss falling.
 *
 *   clffn-train [--steps N] [--optimizer adam|sgd] [--lr LR] [--activation A] [--gated]
 *               [--d-model D] [--d-ff F] [--batch T] [--device SPEC]
 *
 * Exit status: 0 when the final loss is below a tenth of the first, 1 otherwise or on a device
 * failure, 2 usage. */
#define CLFFN_HOOKS /* the CPU reference: the teacher's outputs */
#include "clffn.h"
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct adam {
    float *m, *v;
    int t;
} adam;

/* One parameter tensor's update: SGD, or Adam with the usual β1 0.9, β2 0.999, ε 1e-8. */
static void step(float *w, const float *g, size_t n, float lr, adam *st, int use_adam) {
    if (!use_adam) {
        for (size_t i = 0; i < n; ++i) { w[i] -= lr * g[i]; }
        return;
    }
    const float b1 = 0.9f, b2 = 0.999f;
    const float c1 = 1.0f - powf(b1, (float)st->t), c2 = 1.0f - powf(b2, (float)st->t);
    for (size_t i = 0; i < n; ++i) {
        st->m[i] = b1 * st->m[i] + (1.0f - b1) * g[i];
        st->v[i] = b2 * st->v[i] + (1.0f - b2) * g[i] * g[i];
        w[i] -= lr * (st->m[i] / c1) / (sqrtf(st->v[i] / c2) + 1e-8f);
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: clffn-train [--steps N] [--optimizer adam|sgd] [--lr LR] [--activation A]\n"
            "                   [--gated] [--d-model D] [--d-ff F] [--batch T] [--device SPEC]\n");
}

static int tool_main(int argc, char **argv) {
    int steps = 300, use_adam = 1, gated = 0;
    float lr = -1.0f;
    size_t D = 16, F = 64, T = 64;
    clffn_activation act = CLFFN_ACT_GELU;
    const char *device = NULL;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--steps") && v && (steps = (int)strtol(v, &end, 10)) > 0 && !*end) {
            ++i;
        } else if (!strcmp(a, "--optimizer") && v && (!strcmp(v, "adam") || !strcmp(v, "sgd"))) {
            use_adam = !strcmp(v, "adam");
            ++i;
        } else if (!strcmp(a, "--lr") && v && (lr = strtof(v, &end)) > 0 && !*end) {
            ++i;
        } else if (!strcmp(a, "--activation") && v) {
            int g = 0;
            if (clffn_activation_parse(v, &act, &g) != CLFFN_SUCCESS) {
                fprintf(stderr, "clffn-train: unknown activation '%s'\n", v);
                return 2;
            }
            gated |= g;
            ++i;
        } else if (!strcmp(a, "--gated")) {
            gated = 1;
        } else if (!strcmp(a, "--d-model") && !tool_parse_size(v, 1, (size_t)1 << 24, &D)) {
            ++i;
        } else if (!strcmp(a, "--d-ff") && !tool_parse_size(v, 1, (size_t)1 << 24, &F)) {
            ++i;
        } else if (!strcmp(a, "--batch") && !tool_parse_size(v, 1, (size_t)1 << 24, &T)) {
            ++i;
        } else if (!strcmp(a, "--device") && v) {
            device = v, ++i;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "clffn-train: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (lr < 0) { lr = use_adam ? 3e-3f : 5e-2f; }

    clffn_config c = clffn_config_default(D, F);
    c.activation = act, c.gated = gated, c.residual = 1, c.dropout = 0.0f;
    const size_t nw = 3 * D * F + 3 * F + D;
    float *w = calloc(nw, sizeof *w), *g = calloc(nw, sizeof *g);
    float *m = calloc(nw, sizeof *m), *vv = calloc(nw, sizeof *vv);
    float *x = malloc(T * D * sizeof *x), *y = malloc(T * D * sizeof *y),
          *dy = malloc(T * D * sizeof *dy);
    float *tw = calloc(nw, sizeof *tw);
    double *ty = malloc(T * D * sizeof *ty);
    if (!w || !g || !m || !vv || !x || !y || !dy || !tw || !ty) {
        fprintf(stderr, "clffn-train: out of memory\n");
        return 1;
    }
    /* one block, tensors in a fixed order, so the optimizer runs over it in one sweep */
    const clffn_weight_arrays wa = {
        w, w + 3 * D * F, w + D * F, w + 3 * D * F + F, w + 2 * D * F, w + 3 * D * F + 2 * F};
    const clffn_weight_arrays ga = {
        g, g + 3 * D * F, g + D * F, g + 3 * D * F + F, g + 2 * D * F, g + 3 * D * F + 2 * F};
    const clffn_host_weights hw = {wa.w1, wa.b1, gated ? wa.v : NULL, gated ? wa.bv : NULL,
                                   wa.w2, wa.b2};
    adam st = {m, vv, 0};

    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    clffn_status s = clffn_context_create_for_device(device, &ctx);
    if (s == CLFFN_SUCCESS) { s = clffn_ffn_create(ctx, &c, &ffn); }
    if (s == CLFFN_SUCCESS) {
        s = clffn_init_weights_host(&c, CLFFN_INIT_TORCH_LINEAR, 1, CLFFN_LAYOUT_OUT_IN, &wa);
    }
    /* the teacher: the same shape, another seed, weights doubled so it is far from the student */
    const clffn_weight_arrays ta = {
        tw, tw + 3 * D * F, tw + D * F, tw + 3 * D * F + F, tw + 2 * D * F, tw + 3 * D * F + 2 * F};
    if (s == CLFFN_SUCCESS) {
        s = clffn_init_weights_host(&c, CLFFN_INIT_TORCH_LINEAR, 99, CLFFN_LAYOUT_OUT_IN, &ta);
    }
    for (size_t i = 0; i < nw; ++i) { tw[i] *= 2.0f; }
    const clffn_host_weights th = {ta.w1, ta.b1, gated ? ta.v : NULL, gated ? ta.bv : NULL,
                                   ta.w2, ta.b2};
    if (s != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-train: setting up: %s\n", clffn_status_string(s));
        clffn_ffn_destroy(ffn);
        clffn_context_destroy(ctx);
        free(w), free(g), free(m), free(vv), free(x), free(y), free(dy), free(tw), free(ty);
        return 1;
    }
    char name[256] = "?";
    clffn_context_device_name(ctx, name, sizeof name);
    printf("clffn-train: %s; FFN %zu -> %zu, %s%s, residual; batch %zu; %s, lr %g\n", name, D, F,
           clffn_activation_name(act), gated ? " gated" : "", T, use_adam ? "Adam" : "SGD",
           (double)lr);
    printf("target: a teacher FFN of the same shape (other weights), x ~ U(-2, 2); loss: mean "
           "squared error\n");

    uint64_t rng = 12345;
    double first = -1.0, last = 0.0;
    for (int it = 1; it <= steps; ++it) {
        for (size_t i = 0; i < T * D; ++i) { /* a fresh batch each step */
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            x[i] = (float)((double)(rng >> 40) / 16777216.0 * 4.0 - 2.0);
        }
        if ((s = clffn_reference_forward(&c, CLFFN_LAYOUT_OUT_IN, &th, T, x, 0, 0, 0, ty, NULL)) !=
                CLFFN_SUCCESS ||
            (s = clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &hw)) != CLFFN_SUCCESS ||
            (s = clffn_forward_host(ffn, T, x, T * D, y, T * D)) != CLFFN_SUCCESS) {
            break;
        }
        double loss = 0.0;
        const double scale = 2.0 / (double)(T * D);
        for (size_t i = 0; i < T * D; ++i) {
            const double e = (double)y[i] - ty[i];
            loss += e * e;
            dy[i] = (float)(scale * e);
        }
        loss /= (double)(T * D);
        if (first < 0) { first = loss; }
        last = loss;
        if (it == 1 || it % (steps / 10 > 0 ? steps / 10 : 1) == 0 || it == steps) {
            printf("step %5d  loss %.6f\n", it, loss);
        }
        if ((s = clffn_backward_host(ffn, T, x, T * D, dy, T * D, NULL, 0, &ga, 0)) !=
            CLFFN_SUCCESS) {
            break;
        }
        st.t = it;
        step(w, g, nw, lr, &st, use_adam);
    }
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    free(w), free(g), free(m), free(vv), free(x), free(y), free(dy), free(tw), free(ty);
    if (s != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-train: %s\n", clffn_status_string(s));
        return 1;
    }
    printf("loss %.6f -> %.6f (%.1fx lower)\n", first, last, first / last);
    return last < 0.1 * first ? 0 : 1;
}

int main(int argc, char **argv) { return tool_exit("clffn-train", tool_main(argc, argv)); }
