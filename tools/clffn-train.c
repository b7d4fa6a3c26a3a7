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
#include "options.h"

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

/* ------------------------------------------------------------------------------------------ */
/* The command line */

enum {
    OPT_STEPS = 256,
    OPT_OPTIMIZER,
    OPT_LR,
    OPT_ACTIVATION,
    OPT_GATED,
    OPT_D_MODEL,
    OPT_D_FF,
    OPT_BATCH,
    OPT_DEVICE,
};

static const tool_option OPTIONS[] = {
    {"steps", OPT_STEPS, TOOL_VALUE, "N", "optimizer steps (default 300)"},
    {"optimizer", OPT_OPTIMIZER, TOOL_VALUE, "NAME", "adam (default) or sgd"},
    {"lr", OPT_LR, TOOL_VALUE, "LR", "learning rate (default 3e-3 for Adam, 5e-2 for SGD)"},
    {"activation", OPT_ACTIVATION, TOOL_VALUE, "A", "gelu (default), another, or a GLU name"},
    {"gated", OPT_GATED, TOOL_FLAG, NULL, "the gated (GLU) FFN"},
    {"d-model", OPT_D_MODEL, TOOL_VALUE, "D", "d_model (default 16)"},
    {"d-ff", OPT_D_FF, TOOL_VALUE, "F", "d_ff (default 64)"},
    {"batch", OPT_BATCH, TOOL_VALUE, "T", "token rows per step (default 64)"},
    {"device", OPT_DEVICE, TOOL_VALUE, "SPEC", "\"platform:device\" or a name substring"},
    {0},
};

static const tool_cli CLI = {
    "clffn-train",
    "[options]",
    "Exit status: 0 when the final loss is below a tenth of the first, 1 otherwise or on a\n"
    "device failure, 2 usage.\n",
    OPTIONS,
};

typedef struct train_args {
    int steps, use_adam, gated;
    float lr; /* < 0: the optimizer's default */
    size_t D, F, T;
    clffn_activation act;
    const char *device;
} train_args;

/* One option into a: 0, or -1 with the refusal printed. */
static int take_option(int key, const char *name, const char *v, train_args *a) {
    const size_t big = (size_t)1 << 24;
    double x;
    size_t n;
    int g = 0, ok = 1;
    switch (key) {
    case OPT_STEPS:
        if ((ok = tool_parse_size(v, 1, 100000000, &n) == 0)) { a->steps = (int)n; }
        break;
    case OPT_OPTIMIZER:
        if ((ok = !strcmp(v, "adam") || !strcmp(v, "sgd"))) { a->use_adam = !strcmp(v, "adam"); }
        break;
    case OPT_LR:
        if ((ok = tool_parse_double(v, 1e-30, 1e30, &x) == 0)) { a->lr = (float)x; }
        break;
    case OPT_ACTIVATION:
        if (clffn_activation_parse(v, &a->act, &g) != CLFFN_SUCCESS) {
            fprintf(stderr, "clffn-train: unknown activation '%s'\n", v);
            return -1;
        }
        a->gated |= g;
        break;
    case OPT_GATED: a->gated = 1; break;
    case OPT_D_MODEL: ok = tool_parse_size(v, 1, big, &a->D) == 0; break;
    case OPT_D_FF: ok = tool_parse_size(v, 1, big, &a->F) == 0; break;
    case OPT_BATCH: ok = tool_parse_size(v, 1, big, &a->T) == 0; break;
    case OPT_DEVICE: a->device = v; break;
    default: ok = 0;
    }
    if (!ok) { fprintf(stderr, "clffn-train: bad value for --%s: '%s'\n", name, v); }
    return ok ? 0 : -1;
}

/* -1 to train, else the exit status (0 after --help, 2 after a refusal). */
static int parse_args(int argc, char **argv, train_args *a) {
    *a = (train_args){300, 1, 0, -1.0f, 16, 64, 64, CLFFN_ACT_GELU, NULL};
    tool_parser p = tool_parser_start(&CLI, argc, argv);
    for (int key; (key = tool_next(&p)) > 0;) {
        if (take_option(key, p.name, p.value, a) != 0) { return tool_usage_error(&CLI); }
    }
    if (a->lr < 0) { a->lr = a->use_adam ? 3e-3f : 5e-2f; }
    return p.status;
}

/* ------------------------------------------------------------------------------------------ */
/* Training */

/* The student's weights, gradients and Adam moments, each one block with the tensors in a fixed
 * order (so the optimizer runs over it in one sweep), and the teacher's; x, y, dy and the
 * teacher's output for one batch. */
typedef struct model {
    size_t nw;
    float *w, *g, *m, *v, *tw, *x, *y, *dy;
    double *ty;
    clffn_weight_arrays wa, ga, ta;
} model;

static void model_free(model *s) {
    free(s->w), free(s->g), free(s->m), free(s->v), free(s->tw), free(s->x), free(s->y),
        free(s->dy), free(s->ty);
}

/* The tensors of a block of 3·D·F + 3·F + D floats: W1, V, W2, b1, bv, b2. */
static clffn_weight_arrays arrays_in(float *b, size_t D, size_t F) {
    const clffn_weight_arrays a = {
        b, b + 3 * D * F, b + D * F, b + 3 * D * F + F, b + 2 * D * F, b + 3 * D * F + 2 * F};
    return a;
}

/* Allocates the model and initialises the student (seed 1) and the teacher (seed 99, weights
 * doubled so it is far from the student). */
static clffn_status model_make(model *s, const clffn_config *c, size_t T) {
    const size_t D = c->d_model, F = c->d_ff;
    s->nw = 3 * D * F + 3 * F + D;
    s->w = calloc(s->nw, sizeof *s->w), s->g = calloc(s->nw, sizeof *s->g);
    s->m = calloc(s->nw, sizeof *s->m), s->v = calloc(s->nw, sizeof *s->v);
    s->tw = calloc(s->nw, sizeof *s->tw);
    s->x = malloc(T * D * sizeof *s->x), s->y = malloc(T * D * sizeof *s->y);
    s->dy = malloc(T * D * sizeof *s->dy), s->ty = malloc(T * D * sizeof *s->ty);
    if (!s->w || !s->g || !s->m || !s->v || !s->tw || !s->x || !s->y || !s->dy || !s->ty) {
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    s->wa = arrays_in(s->w, D, F), s->ga = arrays_in(s->g, D, F), s->ta = arrays_in(s->tw, D, F);
    clffn_status st =
        clffn_init_weights_host(c, CLFFN_INIT_TORCH_LINEAR, 1, CLFFN_LAYOUT_OUT_IN, &s->wa);
    if (st == CLFFN_SUCCESS) {
        st = clffn_init_weights_host(c, CLFFN_INIT_TORCH_LINEAR, 99, CLFFN_LAYOUT_OUT_IN, &s->ta);
    }
    for (size_t i = 0; i < s->nw; ++i) { s->tw[i] *= 2.0f; }
    return st;
}

static clffn_host_weights host_weights(const clffn_weight_arrays *a, int gated) {
    const clffn_host_weights h = {a->w1, a->b1, gated ? a->v : NULL, gated ? a->bv : NULL,
                                  a->w2, a->b2};
    return h;
}

/* The steps: a fresh batch x ~ U(-2, 2), the teacher's output, the student's forward on the
 * device, the mean squared error and its gradient, the backward, the optimizer. */
static clffn_status train(const train_args *a, const clffn_config *c, clffn_ffn *ffn, model *s,
                          double *first, double *last) {
    const size_t T = a->T, D = c->d_model;
    const clffn_host_weights hw = host_weights(&s->wa, c->gated),
                             th = host_weights(&s->ta, c->gated);
    adam st = {s->m, s->v, 0};
    uint64_t rng = 12345;
    clffn_status e = CLFFN_SUCCESS;
    *first = -1.0;
    for (int it = 1; it <= a->steps && e == CLFFN_SUCCESS; ++it) {
        for (size_t i = 0; i < T * D; ++i) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            s->x[i] = (float)((double)(rng >> 40) / 16777216.0 * 4.0 - 2.0);
        }
        if ((e = clffn_reference_forward(c, CLFFN_LAYOUT_OUT_IN, &th, T, s->x, 0, 0, 0, s->ty,
                                         NULL)) != CLFFN_SUCCESS ||
            (e = clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &hw)) != CLFFN_SUCCESS ||
            (e = clffn_forward_host(ffn, T, s->x, T * D, s->y, T * D)) != CLFFN_SUCCESS) {
            break;
        }
        double loss = 0.0;
        const double scale = 2.0 / (double)(T * D);
        for (size_t i = 0; i < T * D; ++i) {
            const double d = (double)s->y[i] - s->ty[i];
            loss += d * d;
            s->dy[i] = (float)(scale * d);
        }
        loss /= (double)(T * D);
        if (*first < 0) { *first = loss; }
        *last = loss;
        if (it == 1 || it % (a->steps / 10 > 0 ? a->steps / 10 : 1) == 0 || it == a->steps) {
            printf("step %5d  loss %.6f\n", it, loss);
        }
        e = clffn_backward_host(ffn, T, s->x, T * D, s->dy, T * D, NULL, 0, &s->ga, 0);
        st.t = it;
        if (e == CLFFN_SUCCESS) { step(s->w, s->g, s->nw, a->lr, &st, a->use_adam); }
    }
    return e;
}

static int tool_main(int argc, char **argv) {
    train_args a;
    const int rc = parse_args(argc, argv, &a);
    if (rc >= 0) { return rc; }
    clffn_config c = clffn_config_default(a.D, a.F);
    c.activation = a.act, c.gated = a.gated, c.residual = 1, c.dropout = 0.0f;
    model s;
    memset(&s, 0, sizeof s);
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    clffn_status e = clffn_context_create_for_device(a.device, &ctx);
    if (e == CLFFN_SUCCESS) { e = clffn_ffn_create(ctx, &c, &ffn); }
    if (e == CLFFN_SUCCESS) { e = model_make(&s, &c, a.T); }
    double first = -1.0, last = 0.0;
    if (e != CLFFN_SUCCESS) {
        fprintf(stderr, "clffn-train: setting up: %s\n", clffn_status_string(e));
    } else {
        char name[256] = "?";
        clffn_context_device_name(ctx, name, sizeof name);
        printf("clffn-train: %s; FFN %zu -> %zu, %s%s, residual; batch %zu; %s, lr %g\n", name, a.D,
               a.F, clffn_activation_name(a.act), a.gated ? " gated" : "", a.T,
               a.use_adam ? "Adam" : "SGD", (double)a.lr);
        printf("target: a teacher FFN of the same shape (other weights), x ~ U(-2, 2); loss: "
               "mean squared error\n");
        if ((e = train(&a, &c, ffn, &s, &first, &last)) != CLFFN_SUCCESS) {
            fprintf(stderr, "clffn-train: %s\n", clffn_status_string(e));
        }
    }
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    model_free(&s);
    if (e != CLFFN_SUCCESS) { return 1; }
    printf("loss %.6f -> %.6f (%.1fx lower)\n", first, last, first / last);
    return last < 0.1 * first ? 0 : 1;
}

int main(int argc, char **argv) { return tool_exit("clffn-train", tool_main(argc, argv)); }
