/* An expert of a mixture-of-experts layer on another context than the layer's
 * (clffn_moe_create_split: the router, the routing, the shared expert and the combine on the
 * first context, each routed expert on the context that owns it). It gets its gathered rows
 * through the host and sends its outputs back the same way (the contexts may share no buffer):
 *
 *   xg rows [o_e, o_e + n_e) ─read─► host ─expert e's host-level forward on its context─► host
 *   ─write─► yg rows [o_e, o_e + n_e)
 *
 * and the backward likewise with dyg and dxg, the expert's x being what its host-level forward
 * kept; each other context's experts run in turn on a thread of its own, and only their rows
 * cross to the host. It runs the same kernels on the same rows as an unsplit layer, so on
 * devices that compute alike the results are the same bits. */
#include "moe_remote.h"

#include "launch.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Job j's rows: its expert's host-level forward from host_in into host_out, or its backward
 * (dy rows from host_in, through its own buffers, dx rows into host_out). */
static clffn_status run_job(const clffn_remote_pass *p, const clffn_remote_job *j) {
    clffn_ffn *f = j->f;
    const size_t nd = j->n * f->cfg.d_model, off = j->row0 * f->cfg.d_model;
    const float *in = p->host_in + off;
    float *out = p->host_out + off;
    if (!p->backward) { return clffn__forward_host_as_pass(f, j->n, p->tokens, in, nd, out, nd); }
    if (f->last_tokens != j->n || !f->ws.io_x || f->ws.io_tokens < j->n) {
        return CLFFN_ERROR_NO_FORWARD; /* its host-level forward holds x */
    }
    cl_command_queue fq = f->ctx->queue;
    const size_t bytes = nd * sizeof(float);
    clffn_status st = clffn__workspace_host_backward(&f->ws, f->ctx, &f->cfg, j->n,
                                                     p->own && f->w1.dtype == CLFFN_DTYPE_F32);
    if (st == CLFFN_SUCCESS) { st = (clffn_status)clffn__write(fq, f->ws.io_dy, 0, bytes, in); }
    clffn_device_weights none;
    memset(&none, 0, sizeof none);
    const clffn_device_weights g = p->own ? clffn__host_grads_device(f) : none;
    if (st == CLFFN_SUCCESS) {
        st = clffn_backward(f, j->n, f->ws.io_x, 0, f->ws.io_dy, 0, f->ws.io_dx, 0, &g,
                            p->accumulate, fq, NULL);
    }
    if (st == CLFFN_SUCCESS) {
        st = (clffn_status)clffn__read(fq, f->ws.io_dx, 0, bytes, out, 0, NULL);
    }
    if (st != CLFFN_SUCCESS) { clffn__finish(fq); }
    return st;
}

/* A thread's share: the jobs [first, first + count), one context's, in turn. */
typedef struct clffn_remote_group {
    const clffn_remote_pass *pass;
    clffn_remote_job *first;
    size_t count;
} group;

/* How many rows the group's experts have, and in *first where the first one starts (floats
 * into the pass's buffers): one run, since a context owns consecutive experts and the rows
 * follow the experts' order. */
static size_t rows_of(const group *g, size_t *first) {
    const clffn_remote_job *a = g->first, *z = g->first + g->count - 1;
    *first = a->row0 * g->pass->d_model;
    return z->row0 + z->n - a->row0;
}

static void *run_group(void *arg) {
    group *g = arg;
    for (size_t i = 0; i < g->count; ++i) { g->first[i].st = run_job(g->pass, &g->first[i]); }
    return NULL;
}

/* A partial layer's jobs' rows between the pass's buffer m and the host, packed in job order
 * (the exchange's layout): one transfer per run of jobs whose rows are adjacent in m, so at most
 * two (the experts held elsewhere are those below and above the layer's own). */
static clffn_status move_packed(const clffn_remote_pass *p, cl_command_queue q, cl_mem m,
                                float *host, bool to_host) {
    cl_int err = CL_SUCCESS;
    for (size_t i = 0, k; i < p->count && err == CL_SUCCESS; i = k) {
        const clffn_remote_job *a = &p->jobs[i];
        size_t n = a->n;
        for (k = i + 1; k < p->count && p->jobs[k].row0 == a->row0 + n; ++k) { n += p->jobs[k].n; }
        const size_t off = a->row0 * p->d_model * sizeof(float),
                     bytes = n * p->d_model * sizeof(float);
        err = to_host ? clffn__read(q, m, off, bytes, host, 0, NULL)
                      : clffn__write(q, m, off, bytes, host);
        host += n * p->d_model;
    }
    return (clffn_status)err;
}

/* A partial layer's pass begins: the jobs' rows read to the host and rows_of filled. No
 * thread: finish calls the exchange. */
static clffn_status exchange_start(clffn_remote_pass *p, cl_command_queue q) {
    for (size_t i = 0; i < p->count; ++i) { p->rows_of[p->jobs[i].expert] = p->jobs[i].n; }
    const clffn_status st = move_packed(p, q, p->in, p->host_in, true);
    for (size_t i = 0; i < p->count; ++i) { p->jobs[i].st = st; }
    return st;
}

/* The exchange (with the layer's own experts flushed to its device first, to run meanwhile),
 * then every job's output rows written back where its rows came from. */
static clffn_status exchange_finish(clffn_remote_pass *p, cl_command_queue q) {
    const int pass = !p->backward ? CLFFN_MOE_PASS_WITH_TOKENS(p->tokens)
                                  : CLFFN_MOE_PASS_BACKWARD | (p->own ? CLFFN_MOE_PASS_GRADS : 0) |
                                        (p->own && p->accumulate ? CLFFN_MOE_PASS_ACCUMULATE : 0);
    clffn_status st = CLFFN_SUCCESS;
    for (size_t i = 0; i < p->count && st == CLFFN_SUCCESS; ++i) { st = p->jobs[i].st; }
    if (st == CLFFN_SUCCESS) { st = (clffn_status)clFlush(q); }
    if (st == CLFFN_SUCCESS) {
        st = p->exchange(p->user, pass, p->rows_of, p->host_in, p->host_out);
    }
    return st == CLFFN_SUCCESS ? move_packed(p, q, p->out, p->host_out, false) : st;
}

clffn_status clffn__remote_start(clffn_remote_pass *p, cl_command_queue q) {
    p->threads = NULL, p->groups = NULL, p->host_in = NULL, p->n_groups = 0, p->rows_of = NULL;
    if (p->exchange) { /* called on every pass, rows or none: its holders keep step */
        const size_t bytes = p->rows * p->d_model * sizeof(float);
        p->host_in = malloc(2 * bytes + sizeof(float));
        p->rows_of = calloc(p->experts, sizeof *p->rows_of);
        if (!p->host_in || !p->rows_of) {
            free(p->host_in), free(p->rows_of);
            p->host_in = NULL, p->rows_of = NULL;
            for (size_t i = 0; i < p->count; ++i) {
                p->jobs[i].st = CLFFN_ERROR_OUT_OF_HOST_MEMORY;
            }
            return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
        }
        p->host_out = p->host_in + p->rows * p->d_model;
        return exchange_start(p, q);
    }
    if (p->count == 0) { return CLFFN_SUCCESS; }
    const size_t bytes = p->rows * p->d_model * sizeof(float);
    p->host_in = malloc(2 * bytes);
    p->groups = calloc(p->count, sizeof *p->groups);
    p->threads = calloc(p->count, sizeof *p->threads);
    if (!p->host_in || !p->groups || !p->threads) {
        free(p->host_in), free(p->groups), free(p->threads);
        p->host_in = NULL, p->groups = NULL, p->threads = NULL;
        for (size_t i = 0; i < p->count; ++i) { p->jobs[i].st = CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    p->host_out = p->host_in + p->rows * p->d_model;
    for (size_t i = 0; i < p->count;) { /* one group per run of the same context */
        size_t n = 1;
        while (i + n < p->count && p->jobs[i + n].f->ctx == p->jobs[i].f->ctx) { ++n; }
        group *g = &p->groups[p->n_groups++];
        g->pass = p, g->first = &p->jobs[i], g->count = n;
        i += n;
    }
    clffn_status st = CLFFN_SUCCESS;
    for (size_t i = 0; i < p->n_groups && st == CLFFN_SUCCESS; ++i) { /* the groups' rows alone */
        size_t off;
        const size_t len = rows_of(&p->groups[i], &off) * p->d_model;
        st = (clffn_status)clffn__read(q, p->in, off * sizeof(float), len * sizeof(float),
                                       p->host_in + off, 0, NULL);
    }
    for (size_t i = 0; i < p->count; ++i) { p->jobs[i].st = st; } /* none runs on failure */
    for (size_t i = 0; i < p->n_groups; ++i) {
        group *g = &p->groups[i];
        if (st != CLFFN_SUCCESS) {
            g->count = 0; /* not started, not joined */
        } else if (pthread_create(&p->threads[i], NULL, run_group, g) != 0) {
            run_group(g); /* no thread to be had: here, now */
            g->count = 0;
        }
    }
    return st;
}

clffn_status clffn__remote_finish(clffn_remote_pass *p, cl_command_queue q) {
    if (p->exchange) {
        clffn_status st = CLFFN_SUCCESS;
        if (p->host_in) { st = exchange_finish(p, q); }
        for (size_t i = 0; !p->host_in && i < p->count && st == CLFFN_SUCCESS; ++i) {
            st = p->jobs[i].st;
        }
        free(p->host_in), free(p->rows_of);
        p->host_in = p->host_out = NULL, p->rows_of = NULL;
        return st;
    }
    for (size_t i = 0; i < p->n_groups; ++i) {
        if (p->groups[i].count) { pthread_join(p->threads[i], NULL); }
    }
    clffn_status st = CLFFN_SUCCESS;
    for (size_t i = 0; i < p->count && st == CLFFN_SUCCESS; ++i) { st = p->jobs[i].st; }
    for (size_t i = 0; i < p->n_groups && st == CLFFN_SUCCESS; ++i) {
        size_t off;
        const size_t len = rows_of(&p->groups[i], &off) * p->d_model;
        st = (clffn_status)clffn__write(q, p->out, off * sizeof(float), len * sizeof(float),
                                        p->host_out + off);
    }
    free(p->host_in), free(p->groups), free(p->threads);
    p->host_in = p->host_out = NULL, p->groups = NULL, p->threads = NULL, p->n_groups = 0;
    return st;
}
