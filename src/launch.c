/* Launch helpers shared by the forward, the backward and the GEMM path. */
#include "launch.h"

#include "clffn_defs.h"

#include <string.h>

void clffn__arg(clffn_args *a, size_t size, const void *value) {
    if (a->err == CL_SUCCESS) { a->err = clSetKernelArg(a->kernel, a->next, size, value); }
    a->next++;
}

cl_int clffn__args_end(const clffn_args *a) {
    if (a->err != CL_SUCCESS) { return a->err; }
    cl_uint n = 0;
    const cl_int err = clGetKernelInfo(a->kernel, CL_KERNEL_NUM_ARGS, sizeof n, &n, NULL);
    if (err != CL_SUCCESS) { return err; }
    return n == a->next ? CL_SUCCESS : CL_INVALID_KERNEL_ARGS;
}

cl_mem clffn__buffer(const clffn_context *ctx, cl_mem_flags flags, size_t bytes, cl_int *err) {
    return clCreateBuffer(ctx->context, flags | (ctx->cpu ? CL_MEM_ALLOC_HOST_PTR : 0), bytes, NULL,
                          err);
}

static void CL_CALLBACK release_mem(cl_event event, cl_int status, void *mem) {
    clReleaseMemObject((cl_mem)mem);
}

void clffn__release_mem(cl_mem *m) {
    if (*m) { clReleaseMemObject(*m); }
    *m = NULL;
}

void clffn__release_when_done(cl_command_queue queue, cl_mem mem) {
    if (!mem) { return; }
    cl_event marker = NULL;
    if (queue && clEnqueueMarkerWithWaitList(queue, 0, NULL, &marker) == CL_SUCCESS) {
        if (clSetEventCallback(marker, CL_COMPLETE, release_mem, mem) == CL_SUCCESS) {
            clReleaseEvent(marker);
            return;
        }
        clWaitForEvents(1, &marker);
        clReleaseEvent(marker);
    } else if (queue) {
        clFinish(queue);
    }
    clReleaseMemObject(mem);
}

/* The tile of the host-side transposition: two 64 × 64 float tiles (32 KiB) stay in L1/L2. */
#define WEIGHT_TILE 64

cl_int clffn__write_weight(cl_command_queue queue, cl_mem m, clffn_layout kept, clffn_layout given,
                           size_t out, size_t in, const float *const parts[2]) {
    const size_t P = parts[1] ? 2 : 1, n = out * in;
    cl_int err;
    float *dst = clffn__map_write(queue, m, P * n * sizeof(float), &err);
    if (err != CL_SUCCESS) { return err; }
    /* element (o, i) of part p: at o·so + i·si in the source, base + o·do_ + i·di in m */
    const int src_oi = given == CLFFN_LAYOUT_OUT_IN, dst_oi = kept == CLFFN_LAYOUT_OUT_IN;
    const size_t so = src_oi ? in : 1, si = src_oi ? 1 : out;
    const size_t do_ = dst_oi ? in : 1, di = dst_oi ? 1 : P * out;
    for (size_t p = 0; p < P; ++p) {
        const float *src = parts[p];
        float *d = dst + (dst_oi ? p * n : p * out);
        for (size_t o0 = 0; o0 < out; o0 += WEIGHT_TILE) {
            const size_t o1 = o0 + WEIGHT_TILE < out ? o0 + WEIGHT_TILE : out;
            for (size_t i0 = 0; i0 < in; i0 += WEIGHT_TILE) {
                const size_t i1 = i0 + WEIGHT_TILE < in ? i0 + WEIGHT_TILE : in;
                /* the inner loop runs along m's rows, so the stores are contiguous */
                if (dst_oi) {
                    for (size_t o = o0; o < o1; ++o) {
                        for (size_t i = i0; i < i1; ++i) { d[o * do_ + i] = src[o * so + i * si]; }
                    }
                } else {
                    for (size_t i = i0; i < i1; ++i) {
                        for (size_t o = o0; o < o1; ++o) { d[o + i * di] = src[o * so + i * si]; }
                    }
                }
            }
        }
    }
    return clffn__unmap(queue, m, dst);
}

clffn_status clffn__check_buffer(const clffn_context *ctx, cl_mem mem, size_t offset,
                                 size_t count) {
    if (!mem) { return CLFFN_ERROR_NULL_ARGUMENT; }
    cl_context mctx = NULL;
    size_t size = 0;
    cl_int err = clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof mctx, &mctx, NULL);
    if (err == CL_SUCCESS) { err = clGetMemObjectInfo(mem, CL_MEM_SIZE, sizeof size, &size, NULL); }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    if (mctx != ctx->context) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    size_t bytes;
    if (offset > SIZE_MAX - count || !clffn__mul_ok(offset + count, sizeof(float), &bytes)) {
        return CLFFN_ERROR_SIZE_OVERFLOW;
    }
    return bytes <= size ? CLFFN_SUCCESS : CLFFN_ERROR_BUFFER_TOO_SMALL;
}

clffn_status clffn__check_queue(const clffn_context *ctx, cl_command_queue queue) {
    cl_context qctx = NULL;
    cl_device_id qdev = NULL;
    cl_command_queue_properties props = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qctx, &qctx, NULL);
    if (err == CL_SUCCESS) {
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qdev, &qdev, NULL);
    }
    if (err == CL_SUCCESS) {
        err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    /* CLBlast enqueues several kernels per GEMM and relies on in-order execution */
    if (qctx != ctx->context || qdev != ctx->device ||
        (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
        return CLFFN_ERROR_INVALID_QUEUE;
    }
    return CLFFN_SUCCESS;
}

cl_int clffn__launch_columns(const clffn_context *ctx, cl_kernel k, size_t columns, size_t tokens,
                             cl_command_queue queue, cl_event *event) {
    const size_t global[2] = {(columns + CLFFN_COLUMNS_PER_ITEM - 1) / CLFFN_COLUMNS_PER_ITEM,
                              tokens};
    return clffn__enqueue_items(&ctx->programs, queue, k, 2, global, event);
}
