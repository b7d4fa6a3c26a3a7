/* clffn_mpi: the glue between clffn's tensor-parallel shards and MPI, for programs that split
 * one layer over ranks (clffn-run --tensor-parallel). A small library of its own (libclffn_mpi.a),
 * built only when CMake finds MPI: the core library never depends on MPI.
 *
 * MPI is the transport (Open MPI from Debian in CI); nothing here moves bytes itself. Every
 * function returns MPI_SUCCESS or MPI's error code; counts beyond an int are sent in chunks. */
#ifndef CLFFN_MPI_H
#define CLFFN_MPI_H

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

#endif
