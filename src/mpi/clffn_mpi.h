/* clffn_mpi: the glue between clffn and MPI, for programs that split one layer over ranks:
 * tensor-parallel shards (clffn-run --tensor-parallel) and a mixture-of-experts layer's experts
 * (clffn-run --expert-parallel). A small library of its own (libclffn_mpi.a),
 * built only when CMake finds MPI: the core library never depends on MPI.
 *
 * MPI is the transport (Open MPI from Debian in CI); nothing here moves bytes itself. Every
 * function returns MPI_SUCCESS or MPI's error code; counts beyond an int are sent in chunks. */
#ifndef CLFFN_MPI_H
#define CLFFN_MPI_H

#include "clffn.h"

#include <mpi.h>
#include <stddef.h>

/* The rank's index among the ranks of its node and their number (MPI_Comm_split_type with
 * MPI_COMM_TYPE_SHARED): what picks a rank's device, so that ranks sharing a machine take
 * different GPUs. */
int clffn_mpi_local_rank(MPI_Comm comm, int *local_rank, int *local_size);

/* buf[0 .. n) = the sum over every rank of its buf (MPI_Allreduce in place, MPI_SUM on floats),
 * on every rank: the all-reduce of the shards' partial outputs. */
int clffn_mpi_sum(float *buf, size_t n, MPI_Comm comm);

/* Gathers each rank's n_r floats to root, which receives them in rank order at all[offset_r],
 * offset_r = n_0 + … + n_{r−1}; counts[r] = n_r must be given on root (elsewhere it may be
 * NULL). */
int clffn_mpi_gather(const float *mine, size_t n, float *all, const size_t *counts, int root,
                     MPI_Comm comm);

/* Whether every rank succeeded at a step, agreed by all: each passes its ok (non-zero: fine),
 * its exit code and a one-line message; returns 1 when all were fine. Otherwise every rank gets
 * the message and code of the lowest failing rank and *who = that rank, so all can end the same
 * way. A step is only ever left by all ranks together. */
int clffn_mpi_agree(int ok, int code, const char *msg, char *first_msg, size_t msg_size,
                    int *first_code, int *who, MPI_Comm comm);

/* Expert parallelism over ranks: one rank (root) holds the mixture-of-experts layer as a
 * partial layer (clffn_moe_create_partial) with the experts clffn_moe_expert_owner(e, E, size)
 * gives it, and routes and combines every token; every other rank holds its own experts in a
 * clffn_moe_holder and serves the layer's passes. Each pass is one MPI_Bcast of the experts'
 * row counts from root, one MPI_Allgather of whether each rank can take its rows, one
 * MPI_Alltoallv of the rows out (each rank gets its experts' rows, contiguous and in expert
 * order), one back with the outputs, and one MPI_Gather of the ranks' statuses. The holders
 * run what the whole layer runs on the same rows, so the outputs and gradients are one
 * process's bits where the devices compute alike. */
typedef struct clffn_mpi_moe {
    MPI_Comm comm;
    int root, rank, size;
    size_t experts, d_model;
    clffn_config expert; /* each expert's */
    MPI_Datatype row;    /* d_model floats */
    int failed_rank;     /* root: the lowest rank whose part of the last call failed, or -1 */
    float *in, *out;     /* a holder's rows of the pass */
    size_t cap;          /* in and out's rows */
} clffn_mpi_moe;

/* Sets up the glue for a layer of config on every rank of comm (each rank's own call; nothing
 * is sent). MPI's error code. */
int clffn_mpi_moe_init(clffn_mpi_moe *m, const clffn_moe_config *config, int root, MPI_Comm comm);
void clffn_mpi_moe_free(clffn_mpi_moe *m);

/* Root: the exchange of the partial layer (user = the clffn_mpi_moe), called by its passes;
 * returns the first failing rank's status (failed_rank says which), SIZE_OVERFLOW for a pass
 * whose rows overflow MPI's int counts (then nothing is sent), or OUT_OF_HOST_MEMORY. */
clffn_status clffn_mpi_moe_exchange(void *m, int pass, const size_t *rows, const float *in,
                                    float *out);

/* Every rank but root: serves root's passes on holder h's experts (grads: their gradient
 * arrays, count host sets as clffn_moe_holder_run() takes, or NULL when no backward wants
 * weight gradients) and answers root's collection of the gradients, until root stops. MPI's
 * error code; a pass that fails here is root's to report. */
int clffn_mpi_moe_serve(clffn_mpi_moe *m, clffn_moe_holder *h, const clffn_weight_arrays *grads);

/* Root: every other rank's experts' gradients (their serve's grads) into all[e] for each e
 * held elsewhere (all: E host sets; the matrices when `matrices`, the biases the expert
 * config has), collective with the serving ranks. CLFFN_SUCCESS, or the first failing rank's
 * status (NULL_ARGUMENT for one that has no gradient arrays). */
clffn_status clffn_mpi_moe_collect_grads(clffn_mpi_moe *m, int matrices,
                                         const clffn_weight_arrays *all);

/* Root: ends every other rank's serve. MPI's error code. */
int clffn_mpi_moe_stop(clffn_mpi_moe *m);

#endif
