/* clffn-bench --compare-cpu: the same FFN through the host's CBLAS (OpenBLAS), in the same
 * process: SGEMM with W1 and V stacked ([out, in] as nn.Linear), the epilogue as a plain loop,
 * SGEMM, + b2. Built when CMake found OpenBLAS.
 *
 * OpenBLAS picks its kernels from the CPU's model once, at load, and falls back to old ones
 * (Prescott, SSE3) on a virtual CPU whose model it does not know, however wide its vectors. So
 * the comparison also runs the FFN in a child of this program with OPENBLAS_CORETYPE set to the
 * best core the CPU's flags allow, where that differs from the detected one, and keeps the
 * faster of the two per shape: a peer handicapped by its detection is no measure. */
#include "bench.h"
#include "common.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

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

int cpu_setup(cpu_run *r, const args *a, size_t max_tokens) {
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
    const float b = a->no_bias ? 0.0f : 0.01f; /* b1 zero with --bias off: the epilogue's add */
    for (size_t i = 0; i < N1; ++i) { r->b1[i] = b; }
    for (size_t i = 0; i < D; ++i) { r->b2[i] = b; }
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
    for (size_t t = 0; t < T && !a->no_bias; ++t) {
        for (size_t i = 0; i < D; ++i) { r->y[t * D + i] += r->b2[i]; }
    }
}

int cpu_time(cpu_run *r, const args *a, size_t T, int reps, timing *out) {
    double *ts = malloc((size_t)reps * sizeof *ts);
    if (!ts) { return bench_fail("timing", CLFFN_ERROR_OUT_OF_HOST_MEMORY); }
    cpu_forward(r, a, T);
    cpu_forward(r, a, T);
    for (int i = 0; i < reps; ++i) {
        const double t0 = tool_now_s();
        cpu_forward(r, a, T);
        ts[i] = tool_now_s() - t0;
    }
    *out = bench_summarize(ts, reps);
    free(ts);
    return 0;
}

void cpu_teardown(cpu_run *r) {
    free(r->x), free(r->w1), free(r->b1), free(r->w2), free(r->b2), free(r->z), free(r->h),
        free(r->y);
}

const char *cpu_core_detected(void) {
    const char *n = openblas_get_corename();
    return n ? n : "?";
}

/* The most capable of OpenBLAS's x86-64 cores whose instructions the CPU has, from
 * /proc/cpuinfo's flags: NULL where none is known (another architecture, no /proc). */
const char *cpu_core_allowed(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) { return NULL; }
    char line[8192];
    const char *core = NULL;
    while (!core && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5)) { continue; }
        char padded[8200];
        snprintf(padded, sizeof padded, " %s ", strchr(line, ':') ? strchr(line, ':') + 1 : "");
        for (char *p = padded; *p; ++p) {
            if (*p == '\n' || *p == '\t') { *p = ' '; }
        }
#define HAS(flag) (strstr(padded, " " flag " ") != NULL)
        if (HAS("avx512f") && HAS("avx512bw") && HAS("avx512vl") && HAS("avx512dq")) {
            core = HAS("avx512_bf16") ? "Cooperlake" : "SkylakeX";
        } else if (HAS("avx2") && HAS("fma")) {
            core = "Haswell";
        } else {
            core = "Prescott";
        }
#undef HAS
    }
    fclose(f);
    return core;
}

/* The child's side (--cpu-only): the CPU FFN alone at each count, one line each: best and
 * median seconds and the core OpenBLAS runs. */
int cpu_only(const args *a, const size_t *counts, int n) {
    cpu_run c = {0};
    size_t max = 0;
    for (int i = 0; i < n; ++i) { max = counts[i] > max ? counts[i] : max; }
    int rc = cpu_setup(&c, a, max);
    for (int i = 0; i < n && rc == 0; ++i) {
        timing t;
        const int reps = counts[i] >= 2048 && a->reps > 5 ? 5 : a->reps;
        if ((rc = cpu_time(&c, a, counts[i], reps, &t)) == 0) {
            printf("%.9g %.9g %s\n", t.best_s, t.median_s, cpu_core_detected());
        }
    }
    fflush(stdout);
    cpu_teardown(&c);
    return rc;
}

int cpu_time_core(const args *a, const char *core, size_t T, int reps, timing *out) {
    char tokens[32], dm[32], df[32], rp[32], env[64], line[256] = "";
    snprintf(tokens, sizeof tokens, "%zu", T);
    snprintf(dm, sizeof dm, "%zu", a->d_model);
    snprintf(df, sizeof df, "%zu", a->d_ff);
    snprintf(rp, sizeof rp, "%d", reps);
    snprintf(env, sizeof env, "OPENBLAS_CORETYPE=%s", core);
    char *argv[] = {"clffn-bench",
                    "--cpu-only",
                    "--tokens",
                    tokens,
                    "--d-model",
                    dm,
                    "--d-ff",
                    df,
                    "--activation",
                    (char *)clffn_activation_name(a->act),
                    "--reps",
                    rp,
                    "--bias",
                    a->no_bias ? "off" : "on",
                    a->gated ? "--gated" : NULL,
                    NULL};
    /* the environment with OPENBLAS_CORETYPE replaced */
    size_t ne = 0;
    while (environ[ne]) { ++ne; }
    char **envp = calloc(ne + 2, sizeof *envp);
    if (!envp) { return -1; }
    size_t k = 0;
    for (size_t i = 0; i < ne; ++i) {
        if (strncmp(environ[i], "OPENBLAS_CORETYPE=", 18)) { envp[k++] = environ[i]; }
    }
    envp[k++] = env;
    const int rc = tool_spawn_self(argv, envp, 0, line, sizeof line);
    free(envp);
    if (rc != 0) { return -1; }
    char ran[64] = "";
    if (sscanf(line, "%lf %lf %63s", &out->best_s, &out->median_s, ran) != 3) { return -1; }
    return strcmp(ran, core) ? -1 : 0; /* OpenBLAS took another core: not what was asked */
}

int cpu_fair_time(cpu_run *r, const args *a, size_t T, int reps, cpu_timing *out) {
    memset(out, 0, sizeof *out);
    if (cpu_time(r, a, T, reps, &out->detected) != 0) { return 1; }
    out->best = out->detected;
    snprintf(out->detected_core, sizeof out->detected_core, "%s", cpu_core_detected());
    snprintf(out->core, sizeof out->core, "%s", out->detected_core);
    const char *allowed = cpu_core_allowed();
    if (!allowed || !strcmp(allowed, out->detected_core)) { return 0; }
    snprintf(out->forced_core, sizeof out->forced_core, "%s", allowed);
    if (cpu_time_core(a, allowed, T, reps, &out->forced) != 0) {
        fprintf(stderr,
                "clffn-bench: the CPU FFN with OPENBLAS_CORETYPE=%s failed; keeping the "
                "detected core's time\n",
                allowed);
        out->forced_core[0] = '\0';
        return 0;
    }
    if (out->forced.best_s < out->detected.best_s) {
        out->best = out->forced;
        snprintf(out->core, sizeof out->core, "%s", allowed);
    }
    return 0;
}
