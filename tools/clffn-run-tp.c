/* clffn-run --tensor-parallel: one checkpoint layer split over MPI ranks. Part of clffn-run.c
 * (included there when CMake found MPI: it uses that file's presets, checks and reports), kept
 * apart because only this part knows MPI.
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
#include "clffn_mpi.h"

#include <sys/resource.h>

/* Where this rank stands: what it failed with, for the next agreement. */
typedef struct tp_rank {
    int rank, size, local_rank, local_size;
    int code; /* exit status if this rank fails: EXIT_USAGE for files, EXIT_RUNTIME otherwise */
} tp_rank;

/* Every rank's ok for one step; 0 when all were fine, else the exit status all share (rank 0
 * has printed the message). */
static int tp_step(const tp_rank *R, int ok) {
    char msg[512];
    int code = EXIT_RUNTIME, who = 0;
    if (clffn_mpi_agree(ok, R->code, captured_msg, msg, sizeof msg, &code, &who, MPI_COMM_WORLD)) {
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

/* The device of this rank: --device for all, else the node-local rank's turn among the GPUs
 * (or, with none, among all devices), so the ranks of one machine share its GPUs out. */
static int tp_open_device(const options *o, const tp_rank *R, clffn_context **ctx) {
    if (o->device) { return open_device(o->device, ctx); }
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
        fail("listing the devices", s);
        return -1;
    }
    return open_device(spec[0] ? spec : NULL, ctx);
}

/* This rank's slice of the layer, read from the mapping: rows f0..f1 of the [F, D] matrices and
 * columns f0..f1 of the [D, F] ones (which is which depends on the preset's layout). */
static int tp_read_slice(const options *o, const clffn_st_file *st, const layer *Ly, size_t f0,
                         size_t S, int with_b2, loaded *L) {
    const uint64_t D = Ly->D;
    const int oi = o->preset->layout == CLFFN_LAYOUT_OUT_IN;
    struct {
        const clffn_st_tensor *t;
        float **dst;
        uint64_t row0, rows, col0, cols;
    } parts[6] = {
        {Ly->w1, &L->w1, oi ? f0 : 0, oi ? S : D, oi ? 0 : f0, oi ? D : S},
        {Ly->v, &L->v, oi ? f0 : 0, oi ? S : D, oi ? 0 : f0, oi ? D : S},
        {Ly->w2, &L->w2, oi ? 0 : f0, oi ? D : S, oi ? f0 : 0, oi ? S : D},
        {Ly->b1, &L->b1, 0, 1, f0, S},
        {Ly->bv, &L->bv, 0, 1, f0, S},
        {with_b2 ? Ly->b2 : NULL, &L->b2, 0, 1, 0, D},
    };
    char err[CLFFN_IO_ERR];
    for (int i = 0; i < 6; ++i) {
        if (!parts[i].t) { continue; }
        const size_t n = (size_t)(parts[i].rows * parts[i].cols);
        if (!(*parts[i].dst = malloc(n * sizeof(float)))) {
            report("out of memory for this rank's slice of '%s'", parts[i].t->name);
            return -1;
        }
        if (clffn_st_read_f32_block(st, parts[i].t, parts[i].row0, parts[i].rows, parts[i].col0,
                                    parts[i].cols, *parts[i].dst, err) != 0) {
            report("%s: %s", o->weights, err);
            return -1;
        }
    }
    return 0;
}

/* A slice's gradients as one packed block, the layout every rank sends and rank 0 unpacks:
 * W1, V (gated), W2 slices [S, D] each, then b1 and bv [S] where the config has them. Returns
 * the arrays within base (b2 NULL: only shard 0 has it, outside the block) and *n, the block's
 * length in floats; base may be NULL to measure. */
static clffn_weight_arrays packed_slice(const clffn_config *c, float *base, size_t S, size_t D,
                                        size_t *n) {
    clffn_weight_arrays a = {NULL, NULL, NULL, NULL, NULL, NULL};
    size_t at = 0;
#define TAKE(field, len, on) \
    if (on) { a.field = base ? base + at : NULL, at += (len); }
    TAKE(w1, S * D, 1)
    TAKE(v, S * D, c->gated)
    TAKE(w2, S * D, 1)
    TAKE(b1, S, c->bias1)
    TAKE(bv, S, c->gated && c->bias_gate)
#undef TAKE
    *n = at;
    return a;
}

/* The slices' gradients (mine: packed_slice's block, b2 beside it on rank 0), gathered on rank
 * 0 and placed into the layer's full arrays (one per tensor, in its own shape), then written as
 * a single process writes them. Called by all. */
static int tp_gather_grads(const options *o, const tp_rank *R, const layer *Ly,
                           const clffn_config *c, float *mine, size_t mine_n, const float *mine_b2,
                           const clffn_npy *x, const float *dx) {
    const size_t D = (size_t)Ly->D, F = (size_t)Ly->F;
    size_t *counts = calloc((size_t)R->size, sizeof *counts);
    float *all = NULL;
    const clffn_st_tensor *const t[6] = {Ly->w1, Ly->b1, Ly->v, Ly->bv, Ly->w2, Ly->b2};
    float *arr[6] = {NULL};
    int ok = counts != NULL;
    size_t total = 0;
    for (int r = 0; ok && r < R->size; ++r) {
        size_t f0, f1;
        clffn_shard_range(F, r, R->size, &f0, &f1);
        packed_slice(c, NULL, f1 - f0, D, &counts[r]);
        total += counts[r];
    }
    if (ok && R->rank == 0) {
        ok = (all = malloc(total * sizeof *all)) != NULL;
        for (int i = 0; ok && i < 6; ++i) {
            ok = !t[i] || (arr[i] = calloc((size_t)t[i]->numel, sizeof(float)));
        }
    }
    if (!ok) { report("out of memory gathering the gradients"); }
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
            clffn_weight_arrays sl = packed_slice(c, p, f1 - f0, D, &n);
            sl.b2 = r == 0 ? (float *)mine_b2 : NULL;
            clffn_shard_place(c, o->preset->layout, f0, f1, &sl, &full, 0);
            p += n;
        }
    }
    int wrote = 1;
    if (rc == 0) { wrote = R->rank != 0 || write_grads(o, t, arr, x, dx) == 0; }
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
    char name[128] = "?", line[512];
    clffn_context_device_name(ctx, name, sizeof name);
    snprintf(line, sizeof line,
             "rank %d/%d (node-local %d): %s, hidden [%zu, %zu), weights read %.1f of %.1f MiB "
             "(%.0f%%), peak RSS %.1f MiB",
             R->rank, R->size, R->local_rank, name, f0, f1, slice_mb, layer_mb,
             layer_mb > 0 ? 100.0 * slice_mb / layer_mb : 0.0, (double)ru.ru_maxrss / 1024.0);
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

static int run_tensor_parallel(const options *o) {
    tp_rank R = {0, 1, 0, 1, EXIT_USAGE};
    MPI_Comm_rank(MPI_COMM_WORLD, &R.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &R.size);
    clffn_mpi_local_rank(MPI_COMM_WORLD, &R.local_rank, &R.local_size);
    captured = 1;

    char err[CLFFN_IO_ERR];
    clffn_st_file st = {0};
    int opened = clffn_st_open(o->weights, &st, err) == 0;
    if (!opened) { report("%s: %s", o->weights, err); }
    int rc = tp_step(&R, opened);
    if (rc) {
        if (opened) { clffn_st_close(&st); } /* another rank failed to open its file */
        return rc;
    }

    layer Ly;
    loaded L = {0};
    clffn_npy x = {0}, dy = {0};
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    float *y = NULL, *dx = NULL;
    clffn_weight_arrays g = {0};
    float *gblock = NULL;
    size_t f0 = 0, f1 = 0;
    int ok = resolve_layer(o, &st, &Ly) == 0;
    if (ok && clffn_shard_range((size_t)Ly.F, R.rank, R.size, &f0, &f1) != CLFFN_SUCCESS) {
        report("%d ranks are more than d_ff = %llu can be split into", R.size,
               (unsigned long long)Ly.F);
        ok = 0;
    }
    ok = ok && tp_read_slice(o, &st, &Ly, f0, f1 - f0, R.rank == 0, &L) == 0;
    ok = ok && load_inputs(o, &Ly, &x, &dy) == 0;
    if ((rc = tp_step(&R, ok)) != 0) { goto done; }

    R.code = EXIT_RUNTIME;
    const size_t T = (size_t)(x.numel / Ly.D), n = (size_t)x.numel, S = f1 - f0;
    const clffn_config c = layer_config(o, &Ly);
    const clffn_host_weights hw = {L.w1, L.b1, L.v, L.bv, L.w2, L.b2};
    clffn_status s = CLFFN_SUCCESS;
    ok = tp_open_device(o, &R, &ctx) == 0;
    if (ok && ((s = clffn_ffn_create_shard(ctx, &c, R.rank, R.size, &ffn)) != CLFFN_SUCCESS ||
               (s = clffn_ffn_upload_weights(ffn, o->preset->layout, &hw)) != CLFFN_SUCCESS ||
               (s = clffn_ffn_set_training(ffn, o->train)) != CLFFN_SUCCESS ||
               (s = clffn_ffn_set_rng(ffn, o->seed, 0)) != CLFFN_SUCCESS)) {
        fail("setting up this rank's shard", s);
        ok = 0;
    }
    /* the device has the slice now: the host copy goes, so a rank holds it twice at most (the
     * mapped pages and the device's buffers) */
    loaded_free(&L);
    memset(&L, 0, sizeof L);
    if ((rc = tp_step(&R, ok)) != 0) { goto done; }

    const double t0 = tool_now_s();
    y = malloc((n ? n : 1) * sizeof *y);
    if (!y) {
        report("out of memory");
    } else if ((s = clffn_forward_host(ffn, T, x.data, n, y, n)) != CLFFN_SUCCESS) {
        fail("forward pass", s);
    }
    if ((rc = tp_step(&R, y && s == CLFFN_SUCCESS)) != 0) { goto done; }
    if (clffn_mpi_sum(y, n, MPI_COMM_WORLD) != MPI_SUCCESS) {
        rc = EXIT_RUNTIME;
        goto done;
    }
    const double dt = tool_now_s() - t0;
    char split[64];
    snprintf(split, sizeof split, ", split over %d ranks", R.size);
    if (R.rank == 0) { print_run(ctx, &Ly, &c, T, dt, split); }
    const double es = 4.0 / 1048576.0;
    const double layer_mb = es * (double)(Ly.F * Ly.D * (Ly.gated ? 3 : 2) + (Ly.b1 ? Ly.F : 0) +
                                          (Ly.bv ? Ly.F : 0) + (Ly.b2 ? Ly.D : 0));
    const double slice_mb = es * (double)(S * Ly.D * (Ly.gated ? 3 : 2) + (Ly.b1 ? S : 0) +
                                          (Ly.bv ? S : 0) + (R.rank == 0 && Ly.b2 ? Ly.D : 0));
    tp_verbose(o, &R, ctx, f0, f1, slice_mb, layer_mb);

    if (o->grad_output) {
        size_t packed_n;
        packed_slice(&c, NULL, S, (size_t)Ly.D, &packed_n);
        gblock = calloc(packed_n + (size_t)Ly.D, sizeof *gblock); /* b2 after the block */
        dx = malloc((n ? n : 1) * sizeof *dx);
        if (gblock) {
            g = packed_slice(&c, gblock, S, (size_t)Ly.D, &packed_n);
            g.b2 = R.rank == 0 && c.bias2 ? gblock + packed_n : NULL;
        }
        s = CLFFN_SUCCESS;
        if (!gblock || !dx) {
            report("out of memory for gradients");
        } else if ((s = clffn_backward_host(ffn, T, x.data, n, dy.data, n, dx, n, &g, 0)) !=
                   CLFFN_SUCCESS) {
            fail("backward pass", s);
        }
        if ((rc = tp_step(&R, gblock && dx && s == CLFFN_SUCCESS)) != 0) { goto done; }
        if (clffn_mpi_sum(dx, n, MPI_COMM_WORLD) != MPI_SUCCESS) {
            rc = EXIT_RUNTIME;
            goto done;
        }
        if ((rc = tp_gather_grads(o, &R, &Ly, &c, gblock, packed_n, g.b2, &x, dx)) != 0) {
            goto done;
        }
    }
    int saved = 1;
    if (R.rank == 0 && clffn_npy_save(o->output, y, x.rank, x.shape, err) != 0) {
        report("%s: %s", o->output, err);
        if (o->grads_out) { remove(o->grads_out); } /* the run failed: no file of it stays */
        saved = 0;
    }
    rc = tp_step(&R, saved);

done:
    free(gblock);
    free(dx);
    free(y);
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    clffn_npy_free(&x);
    clffn_npy_free(&dy);
    loaded_free(&L);
    clffn_st_close(&st);
    return rc;
}
