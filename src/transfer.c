/* Host transfers and queue waits (transfer.h): each waits on its own command's event. */
#include "transfer.h"

cl_int clffn__wait(cl_int err, cl_event ev) {
    if (err == CL_SUCCESS && ev) {
        err = clWaitForEvents(1, &ev);
        cl_int status = CL_COMPLETE;
        if (err == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST &&
            clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL) ==
                CL_SUCCESS &&
            status < 0) {
            err = status;
        }
    }
    if (ev) { clReleaseEvent(ev); }
    return err;
}

cl_int clffn__read(cl_command_queue q, cl_mem m, size_t offset, size_t bytes, void *dst,
                   cl_uint n_wait, const cl_event *wait) {
    cl_event ev = NULL;
    const cl_int err = clEnqueueReadBuffer(q, m, CL_FALSE, offset, bytes, dst, n_wait, wait, &ev);
    return clffn__wait(err, ev);
}

cl_int clffn__write(cl_command_queue q, cl_mem m, size_t offset, size_t bytes, const void *src) {
    cl_event ev = NULL;
    const cl_int err = clEnqueueWriteBuffer(q, m, CL_FALSE, offset, bytes, src, 0, NULL, &ev);
    return clffn__wait(err, ev);
}

void *clffn__map_write(cl_command_queue q, cl_mem m, size_t bytes, cl_int *err) {
    cl_event ev = NULL;
    void *p = clEnqueueMapBuffer(q, m, CL_FALSE, CL_MAP_WRITE_INVALIDATE_REGION, 0, bytes, 0, NULL,
                                 &ev, err);
    *err = clffn__wait(*err, ev);
    if (*err != CL_SUCCESS && p) { /* mapped, then failed: give the mapping back */
        clffn__unmap(q, m, p);
        p = NULL;
    }
    return p;
}

cl_int clffn__unmap(cl_command_queue q, cl_mem m, void *p) {
    cl_event ev = NULL;
    const cl_int err = clEnqueueUnmapMemObject(q, m, p, 0, NULL, &ev);
    return clffn__wait(err, ev);
}

cl_int clffn__finish(cl_command_queue q) {
    cl_event ev = NULL;
    const cl_int err = clEnqueueMarkerWithWaitList(q, 0, NULL, &ev);
    return clffn__wait(err, ev);
}
