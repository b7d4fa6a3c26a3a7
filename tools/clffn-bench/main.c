/* clffn-bench: how fast is the FFN on this device, and how does it compare with the host's BLAS.
 *
 *   clffn-bench --tokens T --d-model D --d-ff F --activation A [--gated] [--bias on|off]
 *               [--reps N] [--json]
 *               [--compare-cpu] [--sweep] [--device SPEC] [--k-block N] [--gemv-max N]
 *               [--weight-layout out_in|in_out] [--weights-dtype TYPE] [--kernel-max N]
 *               [--quantized-inputs] [--experts E [--top-k K] [--expert-split N]
 *               [--moe-counts device|host|auto] [--moe-grouping on|off]]
 *               [--fused-epilogues on|off] [--dequant-tiles on|off] [--row-group-cols N]
 *
 * Times N device-level forwards (after two warm-ups) with the wall clock around each forward and
 * its completion, reports best and median, GFLOP/s, the per-stage split from OpenCL profiling
 * events, and the time from process start to the first result (kernel builds included).
 * --compare-cpu runs the same FFN through the host's CBLAS (OpenBLAS) in the same process, side
 * by side, and again with the best OpenBLAS core the CPU's flags allow where its detection
 * chose another (cpu.c), keeping the faster. --sweep prints CSV over token counts 1 … 8192
 * (plot it with scripts/plot-sweep.gp).
 * --k-block overrides the SGEMM inner-dimension block the tuning profile chose (0: none), and
 * --gemv-max the small-batch crossover (0: every product an SGEMM), and --weight-layout the
 * layout the weights are kept in on the device (clffn_context_set_weight_layout), and
 * --kernel-max the count up to which clffn's own kernels take the weights' type, so the
 * choices can be compared in one sitting; --quantized-inputs rounds the inputs of q8_0 and q4_0
 * products to q8_0 first (clffn_context_set_quantized_inputs), and --fused-epilogues on|off
 * says whether few-token products apply the epilogues (clffn_context_set_fused_epilogues; the
 * device's default otherwise), and --dequant-tiles on|off how compressed blocks are dequantized
 * for SGEMM (clffn_context_set_dequant_tiles), and --row-group-cols from how large an input a
 * CPU's row kernels take rows several at a time (clffn_context_set_row_group_cols). Few tokens
 * are bound by reading the weights, so both modes also report the weights' bytes over the
 * forward's time beside the device's copy bandwidth, measured here with a plain copy kernel
 * ((bytes read + bytes written) / time, as STREAM's copy counts them). --experts times a
 * mixture-of-experts layer of such FFNs instead (moe.c). --bias off drops b1 and b2, as the
 * decoder models' FFNs and experts have none (ggml's peer programs in scripts/peers/ too), so
 * that a comparison with them times the same work.
 *
 * Exit status: 0 success, 1 device or runtime failure, 2 usage. */
#include "bench.h"
#include "common.h"
#include "options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

timing bench_summarize(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    timing r = {t[0], n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2])};
    return r;
}

double bench_flops(const args *a, size_t tokens) {
    return 2.0 * (double)tokens * (double)a->d_model * (double)a->d_ff * (a->gated ? 3.0 : 2.0);
}

double bench_weight_bytes(const args *a) {
    return 4.0 * (double)a->d_model * (double)a->d_ff * (a->gated ? 3.0 : 2.0);
}

const char *bench_layout_name(clffn_layout l) {
    return l == CLFFN_LAYOUT_IN_OUT ? "in_out" : "out_in";
}

int bench_fail(const char *what, clffn_status st) {
    fprintf(stderr, "clffn-bench: %s: %s\n", what, clffn_status_string(st));
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* The command line */

enum {
    OPT_TOKENS = 256,
    OPT_D_MODEL,
    OPT_D_FF,
    OPT_ACTIVATION,
    OPT_GATED,
    OPT_BIAS,
    OPT_REPS,
    OPT_JSON,
    OPT_COMPARE_CPU,
    OPT_SWEEP,
    OPT_DEVICE,
    OPT_K_BLOCK,
    OPT_GEMV_MAX,
    OPT_WEIGHT_LAYOUT,
    OPT_WEIGHTS_DTYPE,
    OPT_KERNEL_MAX,
    OPT_QUANTIZED_INPUTS,
    OPT_CPU_ONLY,
    OPT_EXPERTS,
    OPT_TOP_K,
    OPT_EXPERT_SPLIT,
    OPT_MOE_COUNTS,
    OPT_MOE_GROUPING,
    OPT_FUSED_EPILOGUES,
    OPT_DEQUANT_TILES,
    OPT_ROW_GROUP_COLS,
};

static const tool_option OPTIONS[] = {
    {"tokens", OPT_TOKENS, TOOL_VALUE, "T", "token rows (default 640)"},
    {"d-model", OPT_D_MODEL, TOOL_VALUE, "D", "d_model (default 512)"},
    {"d-ff", OPT_D_FF, TOOL_VALUE, "F", "d_ff (default 2048)"},
    {"activation", OPT_ACTIVATION, TOOL_VALUE, "A",
     "relu (default), gelu, gelu_tanh, silu, sigmoid, identity, or a\nGLU name (swiglu = silu "
     "+ --gated)"},
    {"gated", OPT_GATED, TOOL_FLAG, NULL, "the gated (GLU) FFN"},
    {"bias", OPT_BIAS, TOOL_VALUE, "on|off",
     "the layers' biases b1, b2 (on, the default, as the seeds'\nFFN has them) or none (off, as "
     "LLaMA's, Mixtral's\nand Qwen's FFNs and their experts)"},
    {"reps", OPT_REPS, TOOL_VALUE, "N", "timed runs after two warm-ups (default 20)"},
    {"json", OPT_JSON, TOOL_FLAG, NULL, "one JSON document instead of the text"},
    {"compare-cpu", OPT_COMPARE_CPU, TOOL_FLAG, NULL,
#ifdef CLFFN_HAVE_CBLAS
     "the same FFN through the host's CBLAS, side by side"
#else
     "the same FFN through the host's CBLAS, side by side\n(not built: no CBLAS found)"
#endif
    },
    {"sweep", OPT_SWEEP, TOOL_FLAG, NULL,
     "CSV over token counts 1 ... 8192 (scripts/plot-sweep.gp plots it)"},
    {"device", OPT_DEVICE, TOOL_VALUE, "SPEC", "\"platform:device\" or a name substring"},
    {"k-block", OPT_K_BLOCK, TOOL_VALUE, "N",
     "SGEMM inner-dimension block for every product, instead of the\ntuning profile's block "
     "and row threshold (0: none)"},
    {"gemv-max", OPT_GEMV_MAX, TOOL_VALUE, "N",
     "run products of up to N tokens as GEMVs instead of the\nprofile's crossover (0: every "
     "product an SGEMM)"},
    {"weight-layout", OPT_WEIGHT_LAYOUT, TOOL_VALUE, "L",
     "keep the weights out_in or in_out on the device instead of\nthe profile's layout"},
    {"weights-dtype", OPT_WEIGHTS_DTYPE, TOOL_VALUE, "TYPE",
     "keep the weights in f32 (default), f16, bf16, q8_0 or q4_0\n(converted on the host as "
     "GGUF rounds); with --sweep, all: each"},
    {"kernel-max", OPT_KERNEL_MAX, TOOL_VALUE, "N",
     "run up to N tokens through clffn's own kernels for the\nweights' type (with "
     "--quantized-inputs too) instead of the\nprofile's crossovers (0: never; past 16 in "
     "passes of 16)"},
    {"quantized-inputs", OPT_QUANTIZED_INPUTS, TOOL_FLAG, NULL,
     "round the inputs of q8_0 and q4_0 products to q8_0 first\n(of bf16 ones to bf16), as "
     "llama.cpp does\n(clffn_context_set_quantized_inputs)"},
    {"experts", OPT_EXPERTS, TOOL_VALUE, "E",
     "a mixture-of-experts layer of E such FFNs with a router,\nbeside the dense FFN doing the "
     "same rows per expert"},
    {"top-k", OPT_TOP_K, TOOL_VALUE, "K", "experts per token with --experts (default 2)"},
    {"expert-split", OPT_EXPERT_SPLIT, TOOL_VALUE, "N",
     "split the --experts layer's experts over N contexts of\nthe device (on one device: what "
     "the split costs)"},
    {"moe-counts", OPT_MOE_COUNTS, TOOL_VALUE, "WHERE",
     "keep the --experts layer's expert counts on the device\n(default), read them back to the "
     "host, or auto: on the host\nwhere E > T*k (clffn_moe_set_counts)"},
    {"moe-grouping", OPT_MOE_GROUPING, TOOL_VALUE, "on|off",
     "run the --experts layer's experts a launch a stage for\nall of them (on, the default) or "
     "one at a time\n(clffn_moe_set_grouping)"},
    {"fused-epilogues", OPT_FUSED_EPILOGUES, TOOL_VALUE, "on|off",
     "apply the epilogues in few-token products' kernels (on,\nthe default) or in launches of "
     "their own\n(clffn_context_set_fused_epilogues)"},
    {"dequant-tiles", OPT_DEQUANT_TILES, TOOL_VALUE, "on|off",
     "dequantize compressed blocks for SGEMM through local-memory\ntiles (the default but on "
     "CPU devices) or a tile a work-item\n(clffn_context_set_dequant_tiles)"},
    {"row-group-cols", OPT_ROW_GROUP_COLS, TOOL_VALUE, "N",
     "on a CPU device, take rows several to a work-item of the\nfew-token kernels where a "
     "product's input has N floats or\nmore, instead of the profile's boundary\n"
     "(clffn_context_set_row_group_cols)"},
    /* the CPU FFN alone, in a child with another OpenBLAS core (cpu.c) */
    {"cpu-only", OPT_CPU_ONLY, TOOL_FLAG, NULL, NULL},
    {0},
};

static const tool_cli CLI = {
    "clffn-bench",
    "[options]",
    "Defaults: the seed example, 640 tokens, 512 -> 2048, relu, 20 reps.\n"
    "Exit status: 0 success, 1 device or runtime failure, 2 usage.\n",
    OPTIONS,
};

/* A whole number option: 0, or -1 with the refusal printed (the message names the range). */
static int take_size(const char *name, const char *v, size_t min, size_t max, size_t *out) {
    if (tool_parse_size(v, min, max, out) == 0) { return 0; }
    if (min == 1) {
        fprintf(stderr, "clffn-bench: --%s needs a positive integer\n", name);
    } else {
        fprintf(stderr, "clffn-bench: --%s needs an integer %zu ... %zu\n", name, min, max);
    }
    return -1;
}

static int take_on_off(const char *name, const char *v, int *out) {
    if (tool_parse_on_off(v, out) == 0) { return 0; }
    fprintf(stderr, "clffn-bench: --%s takes on or off\n", name);
    return -1;
}

static int take_option(int key, const char *name, const char *v, args *a) {
    const size_t big = (size_t)1 << 40;
    size_t n;
    int g = 0, on;
    switch (key) {
    case OPT_TOKENS: return take_size(name, v, 1, big, &a->tokens);
    case OPT_D_MODEL: return take_size(name, v, 1, big, &a->d_model);
    case OPT_D_FF: return take_size(name, v, 1, big, &a->d_ff);
    case OPT_REPS:
        if (take_size(name, v, 1, big, &n) != 0) { return -1; }
        a->reps = n > 100000 ? 100000 : (int)n;
        return 0;
    case OPT_ACTIVATION:
        if (clffn_activation_parse(v, &a->act, &g) != CLFFN_SUCCESS) {
            fprintf(stderr, "clffn-bench: unknown activation '%s'\n", v);
            return -1;
        }
        a->gated |= g;
        return 0;
    case OPT_DEVICE: a->device = v; return 0;
    case OPT_K_BLOCK:
        a->set_k_block = 1;
        return take_size(name, v, 0, CLFFN_MAX_GEMM_K_BLOCK, &a->k_block);
    case OPT_GEMV_MAX:
        a->set_gemv_max = 1;
        return take_size(name, v, 0, CLFFN_MAX_GEMV_TOKENS, &a->gemv_max);
    case OPT_EXPERTS: return take_size(name, v, 1, 1u << 24, &a->experts);
    case OPT_TOP_K: return take_size(name, v, 1, 1u << 24, &a->top_k);
    case OPT_EXPERT_SPLIT: return take_size(name, v, 1, 64, &a->split);
    case OPT_MOE_COUNTS:
        a->set_counts = 1;
        if (tool_parse_moe_counts(v, &a->counts) == 0) { return 0; }
        fprintf(stderr, "clffn-bench: --moe-counts takes device, host or auto\n");
        return -1;
    case OPT_MOE_GROUPING:
        a->set_grouping = 1;
        if (take_on_off(name, v, &on) != 0) { return -1; }
        a->ungrouped = !on;
        return 0;
    case OPT_FUSED_EPILOGUES:
        if (take_on_off(name, v, &on) != 0) { return -1; }
        a->unfused = !on;
        return 0;
    case OPT_BIAS:
        if (take_on_off(name, v, &on) != 0) { return -1; }
        a->no_bias = !on;
        return 0;
    case OPT_DEQUANT_TILES: return take_on_off(name, v, &a->dequant_tiles);
    case OPT_ROW_GROUP_COLS:
        a->set_row_group = 1;
        return take_size(name, v, 0, (size_t)1 << 40, &a->row_group);
    case OPT_KERNEL_MAX:
        a->set_kernel_max = 1;
        return take_size(name, v, 0, (size_t)1 << 30, &a->kernel_max);
    case OPT_WEIGHT_LAYOUT:
        if (strcmp(v, "out_in") && strcmp(v, "in_out")) {
            fprintf(stderr, "clffn-bench: --weight-layout takes out_in or in_out\n");
            return -1;
        }
        a->set_layout = 1;
        a->layout = strcmp(v, "in_out") ? CLFFN_LAYOUT_OUT_IN : CLFFN_LAYOUT_IN_OUT;
        return 0;
    case OPT_WEIGHTS_DTYPE:
        a->all_dtypes = !strcmp(v, "all");
        if (a->all_dtypes || clffn_dtype_parse(v, &a->dtype) == CLFFN_SUCCESS) { return 0; }
        fprintf(stderr, "clffn-bench: --weights-dtype takes f32, f16, bf16, q8_0, q4_0 or all\n");
        return -1;
    case OPT_GATED: a->gated = 1; return 0;
    case OPT_JSON: a->json = 1; return 0;
    case OPT_COMPARE_CPU: a->compare_cpu = 1; return 0;
    case OPT_SWEEP: a->sweep = 1; return 0;
    case OPT_QUANTIZED_INPUTS: a->quantized_inputs = 1; return 0;
    case OPT_CPU_ONLY: a->cpu_only = 1; return 0;
    default: return -1;
    }
}

/* The options into a: -1 to run, else the exit status (0 after --help, 2 after a refusal). */
static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->tokens = 640, a->d_model = 512, a->d_ff = 2048, a->act = CLFFN_ACT_RELU, a->reps = 20;
    a->dequant_tiles = -1;
    tool_parser p = tool_parser_start(&CLI, argc, argv);
    for (int key; (key = tool_next(&p)) > 0;) {
        if (take_option(key, p.name, p.value, a) != 0) { return tool_usage_error(&CLI); }
    }
    if (p.status >= 0) { return p.status; }
    if ((a->top_k || a->split || a->set_counts || a->set_grouping) && !a->experts) {
        fprintf(stderr, "clffn-bench: --top-k, --expert-split, --moe-counts and --moe-grouping "
                        "go with --experts\n");
        return tool_usage_error(&CLI);
    }
    if (a->split > a->experts) {
        fprintf(stderr, "clffn-bench: --expert-split takes 1 to E contexts\n");
        return tool_usage_error(&CLI);
    }
    if (a->experts && !a->top_k) { a->top_k = a->experts < 2 ? a->experts : 2; }
    if (a->top_k > a->experts || (a->experts && (a->sweep || a->compare_cpu))) {
        fprintf(stderr, "clffn-bench: --experts takes --top-k from 1 to E, and goes without "
                        "--sweep and --compare-cpu\n");
        return tool_usage_error(&CLI);
    }
    if (a->all_dtypes && !a->sweep) {
        fprintf(stderr, "clffn-bench: --weights-dtype all goes with --sweep\n");
        return tool_usage_error(&CLI);
    }
#ifndef CLFFN_HAVE_CBLAS
    if (a->compare_cpu) {
        fprintf(stderr,
                "clffn-bench: --compare-cpu needs a CBLAS, and none was found at build time\n");
        return tool_usage_error(&CLI);
    }
#endif
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Runs */

/* --sweep, one weight type: a CSV row per token count 1, 2, 4, … 8192. */
static int sweep_dtype(const args *a) {
    enum { MAX_T = 8192 };
    device_run r;
    double copy = 0;
    if (device_setup(&r, a, MAX_T, NULL) != 0 || copy_bandwidth(&r, &copy) != 0) {
        device_teardown(&r);
        return 1;
    }
#ifdef CLFFN_HAVE_CBLAS
    cpu_run c = {0};
    if (a->compare_cpu && cpu_setup(&c, a, MAX_T) != 0) {
        cpu_teardown(&c);
        device_teardown(&r);
        return 1;
    }
#endif
    const double wbytes = (double)clffn_ffn_weight_bytes(r.ffn);
    int rc = 0;
    for (size_t T = 1; T <= MAX_T && rc == 0; T *= 2) {
        timing t;
        const int reps = T >= 2048 ? (a->reps < 5 ? a->reps : 5) : a->reps;
        if ((rc = device_time(&r, T, reps, &t, NULL)) != 0) { break; }
        printf("%zu,%.4g,%.4g,%.4g", T, bench_flops(a, T) / t.best_s * 1e-9,
               wbytes / t.best_s * 1e-9, copy);
#ifdef CLFFN_HAVE_CBLAS
        cpu_timing ct;
        if (a->compare_cpu && (rc = cpu_fair_time(&c, a, T, reps, &ct)) == 0) {
            printf(",%.4g,%.4g,%s", bench_flops(a, T) / ct.best.best_s * 1e-9,
                   bench_weight_bytes(a) / ct.best.best_s * 1e-9, ct.core);
        }
#endif
        printf(",%s\n", clffn_dtype_name(a->dtype));
        fflush(stdout);
    }
#ifdef CLFFN_HAVE_CBLAS
    if (a->compare_cpu) { cpu_teardown(&c); }
#endif
    device_teardown(&r);
    return rc;
}

/* --sweep: the CSV's header, then the rows of the type asked for, or of each in turn. */
static int sweep(const args *a) {
    printf("tokens,clffn_gflops,clffn_weights_gbps,copy_gbps%s,weights_dtype\n",
           a->compare_cpu ? ",cpu_blas_gflops,cpu_blas_weights_gbps,cpu_blas_core" : "");
    if (!a->all_dtypes) { return sweep_dtype(a); }
    int rc = 0;
    for (int t = 0; t < (int)CLFFN_DTYPE_COUNT_ && rc == 0; ++t) {
        args one = *a;
        one.dtype = (clffn_dtype)t;
        rc = sweep_dtype(&one);
    }
    return rc;
}

/* One shape: the timed forwards and backwards, the copy bandwidth, and the CPU's time, on a
 * device already set up. 0 or 1 (printed). */
static int measure(const args *a, device_run *r, bench_result *res) {
    clffn_stage_times *s = &res->stages;
    if (device_time(r, a->tokens, a->reps, &res->fwd, s) != 0 ||
        backward_time(r, a->tokens, a->reps, &res->bwd) != 0 ||
        copy_bandwidth(r, &res->copy_gbps) != 0) {
        return 1;
    }
    const double n = (double)a->reps;
    s->gemm1_s /= n, s->gemm2_s /= n, s->epilogue1_s /= n, s->epilogue2_s /= n, s->total_s /= n;
#ifdef CLFFN_HAVE_CBLAS
    if (a->compare_cpu) {
        cpu_run c = {0};
        const int rc = cpu_setup(&c, a, a->tokens) != 0 ||
                       cpu_fair_time(&c, a, a->tokens, a->reps, &res->cpu) != 0;
        cpu_teardown(&c);
        if (rc) { return 1; }
        res->have_cpu = 1;
    }
#endif
    return 0;
}

static int single(const args *a, double process_start) {
    device_run r;
    bench_result res;
    memset(&res, 0, sizeof res);
    const double before_main = bench_seconds_since_exec() - (tool_now_s() - process_start);
    if (device_setup(&r, a, a->tokens, &res.startup) != 0) {
        device_teardown(&r);
        return 1;
    }
    const double first_start = tool_now_s();
    if (device_forward(&r, a->tokens, NULL) != 0) {
        device_teardown(&r);
        return 1;
    }
    startup_times *su = &res.startup;
    su->first = tool_now_s() - first_start;
    su->before_main = before_main >= 0 ? before_main : -1;
    res.startup_s = tool_now_s() - process_start + (su->before_main > 0 ? su->before_main : 0);
    const int rc = measure(a, &r, &res);
    if (rc == 0 && a->json) {
        bench_report_json(a, &r, &res);
    } else if (rc == 0) {
        bench_report_text(a, &r, &res);
    }
    device_teardown(&r);
    return rc;
}

static int tool_main(int argc, char **argv) {
    const double process_start = tool_now_s();
    args a;
    const int rc = parse_args(argc, argv, &a);
    if (rc >= 0) { return rc; }
#ifdef CLFFN_HAVE_CBLAS
    if (a.cpu_only) { return cpu_only(&a, &a.tokens, 1); }
#endif
    if (a.experts) { return bench_moe(&a); }
    return a.sweep ? sweep(&a) : single(&a, process_start);
}

int main(int argc, char **argv) { return tool_exit("clffn-bench", tool_main(argc, argv)); }
