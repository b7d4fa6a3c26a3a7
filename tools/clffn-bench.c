/* clffn-bench: how fast is the FFN on this device, and how does it compare with the host's BLAS.
 *
 *   clffn-bench --tokens T --d-model D --d-ff F --activation A [--gated] [--reps N] [--json]
 *               [--compare-cpu] [--sweep] [--device SPEC] [--k-block N] [--gemv-max N]
 *               [--weight-layout out_in|in_out]
 *
 * Times N device-level forwards (after two warm-ups) with the wall clock around each forward and
 * its clFinish, reports best and median, GFLOP/s, the per-stage split from OpenCL profiling
 * events, and the time from process start to the first result (kernel builds included).
 * --compare-cpu runs the same FFN through the host's CBLAS (OpenBLAS) in the same process, side
 * by side. --sweep prints CSV over token counts 1 … 8192 (plot it with tools/plot-sweep.gp).
 * --k-block overrides the SGEMM inner-dimension block the tuning profile chose (0: none), and
 * --gemv-max the small-batch crossover (0: every product an SGEMM), and --weight-layout the
 * layout the weights are kept in on the device (clffn_context_set_weight_layout), so the
 * choices can be
 * compared in one sitting. Few tokens are bound by reading the weights, so both modes also
 * report the weights' bytes over the forward's time beside the device's copy bandwidth,
 * measured here with a plain copy kernel ((bytes read + bytes written) / time, as STREAM's
 * copy counts them).
 *
 * Exit status: 0 success, 1 device or runtime failure, 2 usage. */
#define CLFFN_HOOKS /* clffn_context_xgemm_few_rows: what the run used */
#include "clffn.h"
#include "common.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef CLFFN_HAVE_CBLAS
#include <cblas.h>
#endif

static double process_start;

/* Where the time to the first result goes, in seconds. before_main is the process's own start
 * (the dynamic loader mapping clffn, CLBlast and the ICD loader) as Linux's /proc says it, at
 * the kernel clock's tick; -1 where that is not available. */
typedef struct startup_times {
    double before_main; /* exec to main */
    double platforms;   /* the first clGetPlatformIDs: the ICD loader opens the drivers */
    double context;     /* device choice, OpenCL context and queue, tuning profile */
    double ffn;         /* clffn_ffn_create: clffn's kernels built (from the driver's cache) */
    double weights;     /* initial weights made on the host and uploaded */
    double first;       /* the first forward: CLBlast's kernels built, first launches */
} startup_times;

/* Seconds from this process's exec to now, from /proc/self/stat's start time (clock ticks since
 * boot) and CLOCK_BOOTTIME; -1 off Linux. */
static double seconds_since_exec(void) {
#if defined(__linux__) && defined(CLOCK_BOOTTIME)
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) { return -1; }
    char buf[1024];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    unsigned long long start = 0;
    /* after ") " come fields 3 … ; the start time is field 22 */
    if (!p || sscanf(p + 2,
                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                     "%*d %*d %llu",
                     &start) != 1) {
        return -1;
    }
    const long hz = sysconf(_SC_CLK_TCK);
    struct timespec ts;
    if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &ts) != 0) { return -1; }
    const double d = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - (double)start / (double)hz;
    return d >= 0 ? d : -1;
#else
    return -1;
#endif
}

typedef struct args {
    size_t tokens, d_model, d_ff;
    clffn_activation act;
    int gated, reps, json, compare_cpu, sweep;
    const char *device;
    int set_k_block; /* --k-block given */
    size_t k_block;
    int set_gemv_max; /* --gemv-max given */
    size_t gemv_max;
    int set_layout; /* --weight-layout given */
    clffn_layout layout;
} args;

static const char *layout_name(clffn_layout l) {
    return l == CLFFN_LAYOUT_IN_OUT ? "in_out" : "out_in";
}

typedef struct timing {
    double best_s, median_s;
} timing;

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static timing summarize(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    timing r = {t[0], n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2])};
    return r;
}

static double flops_of(const args *a, size_t tokens) {
    return 2.0 * (double)tokens * (double)a->d_model * (double)a->d_ff * (a->gated ? 3.0 : 2.0);
}

/* The bytes of W1 (and V) and W2, each read at least once per forward. */
static double weight_bytes(const args *a) {
    return 4.0 * (double)a->d_model * (double)a->d_ff * (a->gated ? 3.0 : 2.0);
}

/* ------------------------------------------------------------------------------------------ */
/* The device FFN */

typedef struct device_run {
    clffn_context *ctx;
    clffn_ffn *ffn;
    cl_mem x, y, dy, dx, g[5]; /* g: dW1 (stacked with dV), db1, dbv, dW2, db2 */
    size_t cap;
} device_run;

static int fail(const char *what, clffn_status st) {
    fprintf(stderr, "clffn-bench: %s: %s\n", what, clffn_status_string(st));
    return 1;
}

/* Opens the device and makes the FFN and the buffers for up to max_tokens; st, when not NULL,
 * gets the time each step took. */
static int device_setup(device_run *r, const args *a, size_t max_tokens, startup_times *st_out) {
    memset(r, 0, sizeof *r);
    startup_times tm = {0};
    clffn_config c = clffn_config_default(a->d_model, a->d_ff);
    c.activation = a->act;
    c.gated = a->gated;
    double t0 = tool_now_s();
    cl_uint n_platforms = 0;
    clGetPlatformIDs(0, NULL, &n_platforms); /* timed alone; its result is the context's concern */
    tm.platforms = tool_now_s() - t0;
    t0 = tool_now_s();
    clffn_status st = clffn_context_create_for_device(a->device, &r->ctx);
    tm.context = tool_now_s() - t0;
    if (st != CLFFN_SUCCESS) { return fail("opening the device", st); }
    /* --k-block applies to every product, whatever the profile's row threshold */
    if (a->set_k_block &&
        ((st = clffn_context_set_gemm_k_block(r->ctx, a->k_block)) != CLFFN_SUCCESS ||
         (st = clffn_context_set_gemm_k_block_min_rows(r->ctx, 0)) != CLFFN_SUCCESS)) {
        return fail("--k-block", st);
    }
    if (a->set_gemv_max &&
        (st = clffn_context_set_gemv_max_tokens(r->ctx, a->gemv_max)) != CLFFN_SUCCESS) {
        return fail("--gemv-max", st);
    }
    if (a->set_layout &&
        (st = clffn_context_set_weight_layout(r->ctx, a->layout)) != CLFFN_SUCCESS) {
        return fail("--weight-layout", st);
    }
    t0 = tool_now_s();
    if ((st = clffn_ffn_create(r->ctx, &c, &r->ffn)) != CLFFN_SUCCESS) {
        return fail("creating the FFN", st);
    }
    tm.ffn = tool_now_s() - t0;
    t0 = tool_now_s();
    if ((st = clffn_ffn_init_weights(r->ffn, CLFFN_INIT_TORCH_LINEAR, 1)) != CLFFN_SUCCESS ||
        (st = clffn_ffn_set_profiling(r->ffn, 1)) != CLFFN_SUCCESS) {
        return fail("creating the FFN", st);
    }
    tm.weights = tool_now_s() - t0;
    if (st_out) { *st_out = tm; }
    cl_int err;
    const size_t bytes = max_tokens * a->d_model * sizeof(float);
    r->x = clCreateBuffer(clffn_context_cl_context(r->ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err == CL_SUCCESS) {
        r->y =
            clCreateBuffer(clffn_context_cl_context(r->ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    }
    if (err == CL_SUCCESS) {
        r->dy =
            clCreateBuffer(clffn_context_cl_context(r->ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    }
    if (err == CL_SUCCESS) {
        r->dx =
            clCreateBuffer(clffn_context_cl_context(r->ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    }
    const size_t D = a->d_model, F = a->d_ff, gsz[5] = {(a->gated ? 2 : 1) * D * F, F, F, D * F, D};
    for (int i = 0; i < 5 && err == CL_SUCCESS; ++i) {
        r->g[i] = clCreateBuffer(clffn_context_cl_context(r->ctx), CL_MEM_READ_WRITE,
                                 gsz[i] * sizeof(float), NULL, &err);
    }
    if (err != CL_SUCCESS) { return fail("allocating the buffers", (clffn_status)err); }
    float *host = malloc(bytes);
    if (!host) { return fail("allocating x", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
    for (size_t i = 0; i < max_tokens * a->d_model; ++i) { host[i] = (float)sin(0.01 * (double)i); }
    err = clEnqueueWriteBuffer(clffn_context_queue(r->ctx), r->x, CL_TRUE, 0, bytes, host, 0, NULL,
                               NULL);
    if (err == CL_SUCCESS) {
        err = clEnqueueWriteBuffer(clffn_context_queue(r->ctx), r->dy, CL_TRUE, 0, bytes, host, 0,
                                   NULL, NULL);
    }
    free(host);
    if (err != CL_SUCCESS) { return fail("uploading x", (clffn_status)err); }
    r->cap = max_tokens;
    return 0;
}

static void device_teardown(device_run *r) {
    cl_mem all[] = {r->x, r->y, r->dy, r->dx, r->g[0], r->g[1], r->g[2], r->g[3], r->g[4]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) {
        if (all[i]) { clReleaseMemObject(all[i]); }
    }
    clffn_ffn_destroy(r->ffn);
    clffn_context_destroy(r->ctx);
}

static int device_forward(device_run *r, size_t tokens, clffn_stage_times *stages) {
    cl_command_queue q = clffn_context_queue(r->ctx);
    clffn_status st = clffn_forward(r->ffn, tokens, r->x, 0, r->y, 0, q, NULL);
    if (st == CLFFN_SUCCESS) { st = (clffn_status)clFinish(q); }
    if (st == CLFFN_SUCCESS && stages) { st = clffn_ffn_stage_times(r->ffn, stages); }
    if (st != CLFFN_SUCCESS) { return fail("forward", st); }
    return 0;
}

/* reps timed backwards (each after an untimed forward of the same tokens) */
static int backward_time(device_run *r, size_t tokens, int reps, timing *t) {
    double *ts = malloc((size_t)reps * sizeof *ts);
    if (!ts) { return fail("timing", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
    cl_command_queue q = clffn_context_queue(r->ctx);
    const clffn_device_weights g = {{r->g[0], 0}, {r->g[1], 0}, {NULL, 0},
                                    {r->g[2], 0}, {r->g[3], 0}, {r->g[4], 0}};
    for (int i = -2; i < reps; ++i) { /* two warm-ups */
        if (device_forward(r, tokens, NULL) != 0) {
            free(ts);
            return 1;
        }
        const double t0 = tool_now_s();
        clffn_status st =
            clffn_backward(r->ffn, tokens, r->x, 0, r->dy, 0, r->dx, 0, &g, 0, q, NULL);
        if (st == CLFFN_SUCCESS) { st = (clffn_status)clFinish(q); }
        if (st != CLFFN_SUCCESS) {
            free(ts);
            return fail("backward", st);
        }
        if (i >= 0) { ts[i] = tool_now_s() - t0; }
    }
    *t = summarize(ts, reps);
    free(ts);
    return 0;
}

/* reps timed forwards after two warm-ups; stage times summed over the reps */
static int device_time(device_run *r, size_t tokens, int reps, timing *t, clffn_stage_times *sum) {
    double *ts = malloc((size_t)reps * sizeof *ts);
    if (!ts) { return fail("timing", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
    for (int i = 0; i < 2; ++i) {
        if (device_forward(r, tokens, NULL) != 0) {
            free(ts);
            return 1;
        }
    }
    if (sum) { memset(sum, 0, sizeof *sum); }
    for (int i = 0; i < reps; ++i) {
        clffn_stage_times s;
        const double t0 = tool_now_s();
        if (device_forward(r, tokens, NULL) != 0) {
            free(ts);
            return 1;
        }
        ts[i] = tool_now_s() - t0;
        if (sum) {
            if (clffn_ffn_stage_times(r->ffn, &s) != CLFFN_SUCCESS) {
                free(ts);
                return 1;
            }
            sum->gemm1_s += s.gemm1_s, sum->epilogue1_s += s.epilogue1_s;
            sum->gemm2_s += s.gemm2_s, sum->epilogue2_s += s.epilogue2_s, sum->total_s += s.total_s;
        }
    }
    *t = summarize(ts, reps);
    free(ts);
    return 0;
}

/* The device's copy bandwidth: a float4 copy kernel over 2 × 128 MiB (or a quarter of the
 * largest allocation, if less), best of 5 after a warm-up, in GB/s of bytes read + written. */
static const char *COPY_SRC =
    "__kernel void copy4(__global const float4 *a, __global float4 *b) {\n"
    "  const size_t i = get_global_id(0);\n"
    "  b[i] = a[i];\n"
    "}\n";

static int copy_bandwidth(device_run *r, double *gbps) {
    cl_context cx = clffn_context_cl_context(r->ctx);
    cl_device_id dev = clffn_context_cl_device(r->ctx);
    cl_command_queue q = clffn_context_queue(r->ctx);
    cl_ulong max_alloc = 0;
    clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    size_t bytes = (size_t)128 << 20;
    if ((cl_ulong)bytes > max_alloc / 4) { bytes = (size_t)(max_alloc / 4) / 16 * 16; }
    cl_int err;
    cl_program p = clCreateProgramWithSource(cx, 1, &COPY_SRC, NULL, &err);
    if (err == CL_SUCCESS) { err = clBuildProgram(p, 1, &dev, "", NULL, NULL); }
    cl_kernel k = err == CL_SUCCESS ? clCreateKernel(p, "copy4", &err) : NULL;
    cl_mem a = err == CL_SUCCESS ? clCreateBuffer(cx, CL_MEM_READ_WRITE, bytes, NULL, &err) : NULL;
    cl_mem b = err == CL_SUCCESS ? clCreateBuffer(cx, CL_MEM_READ_WRITE, bytes, NULL, &err) : NULL;
    const float zero = 0.0f;
    if (err == CL_SUCCESS) { err = clEnqueueFillBuffer(q, a, &zero, 4, 0, bytes, 0, NULL, NULL); }
    if (err == CL_SUCCESS) { err = clSetKernelArg(k, 0, sizeof a, &a); }
    if (err == CL_SUCCESS) { err = clSetKernelArg(k, 1, sizeof b, &b); }
    double best = INFINITY;
    const size_t n = bytes / 16;
    for (int i = 0; i < 6 && err == CL_SUCCESS; ++i) {
        const double t0 = tool_now_s();
        err = clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL);
        if (err == CL_SUCCESS) { err = clFinish(q); }
        const double t = tool_now_s() - t0;
        if (i > 0 && t < best) { best = t; }
    }
    if (a) { clReleaseMemObject(a); }
    if (b) { clReleaseMemObject(b); }
    if (k) { clReleaseKernel(k); }
    if (p) { clReleaseProgram(p); }
    if (err != CL_SUCCESS) { return fail("measuring the copy bandwidth", (clffn_status)err); }
    *gbps = 2.0 * (double)bytes / best * 1e-9;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The same FFN through the host's CBLAS */

#ifdef CLFFN_HAVE_CBLAS
typedef struct cpu_run {
    float *x, *w1, *b1, *w2, *b2, *z, *h, *y;
} cpu_run;

static float act_f(clffn_activation a, float v) {
    switch (a) {
    case CLFFN_ACT_RELU: return v < 0.0f ? 0.0f : v;
    case CLFFN_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678f));
    case CLFFN_ACT_GELU_TANH:
        return 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    case CLFFN_ACT_SILU: return v / (1.0f + expf(-v));
    case CLFFN_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    default: return v;
    }
}

static int cpu_setup(cpu_run *r, const args *a, size_t max_tokens) {
    const size_t D = a->d_model, F = a->d_ff, N1 = a->gated ? 2 * F : F;
    r->x = malloc(max_tokens * D * sizeof(float));
    r->w1 = malloc(N1 * D * sizeof(float));
    r->b1 = malloc(N1 * sizeof(float));
    r->w2 = malloc(D * F * sizeof(float));
    r->b2 = malloc(D * sizeof(float));
    r->z = malloc(max_tokens * N1 * sizeof(float));
    r->h = malloc(max_tokens * F * sizeof(float));
    r->y = malloc(max_tokens * D * sizeof(float));
    if (!r->x || !r->w1 || !r->b1 || !r->w2 || !r->b2 || !r->z || !r->h || !r->y) {
        fprintf(stderr, "clffn-bench: out of memory for the CPU FFN\n");
        return 1;
    }
    for (size_t i = 0; i < max_tokens * D; ++i) { r->x[i] = (float)sin(0.01 * (double)i); }
    for (size_t i = 0; i < N1 * D; ++i) { r->w1[i] = (float)sin(0.37 * (double)i) * 0.04f; }
    for (size_t i = 0; i < D * F; ++i) { r->w2[i] = (float)cos(0.23 * (double)i) * 0.02f; }
    for (size_t i = 0; i < N1; ++i) { r->b1[i] = 0.01f; }
    for (size_t i = 0; i < D; ++i) { r->b2[i] = 0.01f; }
    return 0;
}

/* One FFN: SGEMM (W1 and V stacked, [out, in] as nn.Linear), the epilogue loop, SGEMM, + b2. */
static void cpu_forward(cpu_run *r, const args *a, size_t T) {
    const size_t D = a->d_model, F = a->d_ff, N1 = a->gated ? 2 * F : F;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)N1, (int)D, 1.0f, r->x,
                (int)D, r->w1, (int)D, 0.0f, r->z, (int)N1);
    for (size_t t = 0; t < T; ++t) {
        const float *z = r->z + t * N1;
        float *h = r->h + t * F;
        for (size_t j = 0; j < F; ++j) {
            float v = act_f(a->act, z[j] + r->b1[j]);
            if (a->gated) { v *= z[F + j] + r->b1[F + j]; }
            h[j] = v;
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)D, (int)F, 1.0f, r->h, (int)F,
                r->w2, (int)F, 0.0f, r->y, (int)D);
    for (size_t t = 0; t < T; ++t) {
        for (size_t i = 0; i < D; ++i) { r->y[t * D + i] += r->b2[i]; }
    }
}

static timing cpu_time(cpu_run *r, const args *a, size_t T, int reps) {
    double *ts = malloc((size_t)reps * sizeof *ts);
    cpu_forward(r, a, T);
    cpu_forward(r, a, T);
    for (int i = 0; i < reps; ++i) {
        const double t0 = tool_now_s();
        cpu_forward(r, a, T);
        ts[i] = tool_now_s() - t0;
    }
    timing t = summarize(ts, reps);
    free(ts);
    return t;
}

static void cpu_teardown(cpu_run *r) {
    free(r->x), free(r->w1), free(r->b1), free(r->w2), free(r->b2), free(r->z), free(r->h),
        free(r->y);
}
#endif

/* ------------------------------------------------------------------------------------------ */

static void usage(FILE *f) {
    fprintf(f,
            "usage: clffn-bench [--tokens T] [--d-model D] [--d-ff F] [--activation A] [--gated]\n"
            "                   [--reps N] [--json] [--compare-cpu] [--sweep] [--device SPEC]\n"
            "                   [--k-block N] [--gemv-max N] [--weight-layout out_in|in_out]\n"
            "defaults: the seed example, 640 tokens, 512 -> 2048, relu, 20 reps\n"
            "--activation takes the GLU names too (swiglu = silu + --gated)\n"
            "--compare-cpu  the same FFN through the host's CBLAS, side by side%s\n"
            "--sweep        CSV over token counts 1 ... 8192 (tools/plot-sweep.gp plots it)\n"
            "--k-block N    SGEMM inner-dimension block for every product, instead of the tuning\n"
            "               profile's block and row threshold (0: none)\n"
            "--gemv-max N   run products of up to N tokens as GEMVs instead of the profile's "
            "crossover\n"
            "               (0: every product an SGEMM)\n"
            "--weight-layout keep the weights [out, in] or [in, out] on the device instead of\n"
            "               the profile's layout\n",
#ifdef CLFFN_HAVE_CBLAS
            ""
#else
            " (not built: no CBLAS found)"
#endif
    );
}

static int parse_args(int argc, char **argv, args *a) {
    memset(a, 0, sizeof *a);
    a->tokens = 640, a->d_model = 512, a->d_ff = 2048, a->act = CLFFN_ACT_RELU, a->reps = 20;
    for (int i = 1; i < argc; ++i) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t n;
        if (!strcmp(o, "--tokens") || !strcmp(o, "--d-model") || !strcmp(o, "--d-ff") ||
            !strcmp(o, "--reps")) {
            if (tool_parse_size(v, 1, (size_t)1 << 40, &n) != 0) {
                fprintf(stderr, "clffn-bench: %s needs a positive integer\n", o);
                return -1;
            }
            ++i;
            if (!strcmp(o, "--tokens")) {
                a->tokens = n;
            } else if (!strcmp(o, "--d-model")) {
                a->d_model = n;
            } else if (!strcmp(o, "--d-ff")) {
                a->d_ff = n;
            } else {
                a->reps = n > 100000 ? 100000 : (int)n;
            }
        } else if (!strcmp(o, "--activation")) {
            int g = 0;
            if (!v || clffn_activation_parse(v, &a->act, &g) != CLFFN_SUCCESS) {
                fprintf(stderr, "clffn-bench: unknown activation '%s'\n", v ? v : "");
                return -1;
            }
            a->gated |= g;
            ++i;
        } else if (!strcmp(o, "--device")) {
            if (!v) {
                fprintf(stderr, "clffn-bench: --device needs a value\n");
                return -1;
            }
            a->device = v;
            ++i;
        } else if (!strcmp(o, "--k-block")) {
            size_t kb;
            if (tool_parse_size(v, 0, CLFFN_MAX_GEMM_K_BLOCK, &kb) != 0) {
                fprintf(stderr, "clffn-bench: --k-block needs an integer 0 ... %zu\n",
                        CLFFN_MAX_GEMM_K_BLOCK);
                return -1;
            }
            a->set_k_block = 1, a->k_block = kb;
            ++i;
        } else if (!strcmp(o, "--gemv-max")) {
            size_t g;
            if (tool_parse_size(v, 0, CLFFN_MAX_GEMV_TOKENS, &g) != 0) {
                fprintf(stderr, "clffn-bench: --gemv-max needs an integer 0 ... %zu\n",
                        CLFFN_MAX_GEMV_TOKENS);
                return -1;
            }
            a->set_gemv_max = 1, a->gemv_max = g;
            ++i;
        } else if (!strcmp(o, "--weight-layout")) {
            if (!v || (strcmp(v, "out_in") && strcmp(v, "in_out"))) {
                fprintf(stderr, "clffn-bench: --weight-layout takes out_in or in_out\n");
                return -1;
            }
            a->set_layout = 1;
            a->layout = strcmp(v, "in_out") ? CLFFN_LAYOUT_OUT_IN : CLFFN_LAYOUT_IN_OUT;
            ++i;
        } else if (!strcmp(o, "--gated")) {
            a->gated = 1;
        } else if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--compare-cpu")) {
            a->compare_cpu = 1;
        } else if (!strcmp(o, "--sweep")) {
            a->sweep = 1;
        } else if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            exit(0);
        } else {
            fprintf(stderr, "clffn-bench: unknown argument '%s'\n", o);
            return -1;
        }
    }
#ifndef CLFFN_HAVE_CBLAS
    if (a->compare_cpu) {
        fprintf(stderr,
                "clffn-bench: --compare-cpu needs a CBLAS, and none was found at build time\n");
        return -1;
    }
#endif
    return 0;
}

static int sweep(const args *a) {
    enum { MAX_T = 8192 };
    device_run r;
    if (device_setup(&r, a, MAX_T, NULL) != 0) {
        device_teardown(&r);
        return 1;
    }
    double copy = 0;
    if (copy_bandwidth(&r, &copy) != 0) {
        device_teardown(&r);
        return 1;
    }
#ifdef CLFFN_HAVE_CBLAS
    cpu_run c = {0};
    if (a->compare_cpu && cpu_setup(&c, a, MAX_T) != 0) { return 1; }
    printf("tokens,clffn_gflops,clffn_weights_gbps,copy_gbps%s\n",
           a->compare_cpu ? ",cpu_blas_gflops,cpu_blas_weights_gbps" : "");
#else
    printf("tokens,clffn_gflops,clffn_weights_gbps,copy_gbps\n");
#endif
    int rc = 0;
    for (size_t T = 1; T <= MAX_T && rc == 0; T *= 2) {
        timing t;
        const int reps = T >= 2048 ? (a->reps < 5 ? a->reps : 5) : a->reps;
        if ((rc = device_time(&r, T, reps, &t, NULL)) != 0) { break; }
        printf("%zu,%.4g,%.4g,%.4g", T, flops_of(a, T) / t.best_s * 1e-9,
               weight_bytes(a) / t.best_s * 1e-9, copy);
#ifdef CLFFN_HAVE_CBLAS
        if (a->compare_cpu) {
            const timing ct = cpu_time(&c, a, T, reps);
            printf(",%.4g,%.4g", flops_of(a, T) / ct.best_s * 1e-9,
                   weight_bytes(a) / ct.best_s * 1e-9);
        }
#endif
        printf("\n");
        fflush(stdout);
    }
#ifdef CLFFN_HAVE_CBLAS
    if (a->compare_cpu) { cpu_teardown(&c); }
#endif
    device_teardown(&r);
    return rc;
}

static int tool_main(int argc, char **argv) {
    process_start = tool_now_s();
    args a;
    if (parse_args(argc, argv, &a) != 0) {
        usage(stderr);
        return 2;
    }
    if (a.sweep) { return sweep(&a); }

    device_run r;
    startup_times su;
    const double before_main = seconds_since_exec() - (tool_now_s() - process_start);
    if (device_setup(&r, &a, a.tokens, &su) != 0) {
        device_teardown(&r);
        return 1;
    }
    const double first_start = tool_now_s();
    if (device_forward(&r, a.tokens, NULL) != 0) {
        device_teardown(&r);
        return 1;
    }
    su.first = tool_now_s() - first_start;
    su.before_main = before_main >= 0 ? before_main : -1;
    const double startup = tool_now_s() - process_start + (su.before_main > 0 ? su.before_main : 0);
    timing t = {0.0, 0.0}; /* device_time fills it; -O3 cannot see that it always does */
    clffn_stage_times s;
    if (device_time(&r, a.tokens, a.reps, &t, &s) != 0) {
        device_teardown(&r);
        return 1;
    }
    timing bt = {0.0, 0.0};
    double copy = 0;
    if (backward_time(&r, a.tokens, a.reps, &bt) != 0 || copy_bandwidth(&r, &copy) != 0) {
        device_teardown(&r);
        return 1;
    }
    const double wgbps = weight_bytes(&a) / t.best_s * 1e-9;
    char name[256] = "?";
    clffn_context_device_name(r.ctx, name, sizeof name);
    const double fl = flops_of(&a, a.tokens), n = (double)a.reps;
    s.gemm1_s /= n, s.gemm2_s /= n, s.epilogue1_s /= n, s.epilogue2_s /= n, s.total_s /= n;
    const size_t T = a.tokens, D = a.d_model, F = a.d_ff, N1 = a.gated ? 2 * F : F;
    const double epi_bytes = 4.0 * (double)T * ((double)N1 + (double)F + 2.0 * (double)D);
    const double epi_s = s.epilogue1_s + s.epilogue2_s;
    const double outside = s.total_s > 0 ? (s.total_s - s.gemm1_s - s.gemm2_s) / s.total_s : 0.0;

    double cpu_best = 0, cpu_median = 0;
#ifdef CLFFN_HAVE_CBLAS
    if (a.compare_cpu) {
        cpu_run c = {0};
        if (cpu_setup(&c, &a, a.tokens) != 0) {
            device_teardown(&r);
            return 1;
        }
        const timing ct = cpu_time(&c, &a, a.tokens, a.reps);
        cpu_best = ct.best_s, cpu_median = ct.median_s;
        cpu_teardown(&c);
    }
#endif
    if (a.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "device", name);
        cJSON_AddNumberToObject(o, "tokens", (double)T);
        cJSON_AddNumberToObject(o, "d_model", (double)D);
        cJSON_AddNumberToObject(o, "d_ff", (double)F);
        cJSON_AddStringToObject(o, "activation", clffn_activation_name(a.act));
        cJSON_AddBoolToObject(o, "gated", a.gated);
        cJSON_AddNumberToObject(o, "reps", a.reps);
        cJSON_AddStringToObject(o, "tuning", clffn_context_tuning(r.ctx));
        cJSON_AddNumberToObject(o, "gemm_k_block", (double)clffn_context_gemm_k_block(r.ctx));
        cJSON_AddNumberToObject(o, "gemv_max_tokens", (double)clffn_context_gemv_max_tokens(r.ctx));
        cJSON_AddNumberToObject(o, "xgemm_few_rows", (double)clffn_context_xgemm_few_rows(r.ctx));
        cJSON_AddStringToObject(o, "weight_layout",
                                layout_name(clffn_context_weight_layout(r.ctx)));
        cJSON_AddNumberToObject(o, "weights_gbps", wgbps);
        cJSON_AddNumberToObject(o, "copy_gbps", copy);
        cJSON_AddNumberToObject(o, "best_s", t.best_s);
        cJSON_AddNumberToObject(o, "median_s", t.median_s);
        cJSON_AddNumberToObject(o, "gflops", fl / t.best_s * 1e-9);
        cJSON_AddNumberToObject(o, "startup_s", startup);
        cJSON *b = cJSON_AddObjectToObject(o, "startup");
        if (su.before_main >= 0) { cJSON_AddNumberToObject(b, "before_main_s", su.before_main); }
        cJSON_AddNumberToObject(b, "platforms_s", su.platforms);
        cJSON_AddNumberToObject(b, "context_s", su.context);
        cJSON_AddNumberToObject(b, "ffn_create_s", su.ffn);
        cJSON_AddNumberToObject(b, "weights_s", su.weights);
        cJSON_AddNumberToObject(b, "first_forward_s", su.first);
        cJSON_AddNumberToObject(o, "backward_best_s", bt.best_s);
        cJSON_AddNumberToObject(o, "backward_median_s", bt.median_s);
        cJSON_AddNumberToObject(o, "backward_over_forward", bt.best_s / t.best_s);
        cJSON *st = cJSON_AddObjectToObject(o, "stages");
        cJSON_AddNumberToObject(st, "gemm1_s", s.gemm1_s);
        cJSON_AddNumberToObject(st, "epilogue1_s", s.epilogue1_s);
        cJSON_AddNumberToObject(st, "gemm2_s", s.gemm2_s);
        cJSON_AddNumberToObject(st, "epilogue2_s", s.epilogue2_s);
        cJSON_AddNumberToObject(st, "total_s", s.total_s);
        cJSON_AddNumberToObject(o, "outside_gemm_share", outside);
        cJSON_AddNumberToObject(o, "epilogue_gbps", epi_s > 0 ? epi_bytes / epi_s * 1e-9 : 0.0);
        if (a.compare_cpu) {
            cJSON *c = cJSON_AddObjectToObject(o, "cpu_blas");
            cJSON_AddNumberToObject(c, "best_s", cpu_best);
            cJSON_AddNumberToObject(c, "median_s", cpu_median);
            cJSON_AddNumberToObject(c, "gflops", fl / cpu_best * 1e-9);
            cJSON_AddNumberToObject(o, "ratio_vs_cpu_blas", cpu_best / t.best_s);
        }
        char *text = cJSON_Print(o);
        puts(text);
        free(text);
        cJSON_Delete(o);
    } else {
        printf("device:        %s\n", name);
        printf("FFN:           %zu tokens, %zu -> %zu, %s%s\n", T, D, F,
               clffn_activation_name(a.act), a.gated ? ", gated" : "");
        printf("GEMM K-block:  %zu, from %zu token rows (%s)\n", clffn_context_gemm_k_block(r.ctx),
               clffn_context_gemm_k_block_min_rows(r.ctx),
               a.set_k_block ? "--k-block" : clffn_context_tuning(r.ctx));
        printf("GEMVs up to:   %zu tokens (%s)\n", clffn_context_gemv_max_tokens(r.ctx),
               a.set_gemv_max ? "--gemv-max" : clffn_context_tuning(r.ctx));
        if (clffn_context_xgemm_few_rows(r.ctx)) {
            printf("Xgemm sets:    a few-tokens one below %zu tokens (%s)\n",
                   clffn_context_xgemm_few_rows(r.ctx), clffn_context_tuning(r.ctx));
        }
        printf("weights kept:  %s (%s)\n", layout_name(clffn_context_weight_layout(r.ctx)),
               a.set_layout ? "--weight-layout" : clffn_context_tuning(r.ctx));
        printf("forward:       best %.3f ms, median %.3f ms over %d reps: %.1f GFLOP/s\n",
               t.best_s * 1e3, t.median_s * 1e3, a.reps, fl / t.best_s * 1e-9);
        printf("weights read:  %.1f GB/s over the forward; device copy bandwidth %.1f GB/s\n",
               wgbps, copy);
        printf("stages (mean): GEMM 1 %.3f ms | epilogue 1 %.3f ms | GEMM 2 %.3f ms | epilogue 2 "
               "%.3f ms\n",
               s.gemm1_s * 1e3, s.epilogue1_s * 1e3, s.gemm2_s * 1e3, s.epilogue2_s * 1e3);
        printf("outside GEMMs: %.1f%% of device time; epilogues at %.1f GB/s\n", 100.0 * outside,
               epi_s > 0 ? epi_bytes / epi_s * 1e-9 : 0.0);
        printf("backward:      best %.3f ms, median %.3f ms: %.2fx the forward\n", bt.best_s * 1e3,
               bt.median_s * 1e3, bt.best_s / t.best_s);
        printf("startup:       %.3f s from process start to the first result\n", startup);
        printf("               ");
        if (su.before_main >= 0) { printf("loading %.3f | ", su.before_main); }
        printf("platforms %.3f | context %.3f | FFN (kernel build) %.3f | weights %.3f | first "
               "forward %.3f s\n",
               su.platforms, su.context, su.ffn, su.weights, su.first);
        if (a.compare_cpu) {
            printf(
                "CPU BLAS FFN:  best %.3f ms, median %.3f ms: %.1f GFLOP/s; clffn / CPU = %.2fx\n",
                cpu_best * 1e3, cpu_median * 1e3, fl / cpu_best * 1e-9, cpu_best / t.best_s);
        }
    }
    device_teardown(&r);
    return 0;
}

int main(int argc, char **argv) { return tool_exit("clffn-bench", tool_main(argc, argv)); }
