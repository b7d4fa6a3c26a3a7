/* The clffn_context: device choice, capability checks, kernel sources and the program cache. */
#include "internal.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Device capabilities */

int clffn__parse_cl_version(const char *s, int *major, int *minor) {
    if (!s || strncmp(s, "OpenCL ", 7) != 0) { return 0; }
    return sscanf(s + 7, "%d.%d", major, minor) == 2;
}

clffn_status clffn__device_caps_check(const clffn_device_caps *caps) {
    if (!caps) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const int v = caps->version_major * 100 + caps->version_minor;
    if (!caps->available || !caps->compiler_available || v < 102) {
        return CLFFN_ERROR_DEVICE_UNSUPPORTED;
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn__device_caps_query(cl_device_id device, clffn_device_caps *caps) {
    char version[256] = {0};
    cl_bool compiler = CL_FALSE, available = CL_FALSE;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_VERSION, sizeof version - 1, version, NULL);
    if (err == CL_SUCCESS) {
        err = clGetDeviceInfo(device, CL_DEVICE_COMPILER_AVAILABLE, sizeof compiler, &compiler, NULL);
    }
    if (err == CL_SUCCESS) {
        err = clGetDeviceInfo(device, CL_DEVICE_AVAILABLE, sizeof available, &available, NULL);
    }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    caps->version_major = caps->version_minor = 0;
    clffn__parse_cl_version(version, &caps->version_major, &caps->version_minor);
    caps->compiler_available = compiler == CL_TRUE;
    caps->available = available == CL_TRUE;
    return CLFFN_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Creation */

static clffn_status context_init(clffn_context *ctx, cl_context context, cl_device_id device) {
    clffn_device_caps caps;
    clffn_status st = clffn__device_caps_query(device, &caps);
    if (st != CLFFN_SUCCESS) { return st; }
    if ((st = clffn__device_caps_check(&caps)) != CLFFN_SUCCESS) { return st; }
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof ctx->max_alloc,
                                 &ctx->max_alloc, NULL);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    cl_device_type type = 0;
    err = clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    ctx->cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    ctx->queue = clCreateCommandQueue(context, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if (pthread_mutex_init(&ctx->lock, NULL) != 0) {
        clReleaseCommandQueue(ctx->queue);
        ctx->queue = NULL;
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    ctx->context = context;
    ctx->device = device;
    if ((st = clffn__apply_tuning(ctx)) != CLFFN_SUCCESS) {
        pthread_mutex_destroy(&ctx->lock);
        clReleaseCommandQueue(ctx->queue);
        ctx->queue = NULL;
    }
    return st;
}

clffn_status clffn_context_create(cl_context context, cl_device_id device, clffn_context **out) {
    if (!context || !device || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    /* the device must belong to the context */
    cl_uint n = 0;
    cl_int err = clGetContextInfo(context, CL_CONTEXT_NUM_DEVICES, sizeof n, &n, NULL);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    cl_device_id *devs = calloc(n ? n : 1, sizeof *devs);
    if (!devs) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    err = clGetContextInfo(context, CL_CONTEXT_DEVICES, n * sizeof *devs, devs, NULL);
    int found = 0;
    for (cl_uint i = 0; err == CL_SUCCESS && i < n; ++i) { found |= devs[i] == device; }
    free(devs);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if (!found) { return CLFFN_ERROR_INVALID_ARGUMENT; }

    clffn_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    clffn_status st = context_init(ctx, context, device);
    if (st != CLFFN_SUCCESS) {
        free(ctx);
        return st;
    }
    clRetainContext(context);
    clRetainDevice(device);
    *out = ctx;
    return CLFFN_SUCCESS;
}

static int contains_ci(const char *hay, const char *needle) {
    const size_t n = strlen(needle);
    for (; *hay; ++hay) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) {
            ++i;
        }
        if (i == n) { return 1; }
    }
    return n == 0;
}

/* Picks the device named by spec ("P:D" or a name substring), or the first GPU, else the first
 * device when spec is empty. */
static clffn_status select_device(const char *spec, cl_device_id *out) {
    size_t n = 0;
    clffn_status st = clffn_devices_list(NULL, 0, &n);
    if (st != CLFFN_SUCCESS) { return st; }
    if (n == 0) { return CLFFN_ERROR_DEVICE_NOT_FOUND; }
    clffn_device_info *devs = calloc(n, sizeof *devs);
    if (!devs) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    if ((st = clffn_devices_list(devs, n, &n)) != CLFFN_SUCCESS) {
        free(devs);
        return st;
    }
    unsigned want_p = 0, want_d = 0;
    char tail = 0;
    const int named = spec && *spec;
    const int by_index = named && sscanf(spec, "%u:%u%c", &want_p, &want_d, &tail) == 2;
    cl_device_id match = NULL, first_gpu = NULL;
    for (size_t i = 0; i < n && !match; ++i) {
        if (!first_gpu && (devs[i].type & CL_DEVICE_TYPE_GPU)) { first_gpu = devs[i].device; }
        if (by_index ? (devs[i].platform_index == want_p && devs[i].device_index == want_d)
                     : (named && contains_ci(devs[i].name, spec))) {
            match = devs[i].device;
        }
    }
    if (!named) { match = first_gpu ? first_gpu : devs[0].device; }
    free(devs);
    if (!match) { return CLFFN_ERROR_DEVICE_NOT_FOUND; }
    *out = match;
    return CLFFN_SUCCESS;
}

clffn_status clffn_context_create_for_device(const char *spec, clffn_context **out) {
    if (!out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!spec || !*spec) { spec = getenv("CLFFN_DEVICE"); }
    cl_device_id device = NULL;
    clffn_status st = select_device(spec, &device);
    if (st != CLFFN_SUCCESS) { return st; }
    cl_int err;
    cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    st = clffn_context_create(context, device, out);
    clReleaseContext(context); /* the clffn_context holds its own reference on success */
    return st;
}

clffn_status clffn_context_create_default(clffn_context **out) {
    return clffn_context_create_for_device(NULL, out);
}

void clffn_context_destroy(clffn_context *ctx) {
    if (!ctx) { return; }
    for (int i = 0; i < ctx->n_programs; ++i) { clReleaseProgram(ctx->programs[i].program); }
    if (ctx->philox_program) { clReleaseProgram(ctx->philox_program); }
    if (ctx->queue) { clReleaseCommandQueue(ctx->queue); }
    clReleaseDevice(ctx->device);
    clReleaseContext(ctx->context);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx->build_log);
    free(ctx);
}

cl_context clffn_context_cl_context(const clffn_context *ctx) { return ctx ? ctx->context : NULL; }
cl_device_id clffn_context_cl_device(const clffn_context *ctx) { return ctx ? ctx->device : NULL; }
cl_command_queue clffn_context_queue(const clffn_context *ctx) { return ctx ? ctx->queue : NULL; }

clffn_status clffn_context_device_name(const clffn_context *ctx, char *buf, size_t size) {
    if (!ctx || !buf) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (size == 0) { return CLFFN_ERROR_INVALID_SIZE; }
    size_t need = 0;
    cl_int err = clGetDeviceInfo(ctx->device, CL_DEVICE_NAME, 0, NULL, &need);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    char *tmp = malloc(need + 1);
    if (!tmp) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    err = clGetDeviceInfo(ctx->device, CL_DEVICE_NAME, need, tmp, NULL);
    if (err == CL_SUCCESS) {
        tmp[need] = '\0';
        snprintf(buf, size, "%s", tmp);
    }
    free(tmp);
    return (clffn_status)err;
}

const char *clffn_context_build_log(const clffn_context *ctx) {
    return ctx && ctx->build_log ? ctx->build_log : "";
}

/* ------------------------------------------------------------------------------------------ */
/* Kernel sources: embedded at build time, or read from CLFFN_KERNEL_DIR while developing */

char *clffn__read_text(const char *path, long max_bytes, int *oom) {
    *oom = 0;
    FILE *f = fopen(path, "rb");
    if (!f) { return NULL; }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < max_bytes &&
        fseek(f, 0, SEEK_SET) == 0) {
        if (!(buf = malloc((size_t)n + 1))) {
            *oom = 1;
        } else if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0';
        }
    }
    fclose(f);
    return buf;
}

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
            if (!parts[i]) { st = oom ? CLFFN_ERROR_OUT_OF_HOST_MEMORY : CLFFN_ERROR_KERNEL_SOURCE; }
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
    char options[160];
    /* -cl-std=CL1.2 and no fast-math: results must match the reference, see activation.cl */
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DCLFFN_ACT=%d -DCLFFN_GATED=%d -DCLFFN_DROPOUT=%d",
             key->activation, key->gated ? 1 : 0, key->dropout ? 1 : 0);
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
