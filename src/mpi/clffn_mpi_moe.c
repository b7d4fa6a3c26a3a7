/* MPI glue for expert parallelism (see clffn_mpi.h): root's partial layer calls
 * clffn_mpi_moe_exchange on each pass; every other rank waits in clffn_mpi_moe_serve.
 *
 *   root                                    rank r (holder of experts [first_r, …))
 *   Bcast {PASS, pass, rows[E]}   ───────►  sizes its buffers from rows
 *   Allgather statuses            ◄──────►  ready or not (no rows move unless all are)
 *   Alltoallv rows of r's experts ───────►  clffn_moe_holder_run
 *   Alltoallv                     ◄───────  their outputs
 *   Gather statuses               ◄───────  its status
 *
 * Counts go in rows (an MPI type of d_model floats), so a pass's int counts hold up to 2^31
 * rows per rank. */
#include "clffn_mpi.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OP_STOP = 0, OP_PASS = 1, OP_GRADS = 2, HEAD = 3 }; /* header: op, pass, flag; rows */

/* Chunks within an int count, for a gradient array of any size. */
#define CHUNK ((size_t)1 << 28)

int clffn_mpi_moe_init(clffn_mpi_moe *m, const clffn_moe_config *config, int root, MPI_Comm comm) {
    memset(m, 0, sizeof *m);
    const size_t d_model = config->expert.d_model;
    m->comm = comm, m->root = root, m->experts = config->experts, m->d_model = d_model;
    m->expert = config->expert;
    m->failed_rank = -1;
    m->row = MPI_DATATYPE_NULL;
    int rc = MPI_Comm_rank(comm, &m->rank);
    if (rc == MPI_SUCCESS) { rc = MPI_Comm_size(comm, &m->size); }
    if (rc == MPI_SUCCESS && d_model > INT_MAX) { rc = MPI_ERR_COUNT; }
    if (rc == MPI_SUCCESS) { rc = MPI_Type_contiguous((int)d_model, MPI_FLOAT, &m->row); }
    if (rc == MPI_SUCCESS) { rc = MPI_Type_commit(&m->row); }
    return rc;
}

void clffn_mpi_moe_free(clffn_mpi_moe *m) {
    if (m->row != MPI_DATATYPE_NULL) { MPI_Type_free(&m->row); }
    free(m->in), free(m->out);
    m->in = m->out = NULL, m->cap = 0;
}

/* Each rank's rows of the pass (its experts', by the owner rule) and their offsets into the
 * packed rows; 0, or -1 when one overflows an int. */
static int per_rank(const clffn_mpi_moe *m, const size_t *rows, int *count, int *displ) {
    size_t n[m->size];
    memset(n, 0, sizeof n);
    for (size_t e = 0; e < m->experts; ++e) {
        n[clffn_moe_expert_owner(e, m->experts, m->size)] += rows[e];
    }
    size_t at = 0;
    for (int r = 0; r < m->size; ++r) {
        if (n[r] > INT_MAX || at > INT_MAX) { return -1; }
        count[r] = (int)n[r], displ[r] = (int)at;
        at += n[r];
    }
    return 0;
}

/* The first failing rank's status of a step, on every rank: a rank that cannot take its rows
 * must say so before they are sent, since MPI has no way to receive fewer than are sent. */
static clffn_status agree(clffn_mpi_moe *m, clffn_status mine, int *rc) {
    int st = (int)mine, all[m->size];
    *rc = MPI_Allgather(&st, 1, MPI_INT, all, 1, MPI_INT, m->comm);
    m->failed_rank = -1;
    for (int r = 0; *rc == MPI_SUCCESS && r < m->size; ++r) {
        if (all[r] != CLFFN_SUCCESS) {
            m->failed_rank = r;
            return (clffn_status)all[r];
        }
    }
    return CLFFN_SUCCESS;
}

/* The first failing rank's status of a step (statuses gathered to root), on root. */
static clffn_status gather_status(clffn_mpi_moe *m, clffn_status mine) {
    int st = (int)mine, all[m->size];
    MPI_Gather(&st, 1, MPI_INT, all, 1, MPI_INT, m->root, m->comm);
    if (m->rank != m->root) { return CLFFN_SUCCESS; }
    m->failed_rank = -1;
    for (int r = 0; r < m->size; ++r) {
        if (all[r] != CLFFN_SUCCESS) {
            m->failed_rank = r;
            return (clffn_status)all[r];
        }
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn_mpi_moe_exchange(void *user, int pass, const size_t *rows, const float *in,
                                    float *out) {
    clffn_mpi_moe *m = user;
    const int P = m->size;
    int count[P], displ[P], none[P];
    memset(none, 0, sizeof none);
    m->failed_rank = -1;
    if (per_rank(m, rows, count, displ) != 0) { return CLFFN_ERROR_SIZE_OVERFLOW; }
    uint64_t *head = malloc((HEAD + m->experts) * sizeof *head);
    if (!head) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    head[0] = OP_PASS, head[1] = (uint64_t)pass, head[2] = 0;
    for (size_t e = 0; e < m->experts; ++e) { head[HEAD + e] = rows[e]; }
    count[m->root] = 0; /* root's own experts run in its layer */
    float spare = 0.0f; /* a buffer for the sides that move nothing */
    int rc = MPI_Bcast(head, (int)(HEAD + m->experts), MPI_UINT64_T, m->root, m->comm);
    free(head);
    clffn_status ready = CLFFN_SUCCESS;
    if (rc == MPI_SUCCESS) { ready = agree(m, CLFFN_SUCCESS, &rc); }
    if (rc == MPI_SUCCESS && ready != CLFFN_SUCCESS) { return ready; }
    if (rc == MPI_SUCCESS) {
        rc = MPI_Alltoallv(in ? in : &spare, count, displ, m->row, &spare, none, none, m->row,
                           m->comm);
    }
    if (rc == MPI_SUCCESS) {
        rc = MPI_Alltoallv(&spare, none, none, m->row, out ? out : &spare, count, displ, m->row,
                           m->comm);
    }
    if (rc != MPI_SUCCESS) { return CLFFN_ERROR_INVALID_ARGUMENT; } /* MPI's handler aborts first */
    return gather_status(m, CLFFN_SUCCESS);
}

/* A holder's side of one pass: its rows in, run, their outputs back, its status. */
static int serve_pass(clffn_mpi_moe *m, clffn_moe_holder *h, const clffn_weight_arrays *grads,
                      const uint64_t *head) {
    const int P = m->size;
    size_t *rows = malloc(m->experts * sizeof *rows);
    int count[P], displ[P], none[P], mine = 0;
    memset(none, 0, sizeof none);
    clffn_status st = rows ? CLFFN_SUCCESS : CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    for (size_t e = 0; rows && e < m->experts; ++e) { rows[e] = (size_t)head[HEAD + e]; }
    if (rows) {
        per_rank(m, rows, count, displ); /* root checked the counts */
        mine = count[m->rank];
    }
    if (st == CLFFN_SUCCESS && (size_t)mine > m->cap) {
        free(m->in), free(m->out);
        m->in = malloc((size_t)mine * m->d_model * sizeof(float));
        m->out = malloc((size_t)mine * m->d_model * sizeof(float));
        m->cap = m->in && m->out ? (size_t)mine : 0;
        if (!m->cap) { st = CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    }
    int rc = MPI_SUCCESS;
    const clffn_status ready = agree(m, st, &rc);
    if (rc != MPI_SUCCESS || ready != CLFFN_SUCCESS) { /* root reports it; no rows move */
        free(rows);
        return rc;
    }
    float spare = 0.0f;
    float *in = mine ? m->in : &spare, *out = mine ? m->out : &spare;
    int from_root[P];
    memset(from_root, 0, sizeof from_root);
    from_root[m->root] = mine;
    rc = MPI_Alltoallv(&spare, none, none, m->row, in, from_root, none, m->row, m->comm);
    if (rc == MPI_SUCCESS) { st = clffn_moe_holder_run(h, (int)head[1], rows, in, out, grads); }
    if (rc == MPI_SUCCESS) {
        rc = MPI_Alltoallv(out, from_root, none, m->row, &spare, none, none, m->row, m->comm);
    }
    free(rows);
    if (rc == MPI_SUCCESS) { gather_status(m, st); }
    return rc;
}

/* The gradient arrays of expert config c in the order both sides walk them. */
static size_t grad_arrays(const clffn_config *c, int matrices, const clffn_weight_arrays *g,
                          float **a, size_t *n) {
    const size_t D = c->d_model, F = c->d_ff;
    size_t k = 0;
#define ARR(field, len, on) \
    if (on) { a[k] = g->field, n[k++] = (len); }
    ARR(w1, F * D, matrices)
    ARR(v, F * D, matrices && c->gated)
    ARR(w2, D * F, matrices)
    ARR(b1, F, c->bias1)
    ARR(bv, F, c->gated && c->bias_gate)
    ARR(b2, D, c->bias2)
#undef ARR
    return k;
}

static int move_floats(float *p, size_t n, int peer, int send, MPI_Comm comm) {
    int rc = MPI_SUCCESS;
    for (size_t at = 0; at < n && rc == MPI_SUCCESS; at += CHUNK) {
        const int k = (int)(n - at < CHUNK ? n - at : CHUNK);
        rc = send ? MPI_Send(p + at, k, MPI_FLOAT, peer, 2, comm)
                  : MPI_Recv(p + at, k, MPI_FLOAT, peer, 2, comm, MPI_STATUS_IGNORE);
    }
    return rc;
}

/* Every expert of rank r's (or, sending, this rank's) gradient arrays. */
static int move_grads(const clffn_mpi_moe *m, int r, int matrices, const clffn_weight_arrays *g,
                      size_t g_first, int send) {
    int rc = MPI_SUCCESS;
    for (size_t e = 0; e < m->experts && rc == MPI_SUCCESS; ++e) {
        if (clffn_moe_expert_owner(e, m->experts, m->size) != r) { continue; }
        float *a[6];
        size_t n[6];
        const size_t k = grad_arrays(&m->expert, matrices, &g[e - g_first], a, n);
        for (size_t i = 0; i < k && rc == MPI_SUCCESS; ++i) {
            rc = move_floats(a[i], n[i], send ? m->root : r, send, m->comm);
        }
    }
    return rc;
}

/* The first rank's experts' index: where a holder's grads[0] stands among the E. */
static size_t first_of(const clffn_mpi_moe *m, int r) {
    size_t e = 0;
    while (e < m->experts && clffn_moe_expert_owner(e, m->experts, m->size) != r) { ++e; }
    return e;
}

clffn_status clffn_mpi_moe_collect_grads(clffn_mpi_moe *m, int matrices,
                                         const clffn_weight_arrays *all) {
    uint64_t *head = calloc(HEAD + m->experts, sizeof *head); /* a pass's length: serve's */
    m->failed_rank = -1;
    if (!head) { return CLFFN_ERROR_OUT_OF_HOST_MEMORY; }
    head[0] = OP_GRADS, head[2] = matrices ? 1u : 0u;
    const int sent = MPI_Bcast(head, (int)(HEAD + m->experts), MPI_UINT64_T, m->root, m->comm);
    free(head);
    if (sent != MPI_SUCCESS) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    int rc = MPI_SUCCESS;
    const clffn_status st = agree(m, CLFFN_SUCCESS, &rc);
    if (rc != MPI_SUCCESS) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    for (int r = 0; st == CLFFN_SUCCESS && r < m->size; ++r) {
        if (r != m->root && move_grads(m, r, matrices, all, 0, 0) != MPI_SUCCESS) {
            return CLFFN_ERROR_INVALID_ARGUMENT;
        }
    }
    return st;
}

/* A holder's side of the collection: its status (its arrays or none), then its arrays. */
static int serve_grads(clffn_mpi_moe *m, clffn_moe_holder *h, const clffn_weight_arrays *grads,
                       const uint64_t *head) {
    const size_t first = first_of(m, m->rank);
    int rc = MPI_SUCCESS;
    const clffn_status all = agree(
        m, grads && clffn_moe_holder_expert(h, first) ? CLFFN_SUCCESS : CLFFN_ERROR_NULL_ARGUMENT,
        &rc);
    if (rc == MPI_SUCCESS && all == CLFFN_SUCCESS) {
        rc = move_grads(m, m->rank, head[2] != 0, grads, first, 1);
    }
    return rc;
}

int clffn_mpi_moe_serve(clffn_mpi_moe *m, clffn_moe_holder *h, const clffn_weight_arrays *grads) {
    uint64_t *head = malloc((HEAD + m->experts) * sizeof *head);
    if (!head) { return MPI_ERR_NO_MEM; }
    int rc = MPI_SUCCESS;
    for (;;) {
        /* every header has a pass's length: MPI_Bcast's counts must match on all ranks */
        rc = MPI_Bcast(head, (int)(HEAD + m->experts), MPI_UINT64_T, m->root, m->comm);
        if (rc != MPI_SUCCESS || head[0] == OP_STOP) { break; }
        rc = head[0] == OP_PASS ? serve_pass(m, h, grads, head) : serve_grads(m, h, grads, head);
        if (rc != MPI_SUCCESS) { break; }
    }
    free(head);
    return rc;
}

int clffn_mpi_moe_stop(clffn_mpi_moe *m) {
    uint64_t *head = calloc(HEAD + m->experts, sizeof *head);
    if (!head) { return MPI_ERR_NO_MEM; }
    head[0] = OP_STOP;
    const int rc = MPI_Bcast(head, (int)(HEAD + m->experts), MPI_UINT64_T, m->root, m->comm);
    free(head);
    return rc;
}
