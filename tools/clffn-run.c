/* clffn-run: runs a position-wise FFN with clffn.
 *
 *   clffn-run                       the demo: the classic FFN (batch 64, seq 10,
 *                                   d_model 512, d_ff 2048, ReLU, dropout 0.1 in inference mode,
 *                                   nn.Linear initialisation from a fixed seed), checked against
 *                                   the CPU reference
 *   clffn-run --weights W.safetensors --input X.npy --output Y.npy [options]
 *                                   the FFN held in a checkpoint, on an input of any rank
 *                                   [..., d_model]; the output keeps the leading shape
 *   mpirun -np N clffn-run --tensor-parallel --weights … --input … --output …
 *                                   the same, the layer split over N ranks (clffn-run-tp.c)
 *
 * Exit status: 0 success, 1 device or runtime failure (or --verify beyond tolerance), 2 usage
 * error or bad input file. Every failure prints one line naming the file and what is wrong. */
#define CLFFN_HOOKS /* the CPU reference, for --verify and the demo's check */
#include "clffn.h"
#include "clffn_io.h"
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BATCH = 64, SEQ = 10, D_MODEL = 512, D_FF = 2048, REPS = 5 };
static const uint64_t WEIGHT_SEED = 42;

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

/* Every failure is one line. A single process prints it at once; a tensor-parallel rank keeps
 * it (captured) until the ranks agree on who failed first, and rank 0 prints that one. */
static int captured;
static char captured_msg[512];

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (captured) {
        if (!captured_msg[0]) { vsnprintf(captured_msg, sizeof captured_msg, fmt, ap); }
    } else {
        fputs("clffn-run: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
    }
    va_end(ap);
}

static int fail(const char *what, clffn_status st) {
    report("%s: %s", what, clffn_status_string(st));
    return EXIT_RUNTIME;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: clffn-run [--device SPEC]        the demo FFN, checked against the CPU reference\n"
        "       clffn-run --weights W.safetensors --input X.npy --output Y.npy [options]\n"
        "options:\n"
        "  --preset NAME      tensor names and defaults: annotated (default), labml, gpt2, bert, "
        "llama\n"
        "  --layer L          layer index for gpt2, bert and llama (default 0)\n"
        "  --activation NAME  relu, gelu, gelu_tanh, silu, sigmoid, identity, or a GLU name\n"
        "                     (glu, reglu, geglu, swiglu, bilinear), overriding the preset\n"
        "  --gated            use the gate (needs the preset's V tensor)\n"
        "  --dropout P        dropout probability on the hidden layer (default 0)\n"
        "  --train            training mode: apply dropout\n"
        "  --seed S           dropout seed (default 0)\n"
        "  --residual         y = FFN(x) + x\n"
        "  --device SPEC      \"platform:device\" or a name substring (default: CLFFN_DEVICE,\n"
        "                     else the first GPU, else the first device)\n"
        "  --verify           compare with the CPU reference and print the error\n"
        "  --grad-output DY.npy --grads-out G.safetensors\n"
        "                     backward pass for dL/dy = DY (the output's shape): writes the "
        "gradient\n"
        "                     of every weight tensor under its own name, and 'input' for dL/dx\n"
        "  --tensor-parallel  under mpirun: split the layer's hidden units over the ranks, each\n"
        "                     reading only its slice; rank 0 writes the output (and gradients)\n"
        "  --verbose          with --tensor-parallel: each rank's device, slice and memory\n"
        "Weights may be F32, F16, BF16 or F64; inputs '<f4', '<f8' or '<f2'.\n");
}

/* ------------------------------------------------------------------------------------------ */
/* Presets: where each tensor lives in a checkpoint, and the FFN it describes */

typedef struct preset {
    const char *name;
    const char *w1, *b1, *v, *bv, *w2, *b2; /* printf patterns taking the layer; NULL: none */
    const char *prefixes[3];                /* tried in order before each name */
    clffn_layout layout;
    clffn_activation act;
    int gated; /* 1: always, 0: never, -1: when the V tensor is present */
} preset;

static const preset presets[] = {
    {"annotated",
     "w_1.weight",
     "w_1.bias",
     NULL,
     NULL,
     "w_2.weight",
     "w_2.bias",
     {"", NULL},
     CLFFN_LAYOUT_OUT_IN,
     CLFFN_ACT_RELU,
     0},
    {"labml",
     "layer1.weight",
     "layer1.bias",
     "linear_v.weight",
     "linear_v.bias",
     "layer2.weight",
     "layer2.bias",
     {"", NULL},
     CLFFN_LAYOUT_OUT_IN,
     CLFFN_ACT_RELU,
     -1},
    {"gpt2",
     "h.%d.mlp.c_fc.weight",
     "h.%d.mlp.c_fc.bias",
     NULL,
     NULL,
     "h.%d.mlp.c_proj.weight",
     "h.%d.mlp.c_proj.bias",
     {"", "transformer.", NULL},
     CLFFN_LAYOUT_IN_OUT,
     CLFFN_ACT_GELU_TANH,
     0},
    {"bert",
     "encoder.layer.%d.intermediate.dense.weight",
     "encoder.layer.%d.intermediate.dense.bias",
     NULL,
     NULL,
     "encoder.layer.%d.output.dense.weight",
     "encoder.layer.%d.output.dense.bias",
     {"bert.", "", NULL},
     CLFFN_LAYOUT_OUT_IN,
     CLFFN_ACT_GELU,
     0},
    {"llama",
     "model.layers.%d.mlp.gate_proj.weight",
     NULL,
     "model.layers.%d.mlp.up_proj.weight",
     NULL,
     "model.layers.%d.mlp.down_proj.weight",
     NULL,
     {"", NULL},
     CLFFN_LAYOUT_OUT_IN,
     CLFFN_ACT_SILU,
     1},
};

typedef struct options {
    const char *weights, *input, *output, *device;
    const char *grad_output, *grads_out; /* dy in, gradients out */
    const preset *preset;
    int layer;
    int have_act, act_gated, gated_flag;
    clffn_activation act;
    float dropout;
    int train, residual, verify;
    int tensor_parallel, verbose;
    uint64_t seed;
} options;

/* Finds a tensor by pattern and layer under the preset's prefixes; writes the name tried first
 * into tried for messages. */
static const clffn_st_tensor *find(const clffn_st_file *f, const preset *p, const char *pattern,
                                   int layer, char *tried, size_t tried_len) {
    char base[256], full[300];
    snprintf(base, sizeof base, pattern, layer);
    snprintf(tried, tried_len, "%s%s", p->prefixes[0], base);
    for (int i = 0; i < 3 && p->prefixes[i]; ++i) {
        snprintf(full, sizeof full, "%s%s", p->prefixes[i], base);
        const clffn_st_tensor *t = clffn_st_find(f, full);
        if (t) { return t; }
    }
    return NULL;
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->preset = &presets[0];
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDS_VALUE                                              \
    do {                                                         \
        if (!val) {                                              \
            fprintf(stderr, "clffn-run: %s needs a value\n", a); \
            return -1;                                           \
        }                                                        \
        ++i;                                                     \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--weights")) {
            NEEDS_VALUE;
            o->weights = val;
        } else if (!strcmp(a, "--input")) {
            NEEDS_VALUE;
            o->input = val;
        } else if (!strcmp(a, "--output")) {
            NEEDS_VALUE;
            o->output = val;
        } else if (!strcmp(a, "--device")) {
            NEEDS_VALUE;
            o->device = val;
        } else if (!strcmp(a, "--preset")) {
            NEEDS_VALUE;
            o->preset = NULL;
            for (size_t k = 0; k < sizeof presets / sizeof presets[0]; ++k) {
                if (!strcmp(val, presets[k].name)) { o->preset = &presets[k]; }
            }
            if (!o->preset) {
                fprintf(stderr,
                        "clffn-run: unknown preset '%s' (annotated, labml, gpt2, bert, llama)\n",
                        val);
                return -1;
            }
        } else if (!strcmp(a, "--layer")) {
            NEEDS_VALUE;
            uint64_t v;
            if (tool_parse_u64(val, 0, 1000000, &v) != 0) {
                fprintf(stderr, "clffn-run: --layer needs a non-negative integer, not '%s'\n", val);
                return -1;
            }
            o->layer = (int)v;
        } else if (!strcmp(a, "--activation")) {
            NEEDS_VALUE;
            if (clffn_activation_parse(val, &o->act, &o->act_gated) != CLFFN_SUCCESS) {
                fprintf(stderr, "clffn-run: unknown activation '%s'\n", val);
                return -1;
            }
            o->have_act = 1;
        } else if (!strcmp(a, "--gated")) {
            o->gated_flag = 1;
        } else if (!strcmp(a, "--dropout")) {
            NEEDS_VALUE;
            double p;
            if (tool_parse_double(val, 0.0, 1.0, &p) != 0) {
                fprintf(stderr, "clffn-run: --dropout needs a probability in [0, 1], not '%s'\n",
                        val);
                return -1;
            }
            o->dropout = (float)p;
        } else if (!strcmp(a, "--train")) {
            o->train = 1;
        } else if (!strcmp(a, "--seed")) {
            NEEDS_VALUE;
            if (tool_parse_u64(val, 0, UINT64_MAX, &o->seed) != 0) {
                fprintf(stderr, "clffn-run: --seed needs a non-negative integer, not '%s'\n", val);
                return -1;
            }
        } else if (!strcmp(a, "--residual")) {
            o->residual = 1;
        } else if (!strcmp(a, "--verify")) {
            o->verify = 1;
        } else if (!strcmp(a, "--tensor-parallel")) {
            o->tensor_parallel = 1;
        } else if (!strcmp(a, "--verbose")) {
            o->verbose = 1;
        } else if (!strcmp(a, "--grad-output")) {
            NEEDS_VALUE;
            o->grad_output = val;
        } else if (!strcmp(a, "--grads-out")) {
            NEEDS_VALUE;
            o->grads_out = val;
        } else {
            fprintf(stderr, "clffn-run: unknown argument '%s'\n", a);
            return -1;
        }
#undef NEEDS_VALUE
    }
    const int ckpt_only = o->have_act || o->gated_flag || o->dropout > 0.0f || o->train ||
                          o->seed || o->residual || o->verify || o->layer || o->grad_output ||
                          o->grads_out || o->preset != &presets[0] || o->tensor_parallel ||
                          o->verbose;
    if (!o->weights && ckpt_only) {
        fprintf(
            stderr,
            "clffn-run: these options apply to --weights runs (the demo takes only --device)\n");
        return -1;
    }
    if (!o->grad_output != !o->grads_out) {
        fprintf(stderr, "clffn-run: --grad-output and --grads-out go together\n");
        return -1;
    }
    const int any = o->weights || o->input || o->output;
    if (any && !(o->weights && o->input && o->output)) {
        fprintf(stderr, "clffn-run: --weights, --input and --output go together\n");
        return -1;
    }
    if (o->tensor_parallel && o->verify) {
        fprintf(stderr, "clffn-run: --verify needs the whole layer; run it without "
                        "--tensor-parallel\n");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Checkpoint mode */

typedef struct loaded {
    float *w1, *b1, *v, *bv, *w2, *b2;
} loaded;

static void loaded_free(loaded *l) {
    free(l->w1), free(l->b1), free(l->v), free(l->bv), free(l->w2), free(l->b2);
}

/* Whether a tensor has shape [rows, cols] (cols = 0: [rows]); reports it if not. */
static int check_shape(const char *file, const clffn_st_tensor *t, uint64_t rows, uint64_t cols) {
    const int ok = cols ? (t->rank == 2 && t->shape[0] == rows && t->shape[1] == cols)
                        : (t->rank == 1 && t->shape[0] == rows);
    if (ok) { return 0; }
    char have[128] = "", want[64];
    size_t n = 0;
    for (size_t k = 0; k < t->rank && n < sizeof have - 24; ++k) {
        n += (size_t)snprintf(have + n, sizeof have - n, "%s%llu", k ? ", " : "",
                              (unsigned long long)t->shape[k]);
    }
    if (cols) {
        snprintf(want, sizeof want, "[%llu, %llu]", (unsigned long long)rows,
                 (unsigned long long)cols);
    } else {
        snprintf(want, sizeof want, "[%llu]", (unsigned long long)rows);
    }
    report("%s: tensor '%s' has shape [%s], expected %s", file, t->name, have, want);
    return -1;
}

/* Reads one tensor, whose shape was checked, as float32. */
static int take(const clffn_st_file *f, const char *file, const clffn_st_tensor *t, float **out) {
    char err[CLFFN_IO_ERR];
    *out = malloc((size_t)(t->numel ? t->numel : 1) * sizeof **out);
    if (!*out) {
        report("%s: out of memory for tensor '%s'", file, t->name);
        return -1;
    }
    if (clffn_st_read_f32(f, t, *out, err) != 0) {
        report("%s: %s", file, err);
        return -1;
    }
    return 0;
}

/* The checkpoint's tensors of one FFN layer, as the preset names them, shapes checked. */
typedef struct layer {
    const clffn_st_tensor *w1, *b1, *v, *bv, *w2, *b2;
    uint64_t F, D;
    int gated;
} layer;

static int resolve_layer(const options *o, const clffn_st_file *st, layer *L) {
    const preset *p = o->preset;
    char tried[300];
    memset(L, 0, sizeof *L);
    if (!(L->w1 = find(st, p, p->w1, o->layer, tried, sizeof tried)) ||
        !(L->w2 = find(st, p, p->w2, o->layer, tried, sizeof tried))) {
        report("%s: no tensor '%s' (preset %s, layer %d)", o->weights, tried, p->name, o->layer);
        return -1;
    }
    L->v = p->v ? find(st, p, p->v, o->layer, tried, sizeof tried) : NULL;
    L->gated =
        o->gated_flag || (o->have_act && o->act_gated) || p->gated == 1 || (p->gated == -1 && L->v);
    if (L->gated && !L->v) {
        if (p->v) {
            report("%s: gated FFN, but no tensor '%s'", o->weights, tried);
        } else {
            report("%s: preset %s has no gate tensor; drop --gated", o->weights, p->name);
        }
        return -1;
    }
    if (!L->gated) { L->v = NULL; }
    L->b1 = p->b1 ? find(st, p, p->b1, o->layer, tried, sizeof tried) : NULL;
    L->bv = L->gated && p->bv ? find(st, p, p->bv, o->layer, tried, sizeof tried) : NULL;
    L->b2 = p->b2 ? find(st, p, p->b2, o->layer, tried, sizeof tried) : NULL;
    if (L->w1->rank != 2 || L->w1->shape[0] == 0 || L->w1->shape[1] == 0) {
        report("%s: tensor '%s' is not a non-empty matrix", o->weights, L->w1->name);
        return -1;
    }
    const int oi = p->layout == CLFFN_LAYOUT_OUT_IN;
    const uint64_t F = oi ? L->w1->shape[0] : L->w1->shape[1];
    const uint64_t D = oi ? L->w1->shape[1] : L->w1->shape[0];
    L->F = F, L->D = D;
    if (check_shape(o->weights, L->w2, oi ? D : F, oi ? F : D) != 0 ||
        (L->v && check_shape(o->weights, L->v, oi ? F : D, oi ? D : F) != 0) ||
        (L->b1 && check_shape(o->weights, L->b1, F, 0) != 0) ||
        (L->bv && check_shape(o->weights, L->bv, F, 0) != 0) ||
        (L->b2 && check_shape(o->weights, L->b2, D, 0) != 0)) {
        return -1;
    }
    return 0;
}

static clffn_config layer_config(const options *o, const layer *L) {
    clffn_config c = clffn_config_default((size_t)L->D, (size_t)L->F);
    c.activation = o->have_act ? o->act : o->preset->act;
    c.gated = L->gated;
    c.bias1 = L->b1 != NULL;
    c.bias_gate = L->bv != NULL;
    c.bias2 = L->b2 != NULL;
    c.dropout = o->dropout;
    c.residual = o->residual;
    return c;
}

/* Loads the input (and dy for a backward): x's last dimension must be d_model, dy's shape x's.
 * Returns 0 or -1 (reported). */
static int load_inputs(const options *o, const layer *L, clffn_npy *x, clffn_npy *dy) {
    char err[CLFFN_IO_ERR];
    if (clffn_npy_load(o->input, x, err) != 0) {
        report("%s: %s", o->input, err);
        return -1;
    }
    if (x->rank == 0 || x->shape[x->rank - 1] != L->D) {
        report("%s: last dimension must be d_model = %llu (from %s), not %llu", o->input,
               (unsigned long long)L->D, L->w1->name,
               x->rank ? (unsigned long long)x->shape[x->rank - 1] : 0ull);
        return -1;
    }
    if (!o->grad_output) { return 0; }
    if (clffn_npy_load(o->grad_output, dy, err) != 0) {
        report("%s: %s", o->grad_output, err);
        return -1;
    }
    int same = dy->rank == x->rank;
    for (size_t k = 0; same && k < x->rank; ++k) { same = dy->shape[k] == x->shape[k]; }
    if (!same) {
        report("%s: shape differs from the output's (the input's shape)", o->grad_output);
        return -1;
    }
    return 0;
}

/* Writes the gradients under the checkpoint's own names (the prefix found included) and dx as
 * 'input'; arr[i] holds tensor t[i]'s gradient in its shape (NULL where t[i] is absent). */
static int write_grads(const options *o, const clffn_st_tensor *const t[6], float *const arr[6],
                       const clffn_npy *x, const float *dx) {
    char err[CLFFN_IO_ERR];
    clffn_st_out outs[7];
    size_t n = 0;
    for (int i = 0; i < 6; ++i) {
        if (t[i]) { outs[n++] = (clffn_st_out){t[i]->name, t[i]->rank, t[i]->shape, arr[i]}; }
    }
    outs[n++] = (clffn_st_out){"input", x->rank, x->shape, dx};
    if (clffn_st_write(o->grads_out, outs, n, err) != 0) {
        report("%s: %s", o->grads_out, err);
        return -1;
    }
    printf("gradients: %zu tensors and 'input' written to %s\n", n - 1, o->grads_out);
    return 0;
}

/* The backward pass for --grad-output: dy (checked to have the output's shape) in, the
 * gradient of every weight tensor and of the input out. Returns 0 or -1 (reported). */
static int run_backward(const options *o, clffn_ffn *ffn, const layer *L, const clffn_npy *x,
                        const clffn_npy *dy, size_t T) {
    const clffn_st_tensor *const t[6] = {L->w1, L->b1, L->v, L->bv, L->w2, L->b2};
    float *arr[6] = {NULL};
    float *dx = malloc((size_t)(x->numel ? x->numel : 1) * sizeof *dx);
    int ok = dx != NULL;
    for (int i = 0; ok && i < 6; ++i) {
        ok = !t[i] || (arr[i] = calloc((size_t)(t[i]->numel ? t[i]->numel : 1), sizeof(float)));
    }
    int ret = -1;
    if (!ok) {
        report("out of memory for gradients");
    } else {
        const clffn_weight_arrays ga = {arr[0], arr[1], arr[2], arr[3], arr[4], arr[5]};
        const clffn_status s = clffn_backward_host(ffn, T, x->data, (size_t)x->numel, dy->data,
                                                   (size_t)dy->numel, dx, (size_t)x->numel, &ga, 0);
        if (s != CLFFN_SUCCESS) {
            fail("backward pass", s);
        } else {
            ret = write_grads(o, t, arr, x, dx);
        }
    }
    for (int i = 0; i < 6; ++i) { free(arr[i]); }
    free(dx);
    return ret;
}

/* Opens the device the options name (or the default one); reports a missing platform with what
 * to install. */
static int open_device(const char *spec, clffn_context **ctx) {
    const clffn_status s = clffn_context_create_for_device(spec, ctx);
    if (s == CLFFN_PLATFORM_NOT_FOUND) {
        report("no OpenCL platform found; install one, e.g. `apt-get install pocl-opencl-icd` for "
               "the CPU");
        return -1;
    }
    if (s != CLFFN_SUCCESS) {
        fail(spec ? spec : "opening the default device", s);
        return -1;
    }
    return 0;
}

static void print_run(clffn_context *ctx, const layer *L, const clffn_config *c, size_t T,
                      double dt, const char *split) {
    char name[256] = "?";
    clffn_context_device_name(ctx, name, sizeof name);
    const double flops = 2.0 * (double)T * (double)L->D * (double)L->F * (L->gated ? 3.0 : 2.0);
    printf("device: %s\nFFN: d_model %llu, d_ff %llu, %s%s%s, %zu tokens%s\n", name,
           (unsigned long long)L->D, (unsigned long long)L->F, clffn_activation_name(c->activation),
           L->gated ? ", gated" : "", c->residual ? ", residual" : "", T, split);
    printf("time: %.3f ms (%.1f GFLOP/s, first call includes kernel builds)\n", dt * 1e3,
           dt > 0 ? flops / dt * 1e-9 : 0.0);
}

static int run_checkpoint(const options *o) {
    const preset *p = o->preset;
    char err[CLFFN_IO_ERR];
    clffn_st_file st;
    if (clffn_st_open(o->weights, &st, err) != 0) {
        report("%s: %s", o->weights, err);
        return EXIT_USAGE;
    }
    int rc = EXIT_USAGE;
    layer Ly;
    loaded L = {0};
    clffn_npy x = {0}, dy = {0};
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    float *y = NULL;
    double *ref = NULL;
    if (resolve_layer(o, &st, &Ly) != 0 || take(&st, o->weights, Ly.w1, &L.w1) != 0 ||
        take(&st, o->weights, Ly.w2, &L.w2) != 0 ||
        (Ly.v && take(&st, o->weights, Ly.v, &L.v) != 0) ||
        (Ly.b1 && take(&st, o->weights, Ly.b1, &L.b1) != 0) ||
        (Ly.bv && take(&st, o->weights, Ly.bv, &L.bv) != 0) ||
        (Ly.b2 && take(&st, o->weights, Ly.b2, &L.b2) != 0) || load_inputs(o, &Ly, &x, &dy) != 0) {
        goto done;
    }
    const size_t T = (size_t)(x.numel / Ly.D);
    const clffn_config c = layer_config(o, &Ly);
    const clffn_host_weights hw = {L.w1, L.b1, L.v, L.bv, L.w2, L.b2};

    rc = EXIT_RUNTIME;
    if (open_device(o->device, &ctx) != 0) { goto done; }
    clffn_status s;
    if ((s = clffn_ffn_create(ctx, &c, &ffn)) != CLFFN_SUCCESS ||
        (s = clffn_ffn_upload_weights(ffn, p->layout, &hw)) != CLFFN_SUCCESS ||
        (s = clffn_ffn_set_training(ffn, o->train)) != CLFFN_SUCCESS ||
        (s = clffn_ffn_set_rng(ffn, o->seed, 0)) != CLFFN_SUCCESS) {
        fail("setting up the FFN", s);
        goto done;
    }
    y = malloc((x.numel ? x.numel : 1) * sizeof *y);
    if (!y) {
        report("out of memory");
        goto done;
    }
    const double t0 = tool_now_s();
    if ((s = clffn_forward_host(ffn, T, x.data, (size_t)x.numel, y, (size_t)x.numel)) !=
        CLFFN_SUCCESS) {
        fail("forward pass", s);
        goto done;
    }
    print_run(ctx, &Ly, &c, T, tool_now_s() - t0, "");
    if (o->verify) {
        ref = malloc((x.numel ? x.numel : 1) * sizeof *ref);
        if (!ref) {
            report("out of memory");
            goto done;
        }
        if ((s = clffn_reference_forward(&c, p->layout, &hw, T, x.data, o->train, o->seed, 0, ref,
                                         NULL)) != CLFFN_SUCCESS) {
            fail("CPU reference", s);
            goto done;
        }
        const tool_comparison cmp = tool_compare(y, ref, (size_t)x.numel, 1e-5, 1e-6);
        printf("max error: %.3g vs CPU reference in double (tolerance %.3g): %s\n", cmp.max_err,
               cmp.tol, cmp.pass ? "PASS" : "FAIL");
        if (!cmp.pass) { goto done; }
    }
    if (o->grad_output && run_backward(o, ffn, &Ly, &x, &dy, T) != 0) { goto done; }
    if (clffn_npy_save(o->output, y, x.rank, x.shape, err) != 0) {
        report("%s: %s", o->output, err);
        if (o->grads_out) { remove(o->grads_out); } /* the run failed: no file of it stays */
        goto done;
    }
    rc = 0;

done:
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    free(y);
    free(ref);
    clffn_npy_free(&x);
    clffn_npy_free(&dy);
    loaded_free(&L);
    clffn_st_close(&st);
    return rc;
}

#ifdef CLFFN_HAVE_MPI
#include "clffn-run-tp.c"
#endif

/* ------------------------------------------------------------------------------------------ */
/* The demo */

static int demo(const char *device) {
    const size_t T = (size_t)BATCH * SEQ;
    clffn_config cfg = clffn_config_default(D_MODEL, D_FF); /* ReLU, biases, dropout 0.1 */
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    int rc = 1;
    float *block = NULL, *x = NULL, *y = NULL, *hidden = NULL;
    double *ref = NULL;

    clffn_status st = clffn_context_create_for_device(device, &ctx);
    if (st == CLFFN_PLATFORM_NOT_FOUND) {
        fprintf(stderr, "clffn-run: no OpenCL platform found; install one, e.g. "
                        "`apt-get install pocl-opencl-icd` for the CPU.\n");
        return 1;
    }
    if (st != CLFFN_SUCCESS) { return fail("opening the device", st); }
    char name[256];
    if ((st = clffn_context_device_name(ctx, name, sizeof name)) != CLFFN_SUCCESS) {
        rc = fail("querying the device", st);
        goto done;
    }
    if ((st = clffn_ffn_create(ctx, &cfg, &ffn)) != CLFFN_SUCCESS) {
        rc = fail("creating the FFN", st);
        if (*clffn_context_build_log(ctx)) {
            fprintf(stderr, "%s\n", clffn_context_build_log(ctx));
        }
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
    const clffn_weight_arrays wa = {
        block, block + 2 * (size_t)D_MODEL * D_FF, NULL,
        NULL,  block + (size_t)D_MODEL * D_FF,     block + 2 * (size_t)D_MODEL * D_FF + D_FF};
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
    const double t0 = tool_now_s();
    st = clffn_forward_host(ffn, T, x, T * D_MODEL, y, T * D_MODEL);
    const double first = tool_now_s() - t0;
    double best = INFINITY;
    for (int r = 0; r < REPS && st == CLFFN_SUCCESS; ++r) {
        const double t1 = tool_now_s();
        st = clffn_forward_host(ffn, T, x, T * D_MODEL, y, T * D_MODEL);
        const double dt = tool_now_s() - t1;
        if (dt < best) { best = dt; }
    }
    if (st != CLFFN_SUCCESS) {
        rc = fail("running the forward pass", st);
        goto done;
    }
    size_t ht = 0;
    if ((st = clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_PRE, hidden, T * D_FF, &ht)) !=
        CLFFN_SUCCESS) {
        rc = fail("reading the hidden tensor", st);
        goto done;
    }

    if ((st = clffn_reference_forward(&cfg, CLFFN_LAYOUT_OUT_IN, &hw, T, x, 0, 0, 0, ref, NULL)) !=
        CLFFN_SUCCESS) {
        rc = fail("running the CPU reference", st);
        goto done;
    }
    const tool_comparison cmp = tool_compare(y, ref, T * D_MODEL, 1e-5, 1e-6);
    const double flops = 2.0 * 2.0 * (double)T * D_MODEL * D_FF;

    printf("clffn %s — position-wise FFN demo\n", clffn_version_string());
    printf("device:        %s\n", name);
    printf("FFN:           d_model %d, d_ff %d, %s, dropout %.1f (inference mode)\n", D_MODEL, D_FF,
           clffn_activation_name(cfg.activation), (double)cfg.dropout);
    printf("input shape:   (%d, %d, %d)\n", BATCH, SEQ, D_MODEL);
    printf("hidden shape:  (%zu, %d, %d)   [w_1(x), read back]\n", ht / SEQ, SEQ, D_FF);
    printf("output shape:  (%d, %d, %d)\n", BATCH, SEQ, D_MODEL);
    printf(
        "time:          %.3f ms per forward (best of %d; first call %.3f s incl. kernel builds)\n",
        best * 1e3, REPS, first);
    printf("throughput:    %.1f GFLOP/s\n", flops / best * 1e-9);
    printf("max error:     %.3g vs CPU reference in double (tolerance %.3g): %s\n", cmp.max_err,
           cmp.tol, cmp.pass ? "PASS" : "FAIL");
    rc = cmp.pass ? 0 : 1;

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

static int tool_main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!o.weights) { return demo(o.device); }
    if (o.tensor_parallel) {
#ifdef CLFFN_HAVE_MPI
        if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
            fprintf(stderr, "clffn-run: MPI_Init failed\n");
            return EXIT_RUNTIME;
        }
        const int rc = run_tensor_parallel(&o);
        MPI_Finalize();
        return rc;
#else
        fprintf(stderr, "clffn-run: --tensor-parallel needs MPI, and this clffn-run was built "
                        "without it (install libopenmpi-dev and rebuild)\n");
        return EXIT_USAGE;
#endif
    }
    return run_checkpoint(&o);
}

int main(int argc, char **argv) { return tool_exit("clffn-run", tool_main(argc, argv)); }
