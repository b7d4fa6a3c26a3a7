/* clffn-bench: the FFN on the device (clffn's device-level API on buffers of its own), timed by
 * the wall clock around each call and its completion (tool_finish), with the stages from OpenCL
 * profiling events, and the device's copy bandwidth, the limit of a few tokens. */
#include "bench.h"
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Seconds from this process's exec to now, from /proc/self/stat's start time (clock ticks since
 * boot) and CLOCK_BOOTTIME; -1 off Linux. */
double bench_seconds_since_exec(void) {
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

/* x, y, dy, dx for max_tokens and the gradients (after the weights' upload), x and dy filled (an
 * untouched POCL buffer reads the kernel's shared zero page, which is faster than memory). 0, or
 * 1 with the failure printed. */
static int device_buffers(device_run *r, const args *a, size_t max_tokens) {
    const cl_context cx = clffn_context_cl_context(r->ctx);
    const size_t bytes = max_tokens * a->d_model * sizeof(float);
    cl_int err = CL_SUCCESS;
    cl_mem *const io[4] = {&r->x, &r->y, &r->dy, &r->dx};
    for (int i = 0; i < 4 && err == CL_SUCCESS; ++i) {
        *io[i] = clCreateBuffer(cx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    }
    /* weights kept compressed get no gradients (backward_time): their f32 buffers would take
     * up to eight times the weights' own memory */
    const int weights = clffn_ffn_weight_dtype(r->ffn) == CLFFN_DTYPE_F32;
    const size_t D = a->d_model, F = a->d_ff;
    const size_t b = a->no_bias ? 0 : 1; /* no biases, no gradients of theirs */
    const size_t gsz[5] = {weights ? (a->gated ? 2 : 1) * D * F : 0, b * F, b * F,
                           weights ? D * F : 0, b * D};
    for (int i = 0; i < 5 && err == CL_SUCCESS; ++i) {
        if (!gsz[i]) { continue; }
        r->g[i] = clCreateBuffer(cx, CL_MEM_READ_WRITE, gsz[i] * sizeof(float), NULL, &err);
    }
    if (err != CL_SUCCESS) { return bench_fail("allocating the buffers", (clffn_status)err); }
    float *host = malloc(bytes);
    if (!host) { return bench_fail("allocating x", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
    for (size_t i = 0; i < max_tokens * a->d_model; ++i) { host[i] = (float)sin(0.01 * (double)i); }
    err = clEnqueueWriteBuffer(clffn_context_queue(r->ctx), r->x, CL_TRUE, 0, bytes, host, 0, NULL,
                               NULL);
    if (err == CL_SUCCESS) {
        err = clEnqueueWriteBuffer(clffn_context_queue(r->ctx), r->dy, CL_TRUE, 0, bytes, host, 0,
                                   NULL, NULL);
    }
    free(host);
    if (err != CL_SUCCESS) { return bench_fail("uploading x", (clffn_status)err); }
    return 0;
}

clffn_config bench_ffn_config(const args *a) {
    clffn_config c = clffn_config_default(a->d_model, a->d_ff);
    c.activation = a->act;
    c.gated = a->gated;
    c.bias1 = c.bias2 = c.bias_gate = !a->no_bias;
    return c;
}

clffn_status bench_upload_weights(clffn_ffn *ffn, const args *a, const clffn_config *c,
                                  uint64_t seed) {
    if (a->dtype == CLFFN_DTYPE_F32) {
        return clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, seed);
    }
    const size_t D = c->d_model, F = c->d_ff, n = D * F;
    size_t bytes;
    clffn_status st = clffn_dtype_bytes(a->dtype, n, &bytes);
    if (st != CLFFN_SUCCESS) { return st; }
    float *f = malloc((3 * n + 3 * F + D) * sizeof *f);
    unsigned char *q = malloc(3 * bytes);
    const clffn_weight_arrays w = {f,         f + 3 * n,        f + n, f + 3 * n + F,
                                   f + 2 * n, f + 3 * n + 2 * F};
    st = f && q ? clffn_init_weights_host(c, CLFFN_INIT_TORCH_LINEAR, seed, CLFFN_LAYOUT_OUT_IN, &w)
                : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    const float *const m[3] = {w.w1, w.v, w.w2};
    for (int i = 0; i < 3 && st == CLFFN_SUCCESS; ++i) { /* a plain FFN has no V, unwritten */
        if (m[i] != w.v || c->gated) {
            st = clffn_convert_weights(a->dtype, m[i], n, q + i * bytes, bytes);
        }
    }
    const clffn_typed_weights tw = {a->dtype,
                                    q,
                                    c->gated ? q + bytes : NULL,
                                    q + 2 * bytes,
                                    c->bias1 ? w.b1 : NULL,
                                    c->bias_gate && c->gated ? w.bv : NULL,
                                    c->bias2 ? w.b2 : NULL};
    if (st == CLFFN_SUCCESS) { st = clffn_ffn_upload_weights_typed(ffn, CLFFN_LAYOUT_OUT_IN, &tw); }
    if (st != CLFFN_SUCCESS && *clffn_ffn_error_message(ffn)) {
        fprintf(stderr, "clffn-bench: %s\n", clffn_ffn_error_message(ffn));
    }
    free(f);
    free(q);
    return st;
}

int bench_open_context(const args *a, clffn_context **ctx) {
    clffn_status st = clffn_context_create_for_device(a->device, ctx);
    if (st != CLFFN_SUCCESS) { return bench_fail("opening the device", st); }
    /* --k-block applies to every product, whatever the profile's row threshold */
    if (a->set_k_block &&
        ((st = clffn_context_set_gemm_k_block(*ctx, a->k_block)) != CLFFN_SUCCESS ||
         (st = clffn_context_set_gemm_k_block_min_rows(*ctx, 0)) != CLFFN_SUCCESS)) {
        return bench_fail("--k-block", st);
    }
    if (a->set_gemv_max &&
        (st = clffn_context_set_gemv_max_tokens(*ctx, a->gemv_max)) != CLFFN_SUCCESS) {
        return bench_fail("--gemv-max", st);
    }
    const int compressed = a->dtype != CLFFN_DTYPE_F32;
    if (a->set_kernel_max &&
        ((st = clffn_context_set_kernel_max_tokens(*ctx, compressed, a->kernel_max)) !=
             CLFFN_SUCCESS ||
         (compressed && (st = clffn_context_set_kernel_max_tokens(
                             *ctx, CLFFN_KERNELS_QUANTIZED, a->kernel_max)) != CLFFN_SUCCESS))) {
        return bench_fail("--kernel-max", st);
    }
    if (a->quantized_inputs &&
        (st = clffn_context_set_quantized_inputs(*ctx, 1)) != CLFFN_SUCCESS) {
        return bench_fail("--quantized-inputs", st);
    }
    if (a->unfused && (st = clffn_context_set_fused_epilogues(*ctx, 0)) != CLFFN_SUCCESS) {
        return bench_fail("--fused-epilogues", st);
    }
    if (a->dequant_tiles >= 0 &&
        (st = clffn_context_set_dequant_tiles(*ctx, a->dequant_tiles)) != CLFFN_SUCCESS) {
        return bench_fail("--dequant-tiles", st);
    }
    if (a->set_row_group &&
        (st = clffn_context_set_row_group_cols(*ctx, a->row_group)) != CLFFN_SUCCESS) {
        return bench_fail("--row-group-cols", st);
    }
    if (a->set_layout && (st = clffn_context_set_weight_layout(*ctx, a->layout)) != CLFFN_SUCCESS) {
        return bench_fail("--weight-layout", st);
    }
    return 0;
}

/* Opens the device and makes the FFN and the buffers for up to max_tokens; st, when not NULL,
 * gets the time each step took. */
int device_setup(device_run *r, const args *a, size_t max_tokens, startup_times *st_out) {
    memset(r, 0, sizeof *r);
    startup_times tm = {0};
    clffn_config c = bench_ffn_config(a);
    double t0 = tool_now_s();
    cl_uint n_platforms = 0;
    clGetPlatformIDs(0, NULL, &n_platforms); /* timed alone; its result is the context's concern */
    tm.platforms = tool_now_s() - t0;
    t0 = tool_now_s();
    const int rc = bench_open_context(a, &r->ctx);
    tm.context = tool_now_s() - t0;
    if (rc != 0) { return rc; }
    clffn_status st;
    t0 = tool_now_s();
    if ((st = clffn_ffn_create(r->ctx, &c, &r->ffn)) != CLFFN_SUCCESS) {
        return bench_fail("creating the FFN", st);
    }
    tm.ffn = tool_now_s() - t0;
    t0 = tool_now_s();
    if ((st = bench_upload_weights(r->ffn, a, &c, 1)) != CLFFN_SUCCESS ||
        (st = clffn_ffn_set_profiling(r->ffn, 1)) != CLFFN_SUCCESS) {
        return bench_fail("setting the weights", st);
    }
    tm.weights = tool_now_s() - t0;
    if (st_out) { *st_out = tm; }
    if (device_buffers(r, a, max_tokens) != 0) { return 1; }
    r->cap = max_tokens;
    return 0;
}

void device_teardown(device_run *r) {
    cl_mem all[] = {r->x, r->y, r->dy, r->dx, r->g[0], r->g[1], r->g[2], r->g[3], r->g[4]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) {
        if (all[i]) { clReleaseMemObject(all[i]); }
    }
    clffn_ffn_destroy(r->ffn);
    clffn_context_destroy(r->ctx);
}

int device_forward(device_run *r, size_t tokens, clffn_stage_times *stages) {
    cl_command_queue q = clffn_context_queue(r->ctx);
    clffn_status st = clffn_forward(r->ffn, tokens, r->x, 0, r->y, 0, q, NULL);
    if (st == CLFFN_SUCCESS) { st = (clffn_status)tool_finish(q); }
    if (st == CLFFN_SUCCESS && stages) { st = clffn_ffn_stage_times(r->ffn, stages); }
    if (st != CLFFN_SUCCESS) { return bench_fail("forward", st); }
    return 0;
}

/* reps timed backwards (each after an untimed forward of the same tokens) */
int backward_time(device_run *r, size_t tokens, int reps, timing *t) {
    double *ts = malloc((size_t)reps * sizeof *ts);
    if (!ts) { return bench_fail("timing", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
    cl_command_queue q = clffn_context_queue(r->ctx);
    /* weights kept compressed have no gradients of their own: dx and the biases' only */
    const int weights = clffn_ffn_weight_dtype(r->ffn) == CLFFN_DTYPE_F32;
    const clffn_device_weights g = {
        {weights ? r->g[0] : NULL, 0}, {r->g[1], 0}, {NULL, 0}, {r->g[2], 0},
        {weights ? r->g[3] : NULL, 0}, {r->g[4], 0}};
    for (int i = -2; i < reps; ++i) { /* two warm-ups */
        if (device_forward(r, tokens, NULL) != 0) {
            free(ts);
            return 1;
        }
        const double t0 = tool_now_s();
        clffn_status st =
            clffn_backward(r->ffn, tokens, r->x, 0, r->dy, 0, r->dx, 0, &g, 0, q, NULL);
        if (st == CLFFN_SUCCESS) { st = (clffn_status)tool_finish(q); }
        if (st != CLFFN_SUCCESS) {
            free(ts);
            return bench_fail("backward", st);
        }
        if (i >= 0) { ts[i] = tool_now_s() - t0; }
    }
    *t = bench_summarize(ts, reps);
    free(ts);
    return 0;
}

/* reps timed forwards after two warm-ups; stage times summed over the reps */
int device_time(device_run *r, size_t tokens, int reps, timing *t, clffn_stage_times *sum) {
    double *ts = malloc((size_t)reps * sizeof *ts);
    if (!ts) { return bench_fail("timing", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
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
        if (sum && !r->no_stages) {
            const clffn_status st = clffn_ffn_stage_times(r->ffn, &s);
            if (st == CLFFN_ERROR_PROFILING_TIMES) { /* the wall-clock times still stand */
                r->no_stages = BENCH_STAGES_DISORDERED;
                memset(sum, 0, sizeof *sum);
                continue;
            }
            if (st != CLFFN_SUCCESS) {
                free(ts);
                return bench_fail("reading the stage times", st);
            }
            sum->gemm1_s += s.gemm1_s, sum->epilogue1_s += s.epilogue1_s;
            sum->gemm2_s += s.gemm2_s, sum->epilogue2_s += s.epilogue2_s, sum->total_s += s.total_s;
        }
    }
    *t = bench_summarize(ts, reps);
    free(ts);
    /* timestamps in order that still do not add up to the forward (the median, so that one
     * rep the host was late for decides nothing) are not times either */
    if (sum && !r->no_stages && tool_device_span_short(sum->total_s / reps, t->median_s)) {
        r->no_stages = BENCH_STAGES_SHORT;
        memset(sum, 0, sizeof *sum);
    }
    return 0;
}

static const char *COPY_SRC =
    "__kernel void copy4(__global const float4 *a, __global float4 *b) {\n"
    "  const size_t i = get_global_id(0);\n"
    "  b[i] = a[i];\n"
    "}\n";

int copy_bandwidth(device_run *r, double *gbps) {
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
        if (err == CL_SUCCESS) { err = tool_finish(q); }
        const double t = tool_now_s() - t0;
        if (i > 0 && t < best) { best = t; }
    }
    if (a) { clReleaseMemObject(a); }
    if (b) { clReleaseMemObject(b); }
    if (k) { clReleaseKernel(k); }
    if (p) { clReleaseProgram(p); }
    if (err != CL_SUCCESS) { return bench_fail("measuring the copy bandwidth", (clffn_status)err); }
    *gbps = 2.0 * (double)bytes / best * 1e-9;
    return 0;
}
