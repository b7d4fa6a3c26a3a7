/* Kernel sources and the per-context program cache.
 *
 * Every program is the concatenated sources (clffn_defs.h first) built with the options of its
 * key. The build options also define the activation ids from the public clffn_activation enum,
 * so kernels and host share that one definition. */
#include "program.h"

#include "clffn_defs.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Kernel sources: embedded at build time, or read from CLFFN_KERNEL_DIR while developing */

clffn_status clffn__kernel_source(char **out) {
    const char *dir = getenv("CLFFN_KERNEL_DIR");
    const size_t n = clffn_embedded_source_count;
    char **parts = calloc(n, sizeof *parts);
    if (!parts) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    clffn_status st = CLFFN_SUCCESS;
    size_t total = 1;
    for (size_t i = 0; i < n && st == CLFFN_SUCCESS; ++i) {
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

/* Builds the concatenated sources with options; on failure keeps the device's log in the
 * context. Called with ctx->lock held. */
static clffn_status build_program(clffn_context *ctx, const char *options, cl_program *out) {
    char *src = NULL;
    clffn_status st = clffn__kernel_source(&src);
    if (st != CLFFN_SUCCESS) { return st; }
    cl_int err;
    const char *srcs[1] = {src};
    cl_program prog = clCreateProgramWithSource(ctx->context, 1, srcs, NULL, &err);
    free(src);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    err = clBuildProgram(prog, 1, &ctx->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        size_t len = 0;
        free(ctx->build_log);
        ctx->build_log = NULL;
        if (clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len) ==
                CL_SUCCESS &&
            (ctx->build_log = calloc(len + 1, 1)) != NULL) {
            clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, len, ctx->build_log,
                                  NULL);
        }
        clReleaseProgram(prog);
        return (clffn_status)err;
    }
    *out = prog;
    return CLFFN_SUCCESS;
}

/* -cl-std=CL1.2 and no fast-math (results must match the reference, see activation.cl); IEEE
 * division where the device offers it (erf's one quotient is corrected by hand elsewhere, see
 * activation.cl); the key's choices; and every activation's id as -DCLFFN_ACT_<NAME>=<value>. */
static void build_options(cl_device_id device, const clffn_program_key *key, char *buf,
                          size_t size) {
    cl_device_fp_config fp = 0;
    clGetDeviceInfo(device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
    const char *div = (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT)
                          ? " -cl-fp32-correctly-rounded-divide-sqrt -DCLFFN_EXACT_DIVISION=1"
                          : "";
    int n =
        snprintf(buf, size, "-cl-std=CL1.2%s -DCLFFN_ACT=%d -DCLFFN_GATED=%d -DCLFFN_DROPOUT=%d",
                 div, key->activation, key->gated ? 1 : 0, key->dropout ? 1 : 0);
    for (int a = 0; a < (int)CLFFN_ACT_COUNT_ && n > 0 && (size_t)n < size; ++a) {
        char name[32];
        const char *lower = clffn_activation_name((clffn_activation)a);
        size_t i = 0;
        for (; lower[i] && i + 1 < sizeof name; ++i) {
            name[i] = (char)toupper((unsigned char)lower[i]);
        }
        name[i] = '\0';
        n += snprintf(buf + n, size - (size_t)n, " -DCLFFN_ACT_%s=%d", name, a);
    }
}

clffn_status clffn__get_program(clffn_context *ctx, const clffn_program_key *key, cl_program *out) {
    pthread_mutex_lock(&ctx->lock);
    for (int i = 0; i < ctx->n_programs; ++i) {
        const clffn_program_key *k = &ctx->programs[i].key;
        if (k->activation == key->activation && k->gated == key->gated &&
            k->dropout == key->dropout) {
            *out = ctx->programs[i].program;
            pthread_mutex_unlock(&ctx->lock);
            return CLFFN_SUCCESS;
        }
    }
    char options[512];
    build_options(ctx->device, key, options, sizeof options);
    cl_program prog = NULL;
    clffn_status st = build_program(ctx, options, &prog);
    if (st == CLFFN_SUCCESS) {
        if (ctx->n_programs < CLFFN_MAX_PROGRAMS) {
            ctx->programs[ctx->n_programs].key = *key;
            ctx->programs[ctx->n_programs].program = prog;
            ctx->n_programs++;
            *out = prog;
        } else {
            /* keys are bounded by the enums, so this means a bug, not a user error */
            clReleaseProgram(prog);
            st = CLFFN_ERROR_INVALID_ARGUMENT;
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

void clffn__programs_release(clffn_context *ctx) {
    for (int i = 0; i < ctx->n_programs; ++i) { clReleaseProgram(ctx->programs[i].program); }
    ctx->n_programs = 0;
    if (ctx->zero_kernel) { clReleaseKernel(ctx->zero_kernel); }
    if (ctx->zero_program) { clReleaseProgram(ctx->zero_program); }
    ctx->zero_kernel = NULL;
    ctx->zero_program = NULL;
}

/* cl/fill.cl's text: embedded, or from CLFFN_KERNEL_DIR as the other sources. */
static cl_int build_zero_kernel(clffn_context *ctx) {
    const char *dir = getenv("CLFFN_KERNEL_DIR");
    char *text = NULL;
    if (dir && *dir) {
        char path[4096];
        int oom = 0;
        snprintf(path, sizeof path, "%s/fill.cl", dir);
        text = clffn__read_text(path, LONG_MAX, &oom);
        if (!text) { return oom ? CL_OUT_OF_HOST_MEMORY : (cl_int)CLFFN_ERROR_KERNEL_SOURCE; }
    }
    const char *src = text;
    for (size_t i = 0; !src && i < clffn_embedded_source_count; ++i) {
        if (!strcmp(clffn_embedded_sources[i].name, "fill.cl")) {
            src = clffn_embedded_sources[i].text;
        }
    }
    if (!src) { return (cl_int)CLFFN_ERROR_KERNEL_SOURCE; }
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx->context, 1, &src, NULL, &err);
    free(text);
    if (err != CL_SUCCESS) { return err; }
    err = clBuildProgram(prog, 1, &ctx->device, "-cl-std=CL1.2", NULL, NULL);
    cl_kernel k = err == CL_SUCCESS ? clCreateKernel(prog, "clffn_zero", &err) : NULL;
    if (err != CL_SUCCESS) {
        clReleaseProgram(prog);
        return err;
    }
    ctx->zero_program = prog;
    ctx->zero_kernel = k;
    return CL_SUCCESS;
}

cl_int clffn__zero_floats(const clffn_context *cctx, cl_command_queue queue, cl_mem p, size_t off,
                          size_t n) {
    /* the kernel is the context's mutable state behind its lock, as the program cache is */
    clffn_context *ctx = (clffn_context *)cctx;
    pthread_mutex_lock(&ctx->lock);
    cl_int err = ctx->zero_kernel ? CL_SUCCESS : build_zero_kernel(ctx);
    const cl_ulong o = off, cnt = n;
    if (err == CL_SUCCESS) { err = clSetKernelArg(ctx->zero_kernel, 0, sizeof p, &p); }
    if (err == CL_SUCCESS) { err = clSetKernelArg(ctx->zero_kernel, 1, sizeof o, &o); }
    if (err == CL_SUCCESS) { err = clSetKernelArg(ctx->zero_kernel, 2, sizeof cnt, &cnt); }
    if (err == CL_SUCCESS) {
        err = clEnqueueNDRangeKernel(queue, ctx->zero_kernel, 1, NULL, &n, NULL, 0, NULL, NULL);
    }
    pthread_mutex_unlock(&ctx->lock);
    return err;
}

clffn_status clffn__device_philox(clffn_context *ctx, const uint32_t counter[4],
                                  const uint32_t key[2], uint32_t out[4]) {
    if (!ctx || !counter || !key || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_program_key pk = {CLFFN_ACT_IDENTITY, 0, 0};
    cl_program prog;
    clffn_status st = clffn__get_program(ctx, &pk, &prog);
    if (st != CLFFN_SUCCESS) { return st; }
    cl_int err;
    cl_kernel k = clCreateKernel(prog, "clffn_philox_raw", &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    cl_mem buf = clCreateBuffer(ctx->context, CL_MEM_WRITE_ONLY, 4 * sizeof(cl_uint), NULL, &err);
    if (err == CL_SUCCESS) {
        const cl_uint4 c = {{counter[0], counter[1], counter[2], counter[3]}};
        const cl_uint2 kk = {{key[0], key[1]}};
        const size_t one = 1;
        err = clSetKernelArg(k, 0, sizeof buf, &buf);
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 1, sizeof c, &c); }
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 2, sizeof kk, &kk); }
        if (err == CL_SUCCESS) {
            err = clEnqueueNDRangeKernel(ctx->queue, k, 1, NULL, &one, &one, 0, NULL, NULL);
        }
        cl_uint tmp[4];
        if (err == CL_SUCCESS) {
            err = clEnqueueReadBuffer(ctx->queue, buf, CL_TRUE, 0, sizeof tmp, tmp, 0, NULL, NULL);
        }
        if (err == CL_SUCCESS) { memcpy(out, tmp, sizeof tmp); }
        clReleaseMemObject(buf);
    }
    clReleaseKernel(k);
    return (clffn_status)err;
}

clffn_status clffn__device_erf(clffn_context *ctx, uint32_t first, uint32_t stride, size_t n,
                               unsigned form, float *y) {
    if (!ctx || !y) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (n == 0 || n > SIZE_MAX / sizeof(float) - 4 ||
        (form & ~(CLFFN_ERF_PROBE_VEC | CLFFN_ERF_PROBE_DIV_2ULP))) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    const clffn_program_key pk = {CLFFN_ACT_IDENTITY, 0, 0};
    cl_program prog;
    clffn_status st = clffn__get_program(ctx, &pk, &prog);
    if (st != CLFFN_SUCCESS) { return st; }
    cl_int err;
    cl_kernel k = clCreateKernel(prog, "clffn_erf_probe", &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    cl_mem buf = clCreateBuffer(ctx->context, CL_MEM_WRITE_ONLY, n * sizeof(float), NULL, &err);
    if (err == CL_SUCCESS) {
        const cl_uint f = first, s = stride, v = form;
        const cl_ulong cnt = n;
        const size_t items = (n + 3) / 4;
        err = clSetKernelArg(k, 0, sizeof buf, &buf);
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 1, sizeof f, &f); }
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 2, sizeof s, &s); }
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 3, sizeof cnt, &cnt); }
        if (err == CL_SUCCESS) { err = clSetKernelArg(k, 4, sizeof v, &v); }
        if (err == CL_SUCCESS) {
            err = clEnqueueNDRangeKernel(ctx->queue, k, 1, NULL, &items, NULL, 0, NULL, NULL);
        }
        if (err == CL_SUCCESS) {
            err = clEnqueueReadBuffer(ctx->queue, buf, CL_TRUE, 0, n * sizeof(float), y, 0, NULL,
                                      NULL);
        }
        clReleaseMemObject(buf);
    }
    clReleaseKernel(k);
    return (clffn_status)err;
}
