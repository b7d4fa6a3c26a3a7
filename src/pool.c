/* A mixture-of-experts layer's weight pools (see pool.h). */
#include "pool.h"

#include "launch.h"

/* Sub-buffer origins must be multiples of the device's base address alignment; 256 bytes at
 * least keeps every slot's rows as aligned as a buffer of its own would be. */
static size_t slot_stride(const clffn_context *ctx, size_t bytes) {
    cl_uint bits = 0;
    clGetDeviceInfo(ctx->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL);
    size_t align = bits / 8 > 256 ? bits / 8 : 256;
    return bytes > SIZE_MAX - align ? 0 : (bytes + align - 1) / align * align;
}

/* Waits for the commands that may still read a slot about to be written over, each queue
 * flushed first (an event of an unflushed queue may never complete). */
static cl_int wait_for(const cl_event *events, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (!events[i]) { continue; }
        cl_command_queue q = NULL;
        if (clGetEventInfo(events[i], CL_EVENT_COMMAND_QUEUE, sizeof q, &q, NULL) == CL_SUCCESS &&
            q) {
            clFlush(q);
        }
        const cl_int err = clWaitForEvents(1, &events[i]);
        if (err != CL_SUCCESS) { return err; }
    }
    return CL_SUCCESS;
}

cl_mem clffn__pool_take(clffn_pools *pools, clffn_pool_kind kind, size_t slot, size_t bytes,
                        bool held, const cl_event *wait, size_t n, unsigned *gen, bool *over,
                        cl_int *err) {
    const clffn_context *ctx = pools->ctx;
    clffn_pool *p = &pools->kind[kind];
    *gen = 0, *over = false;
    const size_t stride = slot_stride(ctx, bytes);
    if (pools->off || !stride || stride > (size_t)ctx->max_alloc / pools->slots ||
        slot >= pools->slots) {
        return clffn__buffer(ctx, CL_MEM_READ_ONLY, bytes, err); /* not poolable */
    }
    if (!p->parent || p->bytes != bytes) {
        cl_mem m = clffn__buffer(ctx, CL_MEM_READ_ONLY, stride * pools->slots, err);
        if (*err != CL_SUCCESS) { return NULL; }
        if (p->parent) { clReleaseMemObject(p->parent); } /* its slots keep it while held */
        p->parent = m, p->bytes = bytes, p->stride = stride, p->gen = ++pools->next_gen;
        held = false;
    }
    if (held) {
        *err = wait_for(wait, n);
        if (*err == CL_SUCCESS && pools->busy) { *err = wait_for(pools->busy, 1); }
        if (*err != CL_SUCCESS) { return NULL; }
    }
    const cl_buffer_region region = {slot * p->stride, bytes};
    cl_mem sub = clCreateSubBuffer(p->parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, err);
    if (*err != CL_SUCCESS) { return NULL; }
    *gen = p->gen, *over = held;
    return sub;
}

void clffn__pools_release(clffn_pools *pools) {
    for (int k = 0; k < CLFFN_POOL_KINDS; ++k) {
        if (pools->kind[k].parent) { clReleaseMemObject(pools->kind[k].parent); }
        pools->kind[k].parent = NULL;
    }
}
