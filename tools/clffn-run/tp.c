/* clffn-run --tensor-parallel: one checkpoint layer split over MPI ranks; built when CMake
 * found MPI, the only room of clffn-run that knows it.
 *
 *   mpirun -np N clffn-run --tensor-parallel --weights W.safetensors --input X.npy --output Y.npy
 *
 * Rank r of N holds hidden slice r of clffn_shard_range: it reads only that slice of W1, V, b1,
 * bv and W2 from the mapped checkpoint (b2 on rank 0), runs its shard on the device its
 * node-local rank picks, and the partial outputs are summed by MPI_Allreduce; rank 0 writes the
 * output (atomically, as every clffn-run output). With --grad-output/--grads-out, the slices'
 * gradients are gathered on rank 0 into the file a single process writes. Every step ends with
 * an agreement: if any rank failed, all stop, rank 0 prints the first failing rank's one-line
 * message, every rank exits non-zero, and no output file is written. */
#include "ranks.h"

#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int tp_step(const tp_rank *R, int ok) {
    char msg[512];
    int code = EXIT_RUNTIME, who = 0;
    if (clffn_mpi_agree(ok, R->code, run_captured_report(), msg, sizeof msg, &code, &who,
                        MPI_COMM_WORLD)) {
        return 0;
    }
    if (R->rank == 0) {
        if (R->size > 1) {
            fprintf(stderr, "clffn-run: rank %d: %s\n", who, msg[0] ? msg : "failed");
        } else {
            fprintf(stderr, "clffn-run: %s\n", msg[0] ? msg : "failed");
        }
    }
    return code ? code : EXIT_RUNTIME;
}

int tp_open_device(const options *o, const tp_rank *R, clffn_context **ctx) {
    if (o->device) { return run_open_device(o, o->device, ctx); }
    size_t n = 0;
    clffn_status s = clffn_devices_list(NULL, 0, &n);
    clffn_device_info *all = s == CLFFN_SUCCESS && n ? calloc(n, sizeof *all) : NULL;
    if (s == CLFFN_SUCCESS && n && !all) { s = CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    if (all) { s = clffn_devices_list(all, n, &n); }
    char spec[32] = "";
    if (s == CLFFN_SUCCESS) {
        size_t gpus = 0, usable = 0;
        for (size_t i = 0; i < n; ++i) {
            gpus += all[i].supported && all[i].type == CL_DEVICE_TYPE_GPU;
            usable += all[i].supported != 0;
        }
        const size_t pool = gpus ? gpus : usable;
        size_t want = pool ? (size_t)R->local_rank % pool : 0;
        for (size_t i = 0; pool && i < n && !spec[0]; ++i) {
            const int in_pool = all[i].supported && (!gpus || all[i].type == CL_DEVICE_TYPE_GPU);
            if (in_pool && want-- == 0) {
                snprintf(spec, sizeof spec, "%u:%u", all[i].platform_index, all[i].device_index);
            }
        }
    }
    free(all);
    if (s != CLFFN_SUCCESS && s != CLFFN_PLATFORM_NOT_FOUND) {
        run_fail("listing the devices", s);
        return -1;
    }
    return run_open_device(o, spec[0] ? spec : NULL, ctx);
}

/* A slice's gradients as one packed block, the layout every rank sends and rank 0 unpacks:
 * W1, V (gated), W2 slices [S, D] each (with matrices: weights kept in f32), then b1 and bv [S]
 * where the config has them. Returns the arrays within base (b2 NULL: only shard 0 has it,
 * outside the block) and *n, the block's length in floats; base may be NULL to measure. */
static clffn_weight_arrays packed_slice(const clffn_config *c, int matrices, float *base, size_t S,
                                        size_t D, size_t *n) {
    clffn_weight_arrays a = {NULL, NULL, NULL, NULL, NULL, NULL};
    size_t at = 0;
#define TAKE(field, len, on) \
    if (on) { a.field = base ? base + at : NULL, at += (len); }
    TAKE(w1, S * D, matrices)
    TAKE(v, S * D, matrices && c->gated)
    TAKE(w2, S * D, matrices)
    TAKE(b1, S, c->bias1)
    TAKE(bv, S, c->gated && c->bias_gate)
#undef TAKE
    *n = at;
    return a;
}

/* Rank r's slice (packed_slice's arrays) into the layer's full arrays: every tensor, or with
 * weights kept compressed the biases alone (b1, bv: hidden units [f0, f1); b2 whole). */
static void place(const clffn_config *c, int matrices, clffn_layout layout, size_t f0, size_t f1,
                  const clffn_weight_arrays *sl, const clffn_weight_arrays *full) {
    if (matrices) {
        clffn_shard_place(c, layout, f0, f1, sl, full, 0);
        return;
    }
    if (sl->b1) { memcpy(full->b1 + f0, sl->b1, (f1 - f0) * sizeof(float)); }
    if (sl->bv) { memcpy(full->bv + f0, sl->bv, (f1 - f0) * sizeof(float)); }
    if (sl->b2) { memcpy(full->b2, sl->b2, c->d_model * sizeof(float)); }
}

/* The slices' gradients (mine: packed_slice's block, b2 beside it on rank 0), gathered on rank
 * 0 and placed into the layer's full arrays (one per tensor, in its own shape), then written as
 * a single process writes them. Called by all. */
static int tp_gather_grads(const options *o, const tp_rank *R, const layer *Ly,
                           const clffn_config *c, int matrices, float *mine, size_t mine_n,
                           const float *mine_b2, const clffn_npy *x, const float *dx) {
    const size_t D = (size_t)Ly->D, F = (size_t)Ly->F;
    size_t *counts = calloc((size_t)R->size, sizeof *counts);
    float *all = NULL;
    const ckpt_tensor *const t[6] = {Ly->w1, Ly->b1, Ly->v, Ly->bv, Ly->w2, Ly->b2};
    float *arr[6] = {NULL};
    int ok = counts != NULL;
    size_t total = 0;
    for (int r = 0; ok && r < R->size; ++r) {
        size_t f0, f1;
        clffn_shard_range(F, r, R->size, &f0, &f1);
        packed_slice(c, matrices, NULL, f1 - f0, D, &counts[r]);
        total += counts[r];
    }
    if (ok && R->rank == 0) {
        ok = (all = malloc((total ? total : 1) * sizeof *all)) != NULL;
        for (int i = 0; ok && i < 6; ++i) {
            const int matrix = i == 0 || i == 2 || i == 4;
            ok = !t[i] || (matrix && !matrices) ||
                 (arr[i] = calloc((size_t)t[i]->numel, sizeof(float)));
        }
    }
    if (!ok) { run_report("out of memory gathering the gradients"); }
    int rc = tp_step(R, ok);
    if (rc == 0 && clffn_mpi_gather(mine, mine_n, all, counts, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        rc = EXIT_RUNTIME; /* MPI's default handler has aborted the job before this */
    }
    if (rc == 0 && R->rank == 0) {
        const clffn_weight_arrays full = {arr[0], arr[1], arr[2], arr[3], arr[4], arr[5]};
        float *p = all;
        for (int r = 0; r < R->size; ++r) {
            size_t f0, f1, n;
            clffn_shard_range(F, r, R->size, &f0, &f1);
            clffn_weight_arrays sl = packed_slice(c, matrices, p, f1 - f0, D, &n);
            sl.b2 = r == 0 ? (float *)mine_b2 : NULL;
            place(c, matrices, Ly->preset->layout, f0, f1, &sl, &full);
            p += n;
        }
    }
    int wrote = 1;
    if (rc == 0) { wrote = R->rank != 0 || run_write_grads(o, t, arr, x, dx) == 0; }
    if (rc == 0) { rc = tp_step(R, wrote); }
    for (int i = 0; i < 6; ++i) { free(arr[i]); }
    free(all);
    free(counts);
    return rc;
}

/* --verbose: one line per rank, printed by rank 0 in rank order. */
static void tp_verbose(const options *o, const tp_rank *R, clffn_context *ctx, size_t f0, size_t f1,
                       double slice_mb, double layer_mb) {
    if (!o->verbose) { return; }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    char name[128] = "?", line[TP_LINE];
    clffn_context_device_name(ctx, name, sizeof name);
    snprintf(line, sizeof line,
             "rank %d/%d (node-local %d): %s, hidden [%zu, %zu), weights read %.1f of %.1f MiB "
             "(%.0f%%), peak RSS %.1f MiB",
             R->rank, R->size, R->local_rank, name, f0, f1, slice_mb, layer_mb,
             layer_mb > 0 ? 100.0 * slice_mb / layer_mb : 0.0, (double)ru.ru_maxrss / 1024.0);
    tp_print_ranks(R, line);
}

void tp_print_ranks(const tp_rank *R, const char *mine) {
    char line[TP_LINE];
    snprintf(line, sizeof line, "%s", mine);
    if (R->rank != 0) {
        MPI_Send(line, (int)sizeof line, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        return;
    }
    printf("%s\n", line);
    for (int r = 1; r < R->size; ++r) {
        MPI_Recv(line, (int)sizeof line, MPI_CHAR, r, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        printf("%s\n", line);
    }
    fflush(stdout);
}

/* One rank's run: the mapped checkpoint, its layer, this rank's slice and shard, x, dy, y. */
typedef struct tp_run {
    tp_rank R;
    ckpt ck;
    layer Ly;
    loaded L;
    clffn_dtype dtype; /* the weights' on the device */
    clffn_npy x, dy;
    clffn_config c;
    clffn_context *ctx;
    clffn_ffn *ffn;
    float *y;
    size_t f0, f1;
} tp_run;

/* This rank's slice of the weights and the whole input: the exit status all agree on. */
static int tp_load(const options *o, tp_run *t) {
    int ok = run_resolve_layer(o, &t->ck, &t->Ly) == 0;
    if (ok &&
        clffn_shard_range((size_t)t->Ly.F, t->R.rank, t->R.size, &t->f0, &t->f1) != CLFFN_SUCCESS) {
        run_report("%d ranks are more than d_ff = %llu can be split into", t->R.size,
                   (unsigned long long)t->Ly.F);
        ok = 0;
    }
    const slice mine = {t->f0, t->f1 - t->f0, t->R.rank == 0};
    ok = ok && run_load_weights(o, &t->ck, &t->Ly, &mine, 0, &t->L) == 0;
    t->dtype = t->L.dtype;
    ok = ok && run_load_inputs(o, &t->Ly, &t->x, &t->dy) == 0;
    return tp_step(&t->R, ok);
}

/* The device and this rank's shard, its slice uploaded: the exit status all agree on. */
static int tp_setup(const options *o, tp_run *t) {
    t->R.code = EXIT_RUNTIME;
    t->c = run_layer_config(o, &t->Ly);
    const clffn_typed_weights tw = run_typed(&t->L);
    clffn_status s = CLFFN_SUCCESS;
    int ok = tp_open_device(o, &t->R, &t->ctx) == 0;
    if (ok && ((s = clffn_ffn_create_shard(t->ctx, &t->c, t->R.rank, t->R.size, &t->ffn)) !=
                   CLFFN_SUCCESS ||
               (s = clffn_ffn_upload_weights_typed(t->ffn, t->L.layout, &tw)) != CLFFN_SUCCESS ||
               (s = clffn_ffn_set_training(t->ffn, o->train)) != CLFFN_SUCCESS ||
               (s = clffn_ffn_set_rng(t->ffn, o->seed, 0)) != CLFFN_SUCCESS)) {
        if (t->ffn && *clffn_ffn_error_message(t->ffn)) {
            run_report("%s: %s", o->weights, clffn_ffn_error_message(t->ffn));
        } else {
            run_fail("setting up this rank's shard", s);
        }
        ok = 0;
    }
    /* every rank's weights are of one type: rank 0 speaks for them */
    if (ok && t->R.rank == 0) { run_note_quantized_inputs(o, t->dtype); }
    /* the device has the slice now: the host copy goes, so a rank holds it twice at most (the
     * mapped pages and the device's buffers) */
    run_loaded_free(&t->L);
    memset(&t->L, 0, sizeof t->L);
    return tp_step(&t->R, ok);
}

/* The forward: this rank's partial output, summed over the ranks into t->y; printed by rank 0
 * (and --verbose's lines). The exit status all agree on. */
static int tp_forward(const options *o, tp_run *t) {
    const layer *Ly = &t->Ly;
    const size_t n = (size_t)t->x.numel, T = n / (size_t)Ly->D, S = t->f1 - t->f0;
    const double t0 = tool_now_s();
    clffn_status s = CLFFN_SUCCESS;
    t->y = malloc((n ? n : 1) * sizeof *t->y);
    if (!t->y) {
        run_report("out of memory");
    } else if ((s = clffn_forward_host(t->ffn, T, t->x.data, n, t->y, n)) != CLFFN_SUCCESS) {
        run_fail("forward pass", s);
    }
    int rc = tp_step(&t->R, t->y && s == CLFFN_SUCCESS);
    if (rc != 0) { return rc; }
    if (clffn_mpi_sum(t->y, n, MPI_COMM_WORLD) != MPI_SUCCESS) { return EXIT_RUNTIME; }
    const double dt = tool_now_s() - t0;
    char split[64];
    snprintf(split, sizeof split, ", split over %d ranks", t->R.size);
    if (t->R.rank == 0) { run_print(t->ctx, Ly, &t->c, T, dt, split); }
    /* the matrices in their type on the device, the biases in f32 */
    const double mib = 1.0 / 1048576.0, per = (double)clffn_ffn_weight_bytes(t->ffn) /
                                              (double)(S * Ly->D * (Ly->gated ? 3 : 2));
    const double layer_mb =
        mib * (per * (double)(Ly->F * Ly->D * (Ly->gated ? 3 : 2)) +
               4.0 * (double)((Ly->b1 ? Ly->F : 0) + (Ly->bv ? Ly->F : 0) + (Ly->b2 ? Ly->D : 0)));
    const double slice_mb = mib * ((double)clffn_ffn_weight_bytes(t->ffn) +
                                   4.0 * (double)((Ly->b1 ? S : 0) + (Ly->bv ? S : 0) +
                                                  (t->R.rank == 0 && Ly->b2 ? Ly->D : 0)));
    tp_verbose(o, &t->R, t->ctx, t->f0, t->f1, slice_mb, layer_mb);
    return 0;
}

/* --grad-output: this rank's gradients, dx summed over the ranks, the slices gathered and
 * written by rank 0. The exit status all agree on. */
static int tp_backward(const options *o, tp_run *t) {
    const size_t n = (size_t)t->x.numel, D = (size_t)t->Ly.D, T = n / D, S = t->f1 - t->f0;
    const int matrices = t->dtype == CLFFN_DTYPE_F32;
    size_t packed_n;
    packed_slice(&t->c, matrices, NULL, S, D, &packed_n);
    float *gblock = calloc(packed_n + D, sizeof *gblock); /* b2 after the block */
    float *dx = malloc((n ? n : 1) * sizeof *dx);
    clffn_weight_arrays g = {0};
    if (gblock) {
        g = packed_slice(&t->c, matrices, gblock, S, D, &packed_n);
        g.b2 = t->R.rank == 0 && t->c.bias2 ? gblock + packed_n : NULL;
    }
    clffn_status s = CLFFN_SUCCESS;
    if (!gblock || !dx) {
        run_report("out of memory for gradients");
    } else if ((s = clffn_backward_host(t->ffn, T, t->x.data, n, t->dy.data, n, dx, n, &g, 0)) !=
               CLFFN_SUCCESS) {
        run_fail("backward pass", s);
    }
    int rc = tp_step(&t->R, gblock && dx && s == CLFFN_SUCCESS);
    if (rc == 0 && clffn_mpi_sum(dx, n, MPI_COMM_WORLD) != MPI_SUCCESS) { rc = EXIT_RUNTIME; }
    if (rc == 0) {
        rc = tp_gather_grads(o, &t->R, &t->Ly, &t->c, matrices, gblock, packed_n, g.b2, &t->x, dx);
    }
    free(gblock);
    free(dx);
    return rc;
}

/* Rank 0 writes the output; the exit status all agree on. */
static int tp_save(const options *o, tp_run *t) {
    char err[CLFFN_IO_ERR];
    int saved = 1;
    if (t->R.rank == 0 && clffn_npy_save(o->output, t->y, t->x.rank, t->x.shape, err) != 0) {
        run_report("%s: %s", o->output, err);
        if (o->grads_out) { remove(o->grads_out); } /* the run failed: no file of it stays */
        saved = 0;
    }
    return tp_step(&t->R, saved);
}

int tp_begin(const options *o, tp_rank *R, ckpt *ck, int *opened) {
    *R = (tp_rank){0, 1, 0, 1, EXIT_USAGE};
    MPI_Comm_rank(MPI_COMM_WORLD, &R->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &R->size);
    clffn_mpi_local_rank(MPI_COMM_WORLD, &R->local_rank, &R->local_size);
    run_capture_reports();
    char err[CLFFN_IO_ERR];
    *opened = ckpt_open(o->weights, ck, err) == 0;
    if (!*opened) { run_report("%s: %s", o->weights, err); }
    return tp_step(R, *opened);
}

int run_tensor_parallel(const options *o) {
    tp_run t;
    memset(&t, 0, sizeof t);
    int opened;
    int rc = tp_begin(o, &t.R, &t.ck, &opened);
    if (rc) {
        if (opened) { ckpt_close(&t.ck); } /* another rank failed to open its file */
        return rc;
    }
    if ((rc = tp_load(o, &t)) == 0 && (rc = tp_setup(o, &t)) == 0 &&
        (rc = tp_forward(o, &t)) == 0 && (!o->grad_output || (rc = tp_backward(o, &t)) == 0)) {
        rc = tp_save(o, &t);
    }
    free(t.y);
    clffn_ffn_destroy(t.ffn);
    clffn_context_destroy(t.ctx);
    clffn_npy_free(&t.x);
    clffn_npy_free(&t.dy);
    run_loaded_free(&t.L);
    ckpt_close(&t.ck);
    return rc;
}
