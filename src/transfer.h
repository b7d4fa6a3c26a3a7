/* Host transfers and queue waits that hold on every OpenCL implementation. */
#ifndef CLFFN_TRANSFER_H
#define CLFFN_TRANSFER_H

#include "common.h"

/* Host transfers that return only once done, by waiting on their own event. On Mesa's rusticl
 * 22.3 a blocking read, write or map, and clFinish, wait only for the commands of the queue not
 * yet flushed: after a clFlush, a clWaitForEvents, or another thread's flush of the same queue,
 * they return at once while the copy is still to come, into or out of host memory the caller
 * may already reuse (docs/RELIABILITY.md). A command's own event holds on every device. Each
 * returns OpenCL's status, a failed command's own where the wait saw one. */
cl_int clffn__read(cl_command_queue q, cl_mem m, size_t offset, size_t bytes, void *dst,
                   cl_uint n_wait, const cl_event *wait);
cl_int clffn__write(cl_command_queue q, cl_mem m, size_t offset, size_t bytes, const void *src);
/* Maps [0, bytes) of m for writing all of it, and unmaps it, each waited for as above. */
void *clffn__map_write(cl_command_queue q, cl_mem m, size_t bytes, cl_int *err);
cl_int clffn__unmap(cl_command_queue q, cl_mem m, void *p);

/* Waits for ev where err is CL_SUCCESS, then releases ev (NULL: none); returns err, else the
 * wait's status, a failed command's own where there is one. */
cl_int clffn__wait(cl_int err, cl_event ev);

/* clFinish(q) that holds on rusticl too (above): waits for a marker's event, which completes
 * after everything enqueued on the in-order q before it. */
cl_int clffn__finish(cl_command_queue q);

#endif
