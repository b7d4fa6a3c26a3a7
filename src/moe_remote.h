/* The experts of a mixture-of-experts layer that run on other contexts than the layer's
 * (moe_remote.c): one pass's forwards or backwards on their rows of the layer's buffers, moved
 * through the host, one thread per context while the layer's own context goes on. Below the
 * layer (moe.c), which decides where each expert runs. */
#ifndef CLFFN_MOE_REMOTE_H
#define CLFFN_MOE_REMOTE_H

#include "ffn.h"

#include <pthread.h>

/* An expert on another context (or, with an exchange, held elsewhere: f is then the layer's
 * idle stand-in) and its rows [row0, row0 + n) of the pass's buffers. */
typedef struct clffn_remote_job {
    clffn_ffn *f;
    size_t n, row0;
    clffn_status st;
    size_t expert;
} clffn_remote_job;

struct clffn_remote_group;

/* One pass: jobs[count], those of one context next to each other; in [rows, d_model] read
 * (xg, or dyg), out written (yg, or dxg), both the layer's. backward 0: each expert's
 * host-level forward of its rows (which keeps them as its x); 1: its backward at that x (the
 * last host-level forward, which must have had n rows, else NO_FORWARD), own: its weight and
 * bias gradients into its own buffers (added with accumulate), for the host level to download;
 * else none. The rest is the pass's state between start and finish. */
typedef struct clffn_remote_pass {
    clffn_remote_job *jobs;
    size_t count, rows, d_model;
    size_t tokens; /* the layer's, whose pass each forward is part of (clffn__forward_as_pass) */
    int backward, own, accumulate;
    cl_mem in, out;
    /* a partial layer's: every job's rows go through exchange(user, …) in finish, packed in job
     * order (rows_of: [experts], each job's count), and no thread starts */
    clffn_moe_exchange_fn exchange;
    void *user;
    size_t experts, *rows_of;
    float *host_in, *host_out;
    struct clffn_remote_group *groups;
    pthread_t *threads;
    size_t n_groups;
} clffn_remote_pass;

/* Reads in to the host (blocking on the layer's queue q) and starts a thread per context that
 * runs its jobs in turn; the caller's thread may enqueue its own work on q meanwhile. finish
 * must follow whatever start returned: it waits for the threads (or, with an exchange, flushes
 * q and calls it), writes each job's rows of out (blocking on q) and returns the first
 * failure's status (start's own included). */
clffn_status clffn__remote_start(clffn_remote_pass *p, cl_command_queue q);
clffn_status clffn__remote_finish(clffn_remote_pass *p, cl_command_queue q);

#endif
