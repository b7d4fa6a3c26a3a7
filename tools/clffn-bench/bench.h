/* clffn-bench's rooms: main.c (the command line, one shape or the sweep), device.c (the FFN on
 * the device, timed, and the device's copy bandwidth), cpu.c (the same FFN through the host's
 * CBLAS, built when CMake found OpenBLAS), report.c (one shape's results as text or JSON) and
 * moe.c (--experts: a mixture-of-experts layer of the FFN). */
#ifndef CLFFN_BENCH_H
#define CLFFN_BENCH_H

#define CLFFN_HOOKS /* clffn_context_xgemm_few_rows: what the run used */
#include "clffn.h"

#include <stddef.h>
#include <stdint.h>

typedef struct args {
    size_t tokens, d_model, d_ff;
    clffn_activation act;
    int gated, reps, json, compare_cpu, sweep;
    int no_bias; /* --bias off: no b1, b2 (nor bv), as LLaMA's, Mixtral's and Qwen's FFNs */
    const char *device;
    int set_k_block; /* --k-block given */
    size_t k_block;
    int set_gemv_max; /* --gemv-max given */
    size_t gemv_max;
    int set_kernel_max; /* --kernel-max given */
    size_t kernel_max;
    int quantized_inputs; /* --quantized-inputs */
    int unfused;          /* --fused-epilogues off */
    int dequant_tiles;    /* --dequant-tiles: 1 on, 0 off, -1 the device's default */
    int set_row_group;    /* --row-group-cols given */
    size_t row_group;
    int set_layout; /* --weight-layout given */
    clffn_layout layout;
    clffn_dtype dtype; /* --weights-dtype: the type the weights are kept in */
    int all_dtypes;    /* --weights-dtype all (the sweep, each type in turn) */
    int cpu_only;      /* --cpu-only: the CPU FFN alone, in a child (cpu.c) */
    size_t experts;    /* --experts: a mixture-of-experts layer of this many (moe.c); 0: none */
    size_t top_k;      /* --top-k: experts per token (default 2) */
    size_t split;      /* --expert-split: contexts the layer's experts are split over (0, 1: one) */
    clffn_moe_counts counts; /* --moe-counts: where the layer keeps its expert counts */
    int set_counts;          /* --moe-counts given */
    int ungrouped;           /* --moe-grouping off (clffn_moe_set_grouping) */
    int set_grouping;        /* --moe-grouping given */
} args;

typedef struct timing {
    double best_s, median_s;
} timing;

/* Best and median of n times (sorted in place). */
timing bench_summarize(double *t, int n);
/* The FFN's FLOPs at tokens, and the bytes of W1 (and V) and W2 in f32: what the CPU's BLAS
 * reads at least once per forward (the device's: clffn_ffn_weight_bytes). */
double bench_flops(const args *a, size_t tokens);
double bench_weight_bytes(const args *a);
const char *bench_layout_name(clffn_layout l);
/* Prints "clffn-bench: what: status"; returns 1. */
int bench_fail(const char *what, clffn_status st);

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

/* Why a device gets no stage times: clffn_ffn_stage_times' CLFFN_ERROR_PROFILING_TIMES, or
 * spans far short of the forward's wall-clock time (tool_device_span_short) */
#define BENCH_STAGES_DISORDERED "the device's profiling timestamps are out of order"
#define BENCH_STAGES_SHORT \
    "the device's profiling timestamps do not account for the forward's wall-clock time"

/* device.c: the FFN on the device, with buffers for up to cap tokens */
typedef struct device_run {
    clffn_context *ctx;
    clffn_ffn *ffn;
    cl_mem x, y, dy, dx, g[5]; /* g: dW1 (stacked with dV), db1, dbv, dW2, db2 */
    size_t cap;
    const char *no_stages; /* why the device's profiling timestamps give no stage times, or NULL */
} device_run;

/* The FFN the options describe: d_model, d_ff, activation, gating and biases (the dense FFN's
 * and each --experts expert's). */
clffn_config bench_ffn_config(const args *a);
/* The FFN's weights, nn.Linear's initialisation from seed, uploaded as f32 or converted on the
 * host to --weights-dtype (GGUF's rounding for the quantized ones) and kept in it. */
clffn_status bench_upload_weights(clffn_ffn *ffn, const args *a, const clffn_config *c,
                                  uint64_t seed);
/* Seconds from this process's exec to now; -1 off Linux. */
double bench_seconds_since_exec(void);
/* Opens the device and makes the FFN and the buffers for up to max_tokens; st, when not NULL,
 * gets the time each step took. 0, or 1 with the failure printed (teardown still needed). */
int device_setup(device_run *r, const args *a, size_t max_tokens, startup_times *st);
void device_teardown(device_run *r);
/* One forward of tokens, finished; stages (may be NULL) gets its stage times. 0 or 1. */
int device_forward(device_run *r, size_t tokens, clffn_stage_times *stages);
/* reps timed forwards after two warm-ups; stage times summed over the reps (sum may be NULL). */
int device_time(device_run *r, size_t tokens, int reps, timing *t, clffn_stage_times *sum);
/* reps timed backwards, each after an untimed forward of the same tokens. */
int backward_time(device_run *r, size_t tokens, int reps, timing *t);
/* The device's copy bandwidth: a float4 copy kernel over 2 × 128 MiB (or a quarter of the
 * largest allocation, if less), best of 5 after a warm-up, in GB/s of bytes read + written. */
int copy_bandwidth(device_run *r, double *gbps);

/* cpu.c: the same FFN through the host's CBLAS (OpenBLAS), with buffers for up to max_tokens */
typedef struct cpu_run {
    float *x, *w1, *b1, *w2, *b2, *z, *h, *y;
} cpu_run;
int cpu_setup(cpu_run *r, const args *a, size_t max_tokens);
/* reps timed forwards after two warm-ups: 0, or 1 with the failure printed */
int cpu_time(cpu_run *r, const args *a, size_t T, int reps, timing *out);
void cpu_teardown(cpu_run *r);
/* OpenBLAS's core as detected (openblas_get_corename), and the best one the CPU's flags allow
 * (NULL if none is known). */
const char *cpu_core_detected(void);
const char *cpu_core_allowed(void);
/* The CPU FFN with the detected core and, where the flags allow a better one, with that one
 * (in a child with OPENBLAS_CORETYPE): best is the faster, core its name; forced_core is ""
 * when no other core ran. 0, or 1 with the failure printed. */
typedef struct cpu_timing {
    timing best, detected, forced;
    char core[32], detected_core[32], forced_core[32];
} cpu_timing;
int cpu_fair_time(cpu_run *r, const args *a, size_t T, int reps, cpu_timing *out);
/* reps timed forwards in a child whose OpenBLAS runs core: 0, or -1. */
int cpu_time_core(const args *a, const char *core, size_t T, int reps, timing *out);
/* --cpu-only: each count's best and median seconds and the core, a line each. 0 or 1. */
int cpu_only(const args *a, const size_t *counts, int n);

/* report.c: one shape's results */
typedef struct bench_result {
    timing fwd, bwd;
    clffn_stage_times stages; /* means over the reps */
    startup_times startup;
    double startup_s; /* process start to the first result */
    double copy_gbps;
    int have_cpu;
    cpu_timing cpu;
} bench_result;
void bench_report_json(const args *a, device_run *r, const bench_result *res);

/* device.c: a context on --device with the options' settings (K-block, crossovers, layout); 0
 * or 1 (printed). */
int bench_open_context(const args *a, clffn_context **ctx);

/* moe.c: --experts: the layer timed beside the dense FFN, reported. 0 or 1 (printed). */
int bench_moe(const args *a);
void bench_report_text(const args *a, device_run *r, const bench_result *res);

#endif
