/* Launch helpers shared by the forward, the backward and the GEMM path. */
#include "launch.h"

#include "clffn_defs.h"

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
    const size_t ls = ctx->epilogue_local_size;
    size_t global[2] = {(columns + CLFFN_COLUMNS_PER_ITEM - 1) / CLFFN_COLUMNS_PER_ITEM, tokens};
    size_t local[2] = {ls, 1};
    if (ls) { global[0] = (global[0] + ls - 1) / ls * ls; }
    return clEnqueueNDRangeKernel(queue, k, 2, NULL, global, ls ? local : NULL, 0, NULL, event);
}
