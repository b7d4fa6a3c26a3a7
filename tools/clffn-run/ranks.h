/* What clffn-run's MPI rooms share (tp.c, ep.c; built with MPI): a rank's standing, the
 * agreement that ends each step, the device a rank takes, and lines printed in rank order. */
#ifndef CLFFN_RUN_RANKS_H
#define CLFFN_RUN_RANKS_H

#include "run.h"
#include "clffn_mpi.h"

enum { TP_LINE = 512 };

/* Where this rank stands: what it failed with, for the next agreement. */
typedef struct tp_rank {
    int rank, size, local_rank, local_size;
    int code; /* exit status if this rank fails: EXIT_USAGE for files, EXIT_RUNTIME otherwise */
} tp_rank;

/* Every rank's ok for one step; 0 when all were fine, else the exit status all share (rank 0
 * has printed the first failing rank's message). Called by all. */
int tp_step(const tp_rank *R, int ok);

/* The device of this rank: --device for all, else the node-local rank's turn among the GPUs
 * (or, with none, among all devices), so the ranks of one machine share its GPUs out. 0 or -1
 * (reported). */
int tp_open_device(const options *o, const tp_rank *R, clffn_context **ctx);

/* This rank's standing in MPI_COMM_WORLD, then the checkpoint opened on every rank: 0 when
 * all opened it, else the exit status all share (*opened says whether this rank's is open, to
 * close). Called by all. */
int tp_begin(const options *o, tp_rank *R, ckpt *ck, int *opened);

/* Each rank's line, printed by rank 0 in rank order. Called by all. */
void tp_print_ranks(const tp_rank *R, const char *mine);

#endif
