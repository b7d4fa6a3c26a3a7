/* clffn-run --expert-parallel: a mixture-of-experts layer's experts split over MPI ranks;
 * built with MPI, beside tp.c.
 *
 *   mpirun -np N clffn-run --expert-parallel --weights W --input X.npy --output Y.npy
 *
 * Rank r holds the experts e with clffn_moe_expert_owner(e, E, N) = r and reads only theirs
 * from the mapped checkpoint. Rank 0 also holds the router and any shared expert, reads the
 * input, routes and combines every token (clffn_moe_create_partial); the others serve its
 * passes (clffn_mpi_moe_serve), each pass's rows going out and back with MPI_Alltoallv. Since
 * every expert runs on the rows a single process would give it, and the router's and shared
 * expert's sums run over the tokens in one process, outputs and gradients are a single
 * process's bits on devices that compute alike. Every step ends with an agreement, as in tp.c:
 * one failing rank makes all stop with its message, and no output file is written. */
#include "ranks.h"

#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* One rank's run. */
typedef struct ep_run {
    tp_rank R;
    ckpt ck;
    moe_layer L;
    clffn_moe_config mc;
    clffn_npy x, dy;
    float *router; /* rank 0's */
    clffn_context *ctx;
    clffn_moe *moe;             /* rank 0 */
    clffn_moe_holder *h;        /* the others */
    clffn_weight_arrays *grads; /* the others': their experts' gradients */
    float **gmem;
    size_t first, count; /* this rank's experts */
    clffn_mpi_moe m;
    int glue;
} ep_run;

/* This rank's experts: the owner rule's run. */
static void my_experts(ep_run *t) {
    t->first = t->L.E, t->count = 0;
    for (size_t e = 0; e < t->L.E; ++e) {
        if (clffn_moe_expert_owner(e, t->L.E, t->R.size) == t->R.rank) {
            t->first = t->count ? t->first : e;
            ++t->count;
        }
    }
}

/* The layer's tensors (every rank), the input (rank 0). */
static int ep_load(const options *o, ep_run *t) {
    int ok = run_moe_of(o, &t->ck) != NULL;
    if (!ok) {
        run_report("%s: layer %d is a dense FFN: --expert-parallel splits a mixture-of-experts "
                   "layer's experts (--tensor-parallel splits a dense one)",
                   o->weights, o->layer);
    }
    ok = ok && run_moe_resolve(o, &t->ck, &t->L) == 0;
    if (ok && (size_t)t->R.size > t->L.E) {
        run_report("%d ranks are more than the layer's %zu experts", t->R.size, t->L.E);
        ok = 0;
    }
    if (ok) {
        my_experts(t);
        t->mc = run_moe_config(o, &t->L);
    }
    if (ok && t->R.rank == 0) { ok = run_moe_load_input(o, &t->L, &t->x, &t->dy) == 0; }
    return tp_step(&t->R, ok);
}

/* Rank 0's layer: the router and the shared expert, its own experts. 0 or -1 (reported). */
static int setup_layer(const options *o, ep_run *t) {
    const moe_layer *L = &t->L;
    char err[CLFFN_IO_ERR];
    clffn_status s;
    if (!(t->router = malloc(moe_router_rows(L) * L->D * sizeof *t->router))) {
        run_report("out of memory");
        return -1;
    }
    if (ckpt_read_all_f32(&t->ck, L->router, t->router, err) != 0 ||
        (L->shared_gate &&
         ckpt_read_all_f32(&t->ck, L->shared_gate, t->router + L->E * L->D, err) != 0)) {
        run_report("%s: %s", o->weights, err);
        return -1;
    }
    if ((s = clffn_moe_create_partial(t->ctx, &t->mc, t->first, t->count, clffn_mpi_moe_exchange,
                                      &t->m, &t->moe)) != CLFFN_SUCCESS ||
        (s = clffn_moe_upload_router(t->moe, t->router, NULL)) != CLFFN_SUCCESS) {
        run_fail("setting up the layer", s);
        return -1;
    }
    return run_moe_upload(o, &t->ck, L, t->moe, NULL, run_moe_dtype(o, L), NULL);
}

/* Another rank's experts, and their gradient arrays for a backward. 0 or -1 (reported). */
static int setup_holder(const options *o, ep_run *t) {
    const moe_layer *L = &t->L;
    const clffn_dtype dtype = run_moe_dtype(o, L);
    clffn_status s = clffn_moe_holder_create(t->ctx, &t->mc, t->first, t->count, &t->h);
    if (s != CLFFN_SUCCESS) {
        run_fail("setting up this rank's experts", s);
        return -1;
    }
    t->grads = calloc(t->count, sizeof *t->grads);
    t->gmem = calloc(3 * t->count, sizeof *t->gmem);
    int ok = t->grads && t->gmem;
    const int matrices = dtype == CLFFN_DTYPE_F32 && o->grad_output;
    for (size_t i = 0; ok && matrices && i < 3 * t->count; ++i) {
        ok = (t->gmem[i] = malloc(L->F * L->D * sizeof(float))) != NULL;
    }
    for (size_t i = 0; ok && matrices && i < t->count; ++i) {
        float *const *g = &t->gmem[3 * i];
        t->grads[i] = (clffn_weight_arrays){g[0], NULL, g[1], NULL, g[2], NULL};
    }
    if (!ok) { run_report("out of memory"); }
    return ok && run_moe_upload(o, &t->ck, L, NULL, t->h, dtype, NULL) == 0 ? 0 : -1;
}

/* The weights' MiB a rank holds on its device: its experts' (rank 0: and the router's and the
 * shared expert's); and the whole layer's. */
static void weights_mib(const ep_run *t, double *mine, double *whole) {
    const moe_layer *L = &t->L;
    const double mib = 1.0 / 1048576.0;
    clffn_ffn *f =
        t->moe ? clffn_moe_expert(t->moe, t->first) : clffn_moe_holder_expert(t->h, t->first);
    const double per_expert = (double)clffn_ffn_weight_bytes(f);
    double shared = 0.0;
    if (t->moe && L->shared[0]) {
        shared = (double)clffn_ffn_weight_bytes(clffn_moe_expert(t->moe, L->E));
    }
    const double router = 4.0 * (double)(moe_router_rows(L) * L->D);
    *mine = mib * (per_expert * (double)t->count + (t->moe ? router + shared : 0.0));
    *whole = mib * (per_expert * (double)L->E + router + shared);
}

/* Device, glue, and this rank's part of the layer: the exit status all agree on. */
static int ep_setup(const options *o, ep_run *t) {
    t->R.code = EXIT_RUNTIME;
    int ok = tp_open_device(o, &t->R, &t->ctx) == 0;
    if (ok && clffn_mpi_moe_init(&t->m, &t->mc, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        run_report("setting up the MPI exchange failed");
        ok = 0;
    }
    t->glue = ok;
    if (ok) { ok = (t->R.rank == 0 ? setup_layer(o, t) : setup_holder(o, t)) == 0; }
    const int rc = tp_step(&t->R, ok);
    if (rc == 0 && o->verbose) {
        char name[128] = "?", line[TP_LINE];
        double mine, whole;
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        clffn_context_device_name(t->ctx, name, sizeof name);
        weights_mib(t, &mine, &whole);
        snprintf(line, sizeof line,
                 "rank %d/%d (node-local %d): %s, experts [%zu, %zu)%s, weights read %.1f of "
                 "%.1f MiB (%.0f%%), peak RSS %.1f MiB",
                 t->R.rank, t->R.size, t->R.local_rank, name, t->first, t->first + t->count,
                 t->R.rank == 0 ? " and the router" : "", mine, whole,
                 whole > 0 ? 100.0 * mine / whole : 0.0, (double)ru.ru_maxrss / 1024.0);
        tp_print_ranks(&t->R, line);
    }
    return rc;
}

/* --grad-output on rank 0: the other ranks' experts' gradients. 0 or -1 (reported). */
static int collect(void *user, int matrices, const clffn_weight_arrays *all) {
    ep_run *t = user;
    const clffn_status s = clffn_mpi_moe_collect_grads(&t->m, matrices, all);
    if (s == CLFFN_SUCCESS) { return 0; }
    run_report("gathering the experts' gradients from rank %d: %s", t->m.failed_rank,
               clffn_status_string(s));
    return -1;
}

/* Rank 0 runs the layer (the others' experts answering), then releases them; the exit status
 * all agree on. */
static int ep_run_layer(const options *o, ep_run *t) {
    int ok = 1;
    if (t->R.rank == 0) {
        const moe_away away = {t->R.size, collect, t};
        ok = run_moe_layer(o, &t->L, t->moe, &t->mc, t->router, NULL, &t->x, &t->dy, &away) == 0;
        if (!ok && t->m.failed_rank > 0) {
            fprintf(stderr, "clffn-run: rank %d's experts failed the pass\n", t->m.failed_rank);
        }
        clffn_mpi_moe_stop(&t->m);
    } else if (clffn_mpi_moe_serve(&t->m, t->h, t->grads) != MPI_SUCCESS) {
        run_report("serving rank 0's passes failed");
        ok = 0;
    }
    return tp_step(&t->R, ok);
}

int run_expert_parallel(const options *o) {
    ep_run t;
    memset(&t, 0, sizeof t);
    int opened;
    int rc = tp_begin(o, &t.R, &t.ck, &opened);
    if (rc == 0 && (rc = ep_load(o, &t)) == 0 && (rc = ep_setup(o, &t)) == 0) {
        rc = ep_run_layer(o, &t);
    }
    for (size_t i = 0; t.gmem && i < 3 * t.count; ++i) { free(t.gmem[i]); }
    free(t.gmem), free(t.grads), free(t.router), free(t.L.m);
    if (t.glue) { clffn_mpi_moe_free(&t.m); }
    clffn_moe_destroy(t.moe);
    clffn_moe_holder_destroy(t.h);
    clffn_context_destroy(t.ctx);
    clffn_npy_free(&t.x);
    clffn_npy_free(&t.dy);
    if (opened) { ckpt_close(&t.ck); }
    return rc;
}
