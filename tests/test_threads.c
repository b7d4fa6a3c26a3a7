/* Threads: one clffn_context shared by 8 threads, each with its own clffn_ffn, 100 forwards
 * each, on the host level (the context's internal queue, shared) and on the device level (a
 * queue per thread). Every result must equal, bit for bit, the single-threaded result for the
 * same input: the kernels and GEMMs are deterministic, so any difference is interference. A
 * ninth thread flushes the first context's queue all the while.
 *
 * The same with two contexts on the device that want different CLBlast Xgemm sets, which are
 * CLBlast's, one per device for the whole process.
 *
 * One clffn_ffn shared by threads is not supported (clffn.h says so): it owns kernel arguments
 * and a workspace that a second caller would overwrite mid-flight. */
#include "common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define ROUNDS 100
#define TOK 9
#define DM 24
#define DF 40

typedef struct shared {
    clffn_context *ctx[2]; /* odd threads use the second; the same one unless two_sets */
    clffn_config cfg;
    test_weights w;
    float x[THREADS][TOK * DM];
    float want[THREADS][TOK * DM]; /* single-threaded results */
} shared;

typedef struct job {
    shared *s;
    clffn_context *ctx;
    int id;
    int device_level;
    int status;     /* first failing status, or CLFFN_SUCCESS */
    int mismatches; /* rounds whose result differed */
} job;

static void *worker(void *arg) {
    job *j = arg;
    shared *s = j->s;
    clffn_ffn *ffn = NULL;
    cl_command_queue q = NULL;
    cl_mem bx = NULL, by = NULL;
    float y[TOK * DM];
    int st = clffn_ffn_create(j->ctx, &s->cfg, &ffn);
    if (st == CLFFN_SUCCESS) {
        st = clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &s->w.host);
    }
    if (st == CLFFN_SUCCESS && j->device_level) {
        cl_int err;
        cl_context cl = clffn_context_cl_context(j->ctx);
        q = clCreateCommandQueue(cl, clffn_context_cl_device(j->ctx), 0, &err);
        if (err == CL_SUCCESS) {
            bx = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof s->x[0],
                                s->x[j->id], &err);
        }
        if (err == CL_SUCCESS) { by = clCreateBuffer(cl, CL_MEM_READ_WRITE, sizeof y, NULL, &err); }
        st = err;
    }
    for (int r = 0; r < ROUNDS && st == CLFFN_SUCCESS; ++r) {
        memset(y, 0, sizeof y);
        if (j->device_level) {
            st = clffn_forward(ffn, TOK, bx, 0, by, 0, q, NULL);
            if (st == CLFFN_SUCCESS) {
                st = clEnqueueReadBuffer(q, by, CL_TRUE, 0, sizeof y, y, 0, NULL, NULL);
            }
        } else {
            st = clffn_forward_host(ffn, TOK, s->x[j->id], TOK * DM, y, TOK * DM);
        }
        if (st == CLFFN_SUCCESS && memcmp(y, s->want[j->id], sizeof y) != 0) { ++j->mismatches; }
    }
    if (bx) { clReleaseMemObject(bx); }
    if (by) { clReleaseMemObject(by); }
    if (q) { clReleaseCommandQueue(q); }
    clffn_ffn_destroy(ffn);
    j->status = st;
    return NULL;
}

/* Flushes the context's queue until told to stop, as another user of that queue may at any
 * moment: a host-level call must not lose its wait to someone else's flush (rusticl 22.3 lost
 * blocking reads that way, docs/RELIABILITY.md). */
typedef struct flusher {
    cl_command_queue queue;
    atomic_int stop;
} flusher;

static void *flush_loop(void *arg) {
    flusher *f = arg;
    while (!atomic_load(&f->stop)) {
        clFlush(f->queue);
        sched_yield();
    }
    return NULL;
}

/* two_sets: two contexts on the device, each with two Xgemm sets (clffn_context_set_xgemm)
 * and a threshold that puts TOK tokens on the large side of one and the few side of the other,
 * so that the threads' products want different sets all the time and each must hold the device
 * while it applies its own and enqueues. */
static void run(int device_level, int two_sets) {
    shared *s = calloc(1, sizeof *s);
    cr_assert(s);
    s->ctx[0] = test_clblast_context();
    s->ctx[1] = two_sets ? test_clblast_context() : s->ctx[0];
    for (int k = 0; two_sets && k < 2; ++k) {
        ASSERT_OK(clffn_context_set_xgemm(s->ctx[k], 16, test_xgemm_names, test_xgemm_wide,
                                          test_xgemm_narrow, k ? 64 : 1));
    }
    s->cfg = clffn_config_default(DM, DF);
    s->cfg.gated = 1;
    s->cfg.activation = CLFFN_ACT_SILU;
    test_weights_make(&s->w, &s->cfg, CLFFN_LAYOUT_OUT_IN, 21);
    /* the single-threaded answers, each checked against the reference too */
    clffn_ffn *ffns[2] = {NULL, NULL};
    for (int k = 0; k < 2; ++k) {
        ASSERT_OK(clffn_ffn_create(s->ctx[k], &s->cfg, &ffns[k]));
        ASSERT_OK(clffn_ffn_upload_weights(ffns[k], CLFFN_LAYOUT_OUT_IN, &s->w.host));
    }
    for (int t = 0; t < THREADS; ++t) {
        fill_uniform(s->x[t], TOK * DM, -1.0f, 1.0f, 100 + (uint64_t)t);
        ASSERT_OK(clffn_forward_host(ffns[t % 2], TOK, s->x[t], TOK * DM, s->want[t], TOK * DM));
        double ref[TOK * DM];
        ASSERT_OK(clffn_reference_forward(&s->cfg, CLFFN_LAYOUT_OUT_IN, &s->w.host, TOK, s->x[t], 0,
                                          0, 0, ref, NULL));
        assert_close(s->want[t], ref, TOK * DM, TOL_RTOL, "single-threaded");
    }
    for (int k = 0; k < 2; ++k) { clffn_ffn_destroy(ffns[k]); }
    const unsigned long changes = clffn__xgemm_changes();

    pthread_t th[THREADS], fth;
    job jobs[THREADS];
    flusher fl = {clffn_context_queue(s->ctx[0]), 0};
    cr_assert_eq(pthread_create(&fth, NULL, flush_loop, &fl), 0);
    for (int t = 0; t < THREADS; ++t) {
        jobs[t] = (job){s, s->ctx[t % 2], t, device_level, CLFFN_SUCCESS, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, worker, &jobs[t]), 0);
    }
    for (int t = 0; t < THREADS; ++t) { pthread_join(th[t], NULL); }
    atomic_store(&fl.stop, 1);
    pthread_join(fth, NULL);
    for (int t = 0; t < THREADS; ++t) {
        cr_assert_eq(jobs[t].status, CLFFN_SUCCESS, "thread %d: %s", t,
                     clffn_status_string(jobs[t].status));
        cr_assert_eq(jobs[t].mismatches, 0,
                     "thread %d: %d of %d results differ from the "
                     "single-threaded ones",
                     t, jobs[t].mismatches, ROUNDS);
    }
    if (two_sets) { /* else the test would not be what it says */
        cr_assert_gt(clffn__xgemm_changes() - changes, 0, "the threads never switched sets");
        clffn_context_destroy(s->ctx[1]);
    }
    test_weights_free(&s->w);
    clffn_context_destroy(s->ctx[0]);
    free(s);
}

TestSuite(threads, .timeout = 600);

Test(threads, host_level_own_ffn) { run(0, 0); }
Test(threads, device_level_own_ffn_and_queue) { run(1, 0); }
Test(threads, two_contexts_switching_xgemm_sets) { run(0, 1); }
