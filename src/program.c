/* Kernel sources and a device's program cache.
 *
 * Every program is the concatenated sources (clffn_defs.h first) built with the options of its
 * key. The build options also define the activation ids from the public clffn_activation enum,
 * so kernels and host share that one definition. */
#include "program.h"

#include "clffn_defs.h"
#include "devices.h"
#include "transfer.h"

#include <ctype.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Kernel sources: embedded at build time, or read from CLFFN_KERNEL_DIR while developing */

/* Whether the program of `only` (see clffn__kernel_source) takes source file i: the shared
 * definitions always come first, and the weight kernels' program takes the activations too
 * (its fused epilogue computes them). */
static bool takes(const char *only, size_t i) {
    const char *name = clffn_embedded_sources[i].name;
    if (i == 0) { return true; }
    if (only && !strcmp(only, "weights.cl") && !strcmp(name, "activation.cl")) { return true; }
    return only ? !strcmp(name, only) : strcmp(name, "weights.cl") != 0;
}

clffn_status clffn__kernel_source(const char *only, char **out) {
    const char *dir = getenv("CLFFN_KERNEL_DIR");
    const size_t n = clffn_embedded_source_count;
    char **parts = calloc(n, sizeof *parts);
    if (!parts) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    clffn_status st = CLFFN_SUCCESS;
    size_t total = 1;
    for (size_t i = 0; i < n && st == CLFFN_SUCCESS; ++i) {
        if (!takes(only, i)) { continue; }
        if (dir && *dir) {
            const size_t len = strlen(dir) + strlen(clffn_embedded_sources[i].name) + 2;
            char *path = malloc(len);
            if (!path) {
                st = CLFFN_ERROR_OUT_OF_HOST_MEMORY;
                break;
            }
            snprintf(path, len, "%s/%s", dir, clffn_embedded_sources[i].name);
            int oom;
            parts[i] = clffn__read_text(path, LONG_MAX, &oom);
            free(path);
            if (!parts[i]) {
                st = oom ? CLFFN_ERROR_OUT_OF_HOST_MEMORY : CLFFN_ERROR_KERNEL_SOURCE;
            }
        }
        if (st == CLFFN_SUCCESS) {
            total += strlen(parts[i] ? parts[i] : clffn_embedded_sources[i].text) + 1;
        }
    }
    char *src = st == CLFFN_SUCCESS ? malloc(total) : NULL;
    if (st == CLFFN_SUCCESS && !src) { st = CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    if (src) {
        char *p = src;
        for (size_t i = 0; i < n; ++i) {
            if (!takes(only, i)) { continue; }
            const char *s = parts[i] ? parts[i] : clffn_embedded_sources[i].text;
            const size_t len = strlen(s);
            memcpy(p, s, len);
            p[len] = '\n';
            p += len + 1;
        }
        *p = '\0';
        *out = src;
    }
    for (size_t i = 0; i < n; ++i) { free(parts[i]); }
    free(parts);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* Programs */

clffn_status clffn__programs_init(clffn_programs *p, cl_context context, cl_device_id device) {
    memset(p, 0, sizeof *p);
    if (pthread_mutex_init(&p->lock, NULL) != 0) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    p->context = context;
    p->device = device;
    cl_device_type type = 0;
    clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    p->local_size = (type & CL_DEVICE_TYPE_CPU) ? CLFFN_CPU_ITEMS_LOCAL : 0;
    char platform[256], name[256], driver[256];
    clffn__device_strings(device, platform, name, driver, sizeof platform);
    p->row_direct = clffn__cpu_compiler_device(type, name);
    return CLFFN_SUCCESS;
}

cl_int clffn__enqueue_items(const clffn_programs *p, cl_command_queue queue, cl_kernel k,
                            cl_uint dims, const size_t *global, cl_event *event) {
    const size_t ls = p->local_size;
    size_t g[3] = {global[0], dims > 1 ? global[1] : 1, dims > 2 ? global[2] : 1};
    const size_t local[3] = {ls, 1, 1};
    if (ls) { g[0] = (g[0] + ls - 1) / ls * ls; }
    return clEnqueueNDRangeKernel(queue, k, dims, NULL, g, ls ? local : NULL, 0, NULL, event);
}

const char *clffn__programs_build_log(const clffn_programs *p) {
    return p->build_log ? p->build_log : "";
}

/* Builds the concatenated sources with options; on failure keeps the device's log in the
 * cache. Called with the cache's lock held. */
static clffn_status build_program(clffn_programs *pc, const char *only, const char *options,
                                  cl_program *out) {
    char *src = NULL;
    clffn_status st = clffn__kernel_source(only, &src);
    if (st != CLFFN_SUCCESS) { return st; }
    cl_int err;
    const char *srcs[1] = {src};
    cl_program prog = clCreateProgramWithSource(pc->context, 1, srcs, NULL, &err);
    free(src);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    err = clBuildProgram(prog, 1, &pc->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        size_t len = 0;
        free(pc->build_log);
        pc->build_log = NULL;
        if (clGetProgramBuildInfo(prog, pc->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len) ==
                CL_SUCCESS &&
            (pc->build_log = calloc(len + 1, 1)) != NULL) {
            clGetProgramBuildInfo(prog, pc->device, CL_PROGRAM_BUILD_LOG, len, pc->build_log, NULL);
        }
        clReleaseProgram(prog);
        return (clffn_status)err;
    }
    *out = prog;
    return CLFFN_SUCCESS;
}

/* " -DPREFIX_<NAME>=<value>" for every name of a public enum, upper-cased, appended at buf + n:
 * the kernels compare against the public values themselves. Returns the new length. */
static int enum_defines(char *buf, size_t size, int n, const char *prefix, int count,
                        const char *(*name_of)(int)) {
    for (int a = 0; a < count && n > 0 && (size_t)n < size; ++a) {
        char name[32];
        const char *lower = name_of(a);
        size_t i = 0;
        for (; lower[i] && i + 1 < sizeof name; ++i) {
            name[i] = (char)toupper((unsigned char)lower[i]);
        }
        name[i] = '\0';
        n += snprintf(buf + n, size - (size_t)n, " -D%s_%s=%d", prefix, name, a);
    }
    return n;
}

static const char *act_name(int a) { return clffn_activation_name((clffn_activation)a); }
static atomic_int cpu_dot_mode = -1;

void clffn__set_cpu_dot_products(int mode) { atomic_store(&cpu_dot_mode, mode); }

/* Whether the host's CPU has AVX-512 VNNI (bf16 0) or AVX-512 BF16 (bf16 1). */
static int cpu_has(int bf16) {
    const int mode = atomic_load(&cpu_dot_mode);
    if (mode == 0 || mode == 2) { return 0; }
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return (bf16 ? __builtin_cpu_supports("avx512bf16") : __builtin_cpu_supports("avx512vnni")) !=
           0;
#else
    return 0;
#endif
}

static const char *dtype_name(int t) { return clffn_dtype_name((clffn_dtype)t); }

/* -cl-std=CL1.2 and no fast-math (results must match the reference, see activation.cl); IEEE
 * division where the device offers it (erf's one quotient is corrected by hand elsewhere, see
 * activation.cl); the key's choices, and for the weight kernels the device's half decoding
 * (cl/weights.cl, CLFFN_SOFT_HALF), the row kernels' form (CLFFN_ROW_DIRECT) and, on a CPU,
 * whether it has AVX-512 VNNI and BF16 (CLFFN_QX_VNNI, CLFFN_CPU_BF16) and -w;
 * every activation's id as -DCLFFN_ACT_<NAME>=<value> and
 * every weight type's as -DCLFFN_WTYPE_<NAME>=<value>. */
static void build_options(const clffn_programs *pc, const clffn_program_key *key, char *buf,
                          size_t size) {
    cl_device_id device = pc->device;
    cl_device_fp_config fp = 0;
    clGetDeviceInfo(device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
    const char *div = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT)
                          ? " -cl-fp32-correctly-rounded-divide-sqrt -DCLFFN_EXACT_DIVISION=1"
                          : "";
    int n =
        snprintf(buf, size, "-cl-std=CL1.2%s -DCLFFN_ACT=%d -DCLFFN_GATED=%d -DCLFFN_DROPOUT=%d",
                 div, key->activation, key->gated ? 1 : 0, key->dropout ? 1 : 0);
    if (key->weights && n > 0 && (size_t)n < size) {
        const clffn_wgemv_params *p = &key->wgemv;
        /* a CPU compiler emulates vload_half at length; the integer form is exact on any
         * device, flushing subnormals or not (and cl/weights.cl takes F16C's conversions over
         * both where its compiler targets them) */
        cl_device_type type = 0;
        clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
        const int soft_half = (type & CL_DEVICE_TYPE_CPU) != 0;
        n += snprintf(buf + n, size - (size_t)n,
                      " -DCLFFN_WTYPE=%d -DCLFFN_WTOKENS=%d -DCLFFN_ROW_SPLIT=%d"
                      " -DCLFFN_ROW_ROWS=%d -DCLFFN_COL_WIDTH=%d -DCLFFN_COL_SPLIT=%d"
                      " -DCLFFN_COL_GROUPS=%d -DCLFFN_SOFT_HALF=%d -DCLFFN_QX_VNNI=%d"
                      " -DCLFFN_CPU_BF16=%d -DCLFFN_ROW_DIRECT=%d%s%s",
                      key->weights - 1, key->tokens, p->row_split, p->row_rows, p->col_width,
                      p->col_split, p->col_groups, soft_half, soft_half && cpu_has(0),
                      soft_half && cpu_has(1), pc->row_direct,
                      soft_half && atomic_load(&cpu_dot_mode) == 2 ? " -DCLFFN_QX_AVX512=0" : "",
                      /* where a CPU target has no AVX-512, clang warns at every float16 and
                       * ulong8 passed between the kernels' functions that its x86 ABI changes
                       * (-Wpsabi, which POCL refuses by name), and POCL prints "N warnings
                       * generated." to the application's standard error at each first build;
                       * the calls are compiled together, so no ABI boundary is crossed. GPU
                       * builds keep their warnings. */
                      soft_half ? " -w" : "");
    }
    n = enum_defines(buf, size, n, "CLFFN_ACT", (int)CLFFN_ACT_COUNT_, act_name);
    enum_defines(buf, size, n, "CLFFN_WTYPE", (int)CLFFN_DTYPE_COUNT_, dtype_name);
}

clffn_status clffn__get_program(clffn_programs *pc, const clffn_program_key *key, cl_program *out) {
    pthread_mutex_lock(&pc->lock);
    for (int i = 0; i < pc->n; ++i) {
        if (!memcmp(&pc->entries[i].key, key, sizeof *key)) { /* ints only: no padding */
            *out = pc->entries[i].program;
            pthread_mutex_unlock(&pc->lock);
            return CLFFN_SUCCESS;
        }
    }
    char options[1024];
    build_options(pc, key, options, sizeof options);
    cl_program prog = NULL;
    clffn_status st = build_program(pc, key->weights ? "weights.cl" : NULL, options, &prog);
    if (st == CLFFN_SUCCESS) {
        if (pc->n < CLFFN_MAX_PROGRAMS) {
            pc->entries[pc->n].key = *key;
            pc->entries[pc->n].program = prog;
            pc->n++;
            *out = prog;
        } else {
            /* keys are bounded by the enums, so this means a bug, not a user error */
            clReleaseProgram(prog);
            st = CLFFN_ERROR_INVALID_ARGUMENT;
        }
    }
    pthread_mutex_unlock(&pc->lock);
    return st;
}

void clffn__programs_release(clffn_programs *p) {
    for (int i = 0; i < p->n; ++i) { clReleaseProgram(p->entries[i].program); }
    p->n = 0;
    if (p->zero_kernel) { clReleaseKernel(p->zero_kernel); }
    if (p->zero_program) { clReleaseProgram(p->zero_program); }
    p->zero_kernel = NULL;
    p->zero_program = NULL;
    free(p->build_log);
    p->build_log = NULL;
    pthread_mutex_destroy(&p->lock);
}

/* cl/fill.cl alone (after clffn_defs.h), embedded or from CLFFN_KERNEL_DIR as the others. */
static cl_int build_zero_kernel(clffn_programs *pc) {
    char *text = NULL;
    const clffn_status st = clffn__kernel_source("fill.cl", &text);
    if (st != CLFFN_SUCCESS) { return (cl_int)st; }
    const char *src = text;
    cl_int err;
    cl_program prog = clCreateProgramWithSource(pc->context, 1, &src, NULL, &err);
    free(text);
    if (err != CL_SUCCESS) { return err; }
    err = clBuildProgram(prog, 1, &pc->device, "-cl-std=CL1.2", NULL, NULL);
    cl_kernel k = err == CL_SUCCESS ? clCreateKernel(prog, "clffn_zero", &err) : NULL;
    if (err != CL_SUCCESS) {
        clReleaseProgram(prog);
        return err;
    }
    pc->zero_program = prog;
    pc->zero_kernel = k;
    return CL_SUCCESS;
}

cl_int clffn__zero_floats(const clffn_programs *cp, cl_command_queue queue, cl_mem p, size_t off,
                          size_t n) {
    /* the kernel is the cache's mutable state behind its lock, as the programs are */
    clffn_programs *pc = (clffn_programs *)cp;
    pthread_mutex_lock(&pc->lock);
    cl_int err = pc->zero_kernel ? CL_SUCCESS : build_zero_kernel(pc);
    const cl_ulong o = off, cnt = n;
    if (err == CL_SUCCESS) { err = clSetKernelArg(pc->zero_kernel, 0, sizeof p, &p); }
    if (err == CL_SUCCESS) { err = clSetKernelArg(pc->zero_kernel, 1, sizeof o, &o); }
    if (err == CL_SUCCESS) { err = clSetKernelArg(pc->zero_kernel, 2, sizeof cnt, &cnt); }
    if (err == CL_SUCCESS) { err = clffn__enqueue_items(pc, queue, pc->zero_kernel, 1, &n, NULL); }
    pthread_mutex_unlock(&pc->lock);
    return err;
}

clffn_status clffn__device_philox(clffn_programs *pc, cl_command_queue queue,
                                  const uint32_t counter[4], const uint32_t key[2],
                                  uint32_t out[4]) {
    if (!pc || !queue || !counter || !key || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_program_key pk = {.activation = CLFFN_ACT_IDENTITY};
    cl_program prog;
    clffn_status st = clffn__get_program(pc, &pk, &prog);
    if (st != CLFFN_SUCCESS) { return st; }
    cl_int err;
    cl_kernel k = clCreateKernel(prog, "clffn_philox_raw", &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    cl_mem buf = clCreateBuffer(pc->context, CL_MEM_WRITE_ONLY, 4 * sizeof(cl_uint), NULL, &err);
    if (err == CL_SUCCESS) {
        const cl_uint4 c = {{counter[0], counter[1], counter[2], counter[3]}};
        const cl_uint2 kk = {{key[0], key[1]}};
        const size_t one = 1;
        err = clSetKernelArg(k, 0, sizeof buf, &buf);
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 1, sizeof c, &c); }
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 2, sizeof kk, &kk); }
        if (err == CL_SUCCESS) {
            err = clEnqueueNDRangeKernel(queue, k, 1, NULL, &one, &one, 0, NULL, NULL);
        }
        cl_uint tmp[4];
        if (err == CL_SUCCESS) { err = clffn__read(queue, buf, 0, sizeof tmp, tmp, 0, NULL); }
        if (err == CL_SUCCESS) { memcpy(out, tmp, sizeof tmp); }
        clReleaseMemObject(buf);
    }
    clReleaseKernel(k);
    return (clffn_status)err;
}

clffn_status clffn__device_erf(clffn_programs *pc, cl_command_queue queue, uint32_t first,
                               uint32_t stride, size_t n, unsigned form, float *y) {
    if (!pc || !queue || !y) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (n == 0 || n > SIZE_MAX / sizeof(float) - 4 ||
        (form & ~(CLFFN_ERF_PROBE_VEC | CLFFN_ERF_PROBE_DIV_2ULP))) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    const clffn_program_key pk = {.activation = CLFFN_ACT_IDENTITY};
    cl_program prog;
    clffn_status st = clffn__get_program(pc, &pk, &prog);
    if (st != CLFFN_SUCCESS) { return st; }
    cl_int err;
    cl_kernel k = clCreateKernel(prog, "clffn_erf_probe", &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    cl_mem buf = clCreateBuffer(pc->context, CL_MEM_WRITE_ONLY, n * sizeof(float), NULL, &err);
    if (err == CL_SUCCESS) {
        const cl_uint f = first, s = stride, v = form;
        const cl_ulong cnt = n;
        const size_t items = (n + 3) / 4;
        err = clSetKernelArg(k, 0, sizeof buf, &buf);
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 1, sizeof f, &f); }
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 2, sizeof s, &s); }
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 3, sizeof cnt, &cnt); }
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 4, sizeof v, &v); }
        if (err == CL_SUCCESS) { err = clffn__enqueue_items(pc, queue, k, 1, &items, NULL); }
        if (err == CL_SUCCESS) { err = clffn__read(queue, buf, 0, n * sizeof(float), y, 0, NULL); }
        clReleaseMemObject(buf);
    }
    clReleaseKernel(k);
    return (clffn_status)err;
}
