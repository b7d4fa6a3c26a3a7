/* libclffn_mpi's expert-parallel glue driven directly, under mpiexec -np 2 (test_mpi runs it):
 * rank 0 calls clffn_mpi_moe_exchange with passes of its own making, rank 1 serves them from a
 * clffn_moe_holder of experts 2 and 3 of a 4-expert layer. Rank 0 checks each answer against
 * the same experts run in its own process (FFNs with the same weights: the same bits), and the
 * failures the glue must report: a pass whose counts overflow MPI's, a holder whose pass fails,
 * a gradient collection from a holder with no gradient arrays; after each the next pass must
 * still work. Prints one line per check; exits 0 when all hold. */
#include "clffn.h"
#include "clffn_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 32, F = 48, E = 4, N2 = 3, N3 = 2, N = N2 + N3 };

static int failures;

static void check(int ok, const char *what) {
    printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    failures += !ok;
}

/* Expert e's weights ([F, D], [F, D], [D, F]: nn.Linear's layout), the same on every rank. */
static float *weights_of(const clffn_config *c, size_t e, clffn_weight_arrays *w) {
    float *m = malloc(3 * F * D * sizeof *m);
    if (!m) { return NULL; }
    *w = (clffn_weight_arrays){m, NULL, m + F * D, NULL, m + 2 * F * D, NULL};
    if (clffn_init_weights_host(c, CLFFN_INIT_TORCH_LINEAR, 100 + e, CLFFN_LAYOUT_OUT_IN, w) !=
        CLFFN_SUCCESS) {
        free(m);
        return NULL;
    }
    return m;
}

static int upload(clffn_ffn *f, const clffn_config *c, size_t e) {
    clffn_weight_arrays w;
    float *m = weights_of(c, e, &w);
    const clffn_host_weights h = {w.w1, NULL, w.v, NULL, w.w2, NULL};
    const int ok = m && clffn_ffn_upload_weights(f, CLFFN_LAYOUT_OUT_IN, &h) == CLFFN_SUCCESS;
    free(m);
    return ok;
}

/* Two experts' gradient arrays (w1, v, w2 each) over m [6, F, D]. */
static void two_sets(float *m, clffn_weight_arrays *g) {
    for (size_t i = 0; i < 2; ++i) {
        float *b = m + 3 * i * F * D;
        g[i] = (clffn_weight_arrays){b, NULL, b + F * D, NULL, b + 2 * F * D, NULL};
    }
}

static void fill(float *a, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        a[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
}

/* Rank 1: serves with gradient arrays, then (after a stop) without. */
static int serve(clffn_context *ctx, const clffn_moe_config *mc, clffn_mpi_moe *m) {
    clffn_moe_holder *h = NULL;
    if (clffn_moe_holder_create(ctx, mc, 2, 2, &h) != CLFFN_SUCCESS ||
        !upload(clffn_moe_holder_expert(h, 2), &mc->expert, 2) ||
        !upload(clffn_moe_holder_expert(h, 3), &mc->expert, 3)) {
        fprintf(stderr, "rank 1: setting up the holder failed\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    static float g[6 * F * D];
    clffn_weight_arrays grads[2];
    two_sets(g, grads);
    int rc = clffn_mpi_moe_serve(m, h, grads);
    if (rc == MPI_SUCCESS) { rc = clffn_mpi_moe_serve(m, h, NULL); }
    clffn_moe_holder_destroy(h);
    return rc;
}

/* Experts 2 and 3 in rank 0's own process, on x's rows (3 for expert 2, 2 for expert 3): y, and
 * with dy, dx and the gradients. */
static int reference(clffn_context *ctx, const clffn_config *c, const float *x, const float *dy,
                     float *y, float *dx, clffn_weight_arrays *g) {
    const size_t n[2] = {N2, N3};
    size_t at = 0;
    int ok = 1;
    for (size_t i = 0; ok && i < 2; at += n[i], ++i) {
        clffn_ffn *f = NULL;
        ok = clffn_ffn_create(ctx, c, &f) == CLFFN_SUCCESS && upload(f, c, 2 + i) &&
             clffn_forward_host(f, n[i], x + at * D, n[i] * D, y + at * D, n[i] * D) ==
                 CLFFN_SUCCESS &&
             clffn_backward_host(f, n[i], x + at * D, n[i] * D, dy + at * D, n[i] * D, dx + at * D,
                                 n[i] * D, &g[i], 0) == CLFFN_SUCCESS;
        clffn_ffn_destroy(f);
    }
    return ok;
}

static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * 4); }

/* Rank 0's passes and what each must give. */
static void drive(clffn_context *ctx, const clffn_moe_config *mc, clffn_mpi_moe *m) {
    static float x[N * D], dy[N * D], y[N * D], dx[N * D], ry[N * D], rdx[N * D];
    static float rg[6 * F * D], got[6 * F * D];
    fill(x, N * D, 1), fill(dy, N * D, 2);
    clffn_weight_arrays rgs[2], all[E] = {{0}};
    two_sets(rg, rgs);
    two_sets(got, all + 2); /* experts 2 and 3 are rank 1's */
    check(reference(ctx, &mc->expert, x, dy, ry, rdx, rgs), "the reference experts ran");
    const size_t rows[E] = {0, 0, N2, N3}; /* experts 0 and 1 are rank 0's own: none sent */
    const int back = CLFFN_MOE_PASS_BACKWARD, grads = back | CLFFN_MOE_PASS_GRADS;
    check(clffn_mpi_moe_exchange(m, 0, rows, x, y) == CLFFN_SUCCESS && same(y, ry, N * D),
          "a forward's rows come back as the experts' outputs, bit for bit");
    size_t big[E] = {0, 0, (size_t)INT_MAX + 1, 0};
    check(clffn_mpi_moe_exchange(m, 0, big, x, y) == CLFFN_ERROR_SIZE_OVERFLOW,
          "counts beyond MPI's int: SIZE_OVERFLOW, nothing sent");
    check(clffn_mpi_moe_exchange(m, back, (size_t[E]){0, 0, N2, 1}, dy, dx) ==
                  CLFFN_ERROR_NO_FORWARD &&
              m->failed_rank == 1,
          "a backward of other rows than the forward's: rank 1's NO_FORWARD");
    check(clffn_mpi_moe_exchange(m, grads, rows, dy, dx) == CLFFN_SUCCESS && same(dx, rdx, N * D),
          "a backward's dy rows come back as dx, bit for bit");
    check(clffn_mpi_moe_collect_grads(m, 1, all) == CLFFN_SUCCESS && same(got, rg, 6 * F * D),
          "the gradients collected from rank 1 are the experts' own, bit for bit");
    clffn_mpi_moe_stop(m); /* rank 1 serves again, now with no gradient arrays */
    check(clffn_mpi_moe_exchange(m, 0, rows, x, y) == CLFFN_SUCCESS && same(y, ry, N * D),
          "after failures, a forward still comes back right");
    check(clffn_mpi_moe_exchange(m, grads, rows, dy, dx) == CLFFN_ERROR_NULL_ARGUMENT &&
              m->failed_rank == 1,
          "gradients asked of a holder without arrays: rank 1's NULL_ARGUMENT");
    check(clffn_mpi_moe_collect_grads(m, 1, all) == CLFFN_ERROR_NULL_ARGUMENT &&
              m->failed_rank == 1,
          "collecting from a holder without arrays: rank 1's NULL_ARGUMENT");
    check(clffn_mpi_moe_exchange(m, back, rows, dy, dx) == CLFFN_SUCCESS && same(dx, rdx, N * D),
          "dx alone still comes back right");
    clffn_mpi_moe_stop(m);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) { fprintf(stderr, "run with 2 ranks\n"); }
        MPI_Finalize();
        return 2;
    }
    clffn_moe_config mc = clffn_moe_config_default(D, F, E, 2);
    clffn_context *ctx = NULL;
    clffn_mpi_moe m;
    if (clffn_context_create_default(&ctx) != CLFFN_SUCCESS ||
        clffn_mpi_moe_init(&m, &mc, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        fprintf(stderr, "rank %d: no context or glue\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int rc = 0;
    if (rank == 0) {
        drive(ctx, &mc, &m);
        rc = failures ? 1 : 0;
    } else {
        rc = serve(ctx, &mc, &m) == MPI_SUCCESS ? 0 : 1;
    }
    clffn_mpi_moe_free(&m);
    clffn_context_destroy(ctx);
    MPI_Finalize();
    return rc;
}
