/* Launching clffn's own kernels: buffers, argument setting, the element-wise NDRange, and the
 * checks every device-level entry point makes before it enqueues anything. */
#ifndef CLFFN_LAUNCH_H
#define CLFFN_LAUNCH_H

#include "context.h"
#include "transfer.h"

/* A kernel's arguments, set in order: each clffn__arg() takes the next index, so the order of
 * the calls is the kernel's parameter list. The first failure sticks; clffn__args_end() returns
 * it, or CL_INVALID_KERNEL_ARGS when the calls did not cover every parameter. */
typedef struct clffn_args {
    cl_kernel kernel;
    cl_uint next;
    cl_int err;
} clffn_args;

static inline clffn_args clffn__args(cl_kernel kernel) {
    clffn_args a = {kernel, 0, kernel ? CL_SUCCESS : CL_INVALID_KERNEL};
    return a;
}
void clffn__arg(clffn_args *a, size_t size, const void *value);
cl_int clffn__args_end(const clffn_args *a);

/* The next argument of a, by value. */
#define CLFFN_ARG(a, v) clffn__arg(&(a), sizeof(v), &(v))

/* clCreateBuffer for clffn's own buffers. On a CPU device they are made with
 * CL_MEM_ALLOC_HOST_PTR (all its memory is host memory anyway): POCL then takes the memory at
 * creation, so running out is a status here, where a plain buffer is taken lazily at its first
 * use and POCL aborts the process when that fails. */
cl_mem clffn__buffer(const clffn_context *ctx, cl_mem_flags flags, size_t bytes, cl_int *err);

/* Releases a buffer that commands already enqueued on queue may still use, once they have
 * completed: a marker's completion callback releases it. Needed where clffn replaces a buffer it
 * grows (workspace, GEMM scratch) while an earlier asynchronous call may still run on it: POCL
 * frees a released buffer under a CLBlast GEMM still queued on it (the result is garbage).
 * Without a marker, waits for the queue and releases it now. */
void clffn__release_when_done(cl_command_queue queue, cl_mem mem);

/* Releases *m if it is a buffer, and empties it. */
void clffn__release_mem(cl_mem *m);

/* Writes a linear layer's weight into m from host arrays: parts[0], and parts[1] (V, stacked
 * after W1; NULL for one part), each out × in, given in layout `given`, kept in layout `kept`,
 * the parts stacked as clffn_device_weights describes: [P·out, in] (OUT_IN), or [in, P·out]
 * with each row holding the parts' out values in turn (IN_OUT). Transposed on the host in
 * tiles that stay in cache when the layouts differ. One mapped transfer of the whole of m
 * (write-invalidate), not one write per part: zero-copy on a CPU device, and every byte of m
 * is written by a single host store, which a strict simulator tracks (docs/RELIABILITY.md).
 * Blocks until written. */
cl_int clffn__write_weight(cl_command_queue queue, cl_mem m, clffn_layout kept, clffn_layout given,
                           size_t out, size_t in, const float *const parts[2]);

/* mem belongs to ctx and holds floats [offset, offset + count): NULL_ARGUMENT,
 * INVALID_ARGUMENT (another context), SIZE_OVERFLOW, BUFFER_TOO_SMALL, OpenCL's. */
clffn_status clffn__check_buffer(const clffn_context *ctx, cl_mem mem, size_t offset, size_t count);

/* The queue is in-order and on ctx's context and device, else INVALID_QUEUE. */
clffn_status clffn__check_queue(const clffn_context *ctx, cl_command_queue queue);

/* Enqueues an element-wise kernel over a [tokens, columns] tensor: NDRange
 * (ceil(columns / CLFFN_COLUMNS_PER_ITEM), tokens) through clffn__enqueue_items. */
cl_int clffn__launch_columns(const clffn_context *ctx, cl_kernel k, size_t columns, size_t tokens,
                             cl_command_queue queue, cl_event *event);

#endif
