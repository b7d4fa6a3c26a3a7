/* The clffn_context: device choice, creation and destruction, accessors, and its settings.
 * Calls downwards only: devices (choice, capabilities), tuning (the profile), programs (their
 * release). */
#include "context.h"

#include "devices.h"
#include "program.h"

#include <clblast_c.h>
#include <ctype.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Creation */

/* Contexts created and not yet destroyed, in the whole process: clffn_release_all refuses to
 * clear CLBlast's cache under a live one. */
static atomic_long live_contexts;

/* The few-token kernels' shapes without a profile: on a CPU each work-item walks whole rows
 * (its own cache lines, vectorized inside), on a GPU a warp's worth of work-items shares a
 * row or a column group, reading neighbouring blocks; both within the device's work-group. */
static void wgemv_defaults(const clffn_context *ctx, size_t p[CLFFN_WGEMV_PARAMS]) {
    static const size_t cpu[CLFFN_WGEMV_PARAMS] = {1, 8, 64, 1, 4};
    static const size_t gpu[CLFFN_WGEMV_PARAMS] = {32, 4, 8, 16, 8};
    static const size_t one[CLFFN_WGEMV_PARAMS] = {1, 1, 8, 1, 1}; /* fits any device */
    memcpy(p, ctx->cpu ? cpu : gpu, sizeof cpu);
    if (!clffn__wgemv_valid(p, ctx->max_wg)) { memcpy(p, one, sizeof one); }
}

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
    /* llvmpipe ran the strips 3x slower than the column groups (a one-item work-group fills
     * one SIMD lane of eight) and its compiler took 20-50 s over each */
    char platform[256], name[256], driver[256];
    clffn__device_strings(device, platform, name, driver, sizeof platform);
    ctx->col_strips = clffn__cpu_compiler_device(type, name);
    ctx->dequant_tiles = !ctx->cpu;
    cl_device_fp_config fp = 0;
    err = clGetDeviceInfo(device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    ctx->denormals = (fp & CL_FP_DENORM) != 0;
    err = clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof ctx->max_wg, &ctx->max_wg,
                          NULL);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    err = clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof ctx->compute_units,
                          &ctx->compute_units, NULL);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    ctx->queue = clCreateCommandQueue(context, device, CL_QUEUE_PROFILING_ENABLE, &err);
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if ((st = clffn__programs_init(&ctx->programs, context, device)) != CLFFN_SUCCESS) {
        clReleaseCommandQueue(ctx->queue);
        ctx->queue = NULL;
        return st;
    }
    ctx->context = context;
    ctx->device = device;
    if ((st = clffn__tuning_apply(device, &ctx->tuning)) == CLFFN_SUCCESS) {
        /* the profile's, else on but on CPU devices, where POCL ran the fused products no
         * faster than the launches they save (docs/PERFORMANCE.md, "Epilogues in the
         * products' kernels") */
        ctx->fused_epilogues =
            ctx->tuning.fused_epilogues >= 0 ? ctx->tuning.fused_epilogues : !ctx->cpu;
        ctx->gemm_k_block = ctx->tuning.gemm_k_block;
        ctx->gemv_max_tokens = ctx->tuning.gemv_max_tokens;
        ctx->gemm_k_block_min_rows = ctx->tuning.gemm_k_block_min_rows;
        ctx->weight_layout = ctx->tuning.weight_layout;
        ctx->xgemm = ctx->tuning.xgemm;
        ctx->xgemm_few = ctx->tuning.xgemm_few;
        ctx->xgemm_few_rows = ctx->tuning.xgemm_few_rows;
        memcpy(ctx->kernel_max_tokens, ctx->tuning.kernel_max_tokens,
               sizeof ctx->kernel_max_tokens);
        ctx->kernel_large_weights = ctx->tuning.kernel_large_weights;
        ctx->row_group_cols = ctx->tuning.row_group_cols;
        /* a profile's shapes that this device cannot run (another device's file) give way */
        if (clffn__wgemv_valid(ctx->tuning.wgemv, ctx->max_wg)) {
            memcpy(ctx->wgemv, ctx->tuning.wgemv, sizeof ctx->wgemv);
        } else {
            wgemv_defaults(ctx, ctx->wgemv);
        }
    } else {
        clffn__programs_release(&ctx->programs);
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
    atomic_fetch_add(&live_contexts, 1);
    *out = ctx;
    return CLFFN_SUCCESS;
}

static int contains_ci(const char *hay, const char *needle) {
    const size_t n = strlen(needle);
    for (; *hay; ++hay) {
        size_t i = 0;
        while (i < n && hay[i] &&
               tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) {
            ++i;
        }
        if (i == n) { return 1; }
    }
    return n == 0;
}

/* Picks the device named by spec ("P:D" or a name substring), or clffn_devices_default()'s
 * when spec is empty. */
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
    cl_device_id match = NULL;
    for (size_t i = 0; i < n && named && !match; ++i) {
        if (by_index ? (devs[i].platform_index == want_p && devs[i].device_index == want_d)
                     : contains_ci(devs[i].name, spec)) {
            match = devs[i].device;
        }
    }
    size_t pick = 0;
    if (!named && clffn_devices_default(devs, n, &pick) == CLFFN_SUCCESS) {
        match = devs[pick].device;
    }
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
    clffn__programs_release(&ctx->programs);
    if (ctx->queue) { clReleaseCommandQueue(ctx->queue); }
    clReleaseDevice(ctx->device);
    clReleaseContext(ctx->context);
    free(ctx);
    atomic_fetch_sub(&live_contexts, 1);
}

clffn_status clffn_release_all(void) {
    if (atomic_load(&live_contexts) > 0) { return CLFFN_ERROR_CONTEXT_ALIVE; }
    const CLBlastStatusCode st = CLBlastClearCache();
    return st == CLBlastSuccess ? CLFFN_SUCCESS : (clffn_status)st;
}

cl_context clffn_context_cl_context(const clffn_context *ctx) { return ctx ? ctx->context : NULL; }
cl_device_id clffn_context_cl_device(const clffn_context *ctx) { return ctx ? ctx->device : NULL; }
int clffn_context_denormals(const clffn_context *ctx) { return ctx ? ctx->denormals : 0; }
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
    return ctx ? clffn__programs_build_log(&ctx->programs) : "";
}

const char *clffn_context_tuning(const clffn_context *ctx) {
    return ctx ? ctx->tuning.applied : "";
}

clffn_status clffn_context_set_gemm_k_block(clffn_context *ctx, size_t k_block) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (k_block > CLFFN_MAX_GEMM_K_BLOCK) { return CLFFN_ERROR_INVALID_SIZE; }
    ctx->gemm_k_block = k_block;
    return CLFFN_SUCCESS;
}

size_t clffn_context_gemm_k_block(const clffn_context *ctx) { return ctx ? ctx->gemm_k_block : 0; }

clffn_status clffn_context_set_gemm_k_block_min_rows(clffn_context *ctx, size_t rows) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (rows > CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS) { return CLFFN_ERROR_INVALID_SIZE; }
    ctx->gemm_k_block_min_rows = rows;
    return CLFFN_SUCCESS;
}

size_t clffn_context_gemm_k_block_min_rows(const clffn_context *ctx) {
    return ctx ? ctx->gemm_k_block_min_rows : 0;
}

clffn_status clffn_context_set_gemv_max_tokens(clffn_context *ctx, size_t max_tokens) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (max_tokens > CLFFN_MAX_GEMV_TOKENS) { return CLFFN_ERROR_INVALID_SIZE; }
    ctx->gemv_max_tokens = max_tokens;
    return CLFFN_SUCCESS;
}

size_t clffn_context_gemv_max_tokens(const clffn_context *ctx) {
    return ctx ? ctx->gemv_max_tokens : 0;
}

clffn_status clffn_context_set_weight_layout(clffn_context *ctx, clffn_layout layout) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (layout != CLFFN_LAYOUT_OUT_IN && layout != CLFFN_LAYOUT_IN_OUT) {
        return CLFFN_ERROR_INVALID_LAYOUT;
    }
    ctx->weight_layout = layout;
    return CLFFN_SUCCESS;
}

clffn_layout clffn_context_weight_layout(const clffn_context *ctx) {
    return ctx ? ctx->weight_layout : CLFFN_DEFAULT_WEIGHT_LAYOUT;
}

clffn_status clffn_context_set_xgemm(clffn_context *ctx, size_t n, const char *const *names,
                                     const size_t *large, const size_t *few, size_t few_rows) {
    if (!ctx || ((large || few) && !names)) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (few && !large) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    if (few_rows > CLFFN_MAX_XGEMM_FEW_ROWS) { return CLFFN_ERROR_INVALID_SIZE; }
    clffn_xgemm_set l = {0, {0}}, f = {0, {0}};
    clffn_status st = large ? clffn__xgemm_set_from(n, names, large, &l) : CLFFN_SUCCESS;
    if (st == CLFFN_SUCCESS && few) { st = clffn__xgemm_set_from(n, names, few, &f); }
    if (st != CLFFN_SUCCESS) { return st; }
    ctx->xgemm = l;
    ctx->xgemm_few = f;
    ctx->xgemm_few_rows = f.have ? few_rows : 0;
    return CLFFN_SUCCESS;
}

size_t clffn_context_xgemm_few_rows(const clffn_context *ctx) {
    return ctx ? ctx->xgemm_few_rows : 0;
}

/* clffn_kernel_class's index, any other nonzero value taken as compressed */
static int kernel_class(int which) {
    if (which == CLFFN_KERNELS_QUANTIZED || which == CLFFN_KERNELS_COMPRESSED_LARGE ||
        which == CLFFN_KERNELS_BLOCKS) {
        return which;
    }
    return which ? CLFFN_KERNELS_COMPRESSED : CLFFN_KERNELS_F32;
}

clffn_status clffn_context_set_kernel_max_tokens(clffn_context *ctx, int which, size_t max_tokens) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const int c = kernel_class(which);
    ctx->kernel_max_tokens[c] = max_tokens;
    /* one crossover for every size and type until told apart */
    if (c == CLFFN_KERNELS_COMPRESSED) {
        ctx->kernel_max_tokens[CLFFN_KERNELS_COMPRESSED_LARGE] = max_tokens;
        ctx->kernel_max_tokens[CLFFN_KERNELS_BLOCKS] = max_tokens;
    }
    return CLFFN_SUCCESS;
}

size_t clffn_context_kernel_max_tokens(const clffn_context *ctx, int which) {
    return ctx ? ctx->kernel_max_tokens[kernel_class(which)] : 0;
}

clffn_status clffn_context_set_kernel_large_weights(clffn_context *ctx, size_t weights) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ctx->kernel_large_weights = weights;
    return CLFFN_SUCCESS;
}

size_t clffn_context_kernel_large_weights(const clffn_context *ctx) {
    return ctx ? ctx->kernel_large_weights : 0;
}

clffn_status clffn_context_set_quantized_inputs(clffn_context *ctx, int on) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ctx->quantized_inputs = on != 0;
    return CLFFN_SUCCESS;
}

int clffn_context_quantized_inputs(const clffn_context *ctx) {
    return ctx ? ctx->quantized_inputs : 0;
}

clffn_status clffn_context_set_fused_epilogues(clffn_context *ctx, int on) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ctx->fused_epilogues = on != 0;
    return CLFFN_SUCCESS;
}

int clffn_context_fused_epilogues(const clffn_context *ctx) {
    return ctx ? ctx->fused_epilogues : 0;
}

clffn_status clffn_context_set_dequant_tiles(clffn_context *ctx, int on) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ctx->dequant_tiles = on != 0;
    return CLFFN_SUCCESS;
}

int clffn_context_dequant_tiles(const clffn_context *ctx) { return ctx ? ctx->dequant_tiles : 0; }

clffn_status clffn_context_set_row_group_cols(clffn_context *ctx, size_t floats) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ctx->row_group_cols = floats;
    return CLFFN_SUCCESS;
}

size_t clffn_context_row_group_cols(const clffn_context *ctx) {
    return ctx ? ctx->row_group_cols : 0;
}

clffn_status clffn_context_set_shared_scratch(clffn_context *ctx, int on) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ctx->share_scratch = on != 0;
    return CLFFN_SUCCESS;
}

int clffn_context_shared_scratch(const clffn_context *ctx) { return ctx ? ctx->share_scratch : 0; }

clffn_status clffn_context_set_wgemv(clffn_context *ctx, const size_t params[CLFFN_WGEMV_PARAMS]) {
    if (!ctx) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!params) {
        wgemv_defaults(ctx, ctx->wgemv);
        return CLFFN_SUCCESS;
    }
    if (!clffn__wgemv_valid(params, ctx->max_wg)) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    memcpy(ctx->wgemv, params, sizeof ctx->wgemv);
    return CLFFN_SUCCESS;
}

void clffn_context_wgemv(const clffn_context *ctx, size_t params[CLFFN_WGEMV_PARAMS]) {
    if (!params) { return; }
    for (int i = 0; i < CLFFN_WGEMV_PARAMS; ++i) { params[i] = ctx ? ctx->wgemv[i] : 0; }
}
