/* MPI glue for tensor-parallel clffn (see clffn_mpi.h). */
#include "clffn_mpi.h"

#include <limits.h>
#include <string.h>

/* Chunks within an int count, so a [T, D] of any size goes through MPI's int interfaces. */
#define CHUNK ((size_t)1 << 28)

int clffn_mpi_local_rank(MPI_Comm comm, int *local_rank, int *local_size) {
    MPI_Comm node;
    int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) { return rc; }
    rc = MPI_Comm_rank(node, local_rank);
    if (rc == MPI_SUCCESS) { rc = MPI_Comm_size(node, local_size); }
    MPI_Comm_free(&node);
    return rc;
}

int clffn_mpi_sum(float *buf, size_t n, MPI_Comm comm) {
    for (size_t at = 0; at < n; at += CHUNK) {
        const int k = (int)(n - at < CHUNK ? n - at : CHUNK);
        const int rc = MPI_Allreduce(MPI_IN_PLACE, buf + at, k, MPI_FLOAT, MPI_SUM, comm);
        if (rc != MPI_SUCCESS) { return rc; }
    }
    return MPI_SUCCESS;
}

int clffn_mpi_gather(const float *mine, size_t n, float *all, const size_t *counts, int root,
                     MPI_Comm comm) {
    int rank, size;
    int rc = MPI_Comm_rank(comm, &rank);
    if (rc == MPI_SUCCESS) { rc = MPI_Comm_size(comm, &size); }
    if (rc != MPI_SUCCESS) { return rc; }
    if (rank != root) {
        for (size_t at = 0; at < n && rc == MPI_SUCCESS; at += CHUNK) {
            const int k = (int)(n - at < CHUNK ? n - at : CHUNK);
            rc = MPI_Send(mine + at, k, MPI_FLOAT, root, 0, comm);
        }
        return rc;
    }
    size_t offset = 0;
    for (int r = 0; r < size && rc == MPI_SUCCESS; ++r) {
        if (r == root) {
            memcpy(all + offset, mine, n * sizeof *mine);
        } else {
            for (size_t at = 0; at < counts[r] && rc == MPI_SUCCESS; at += CHUNK) {
                const int k = (int)(counts[r] - at < CHUNK ? counts[r] - at : CHUNK);
                rc = MPI_Recv(all + offset + at, k, MPI_FLOAT, r, 0, comm, MPI_STATUS_IGNORE);
            }
        }
        offset += counts[r];
    }
    return rc;
}

int clffn_mpi_agree(int ok, int code, const char *msg, char *first_msg, size_t msg_size,
                    int *first_code, int *who, MPI_Comm comm) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    const int mine = ok ? INT_MAX : rank;
    int first = INT_MAX;
    if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) { return 0; }
    if (first == INT_MAX) { return 1; }
    char buf[512] = "";
    int c = code;
    if (rank == first) { strncpy(buf, msg ? msg : "", sizeof buf - 1); }
    MPI_Bcast(buf, (int)sizeof buf, MPI_CHAR, first, comm);
    MPI_Bcast(&c, 1, MPI_INT, first, comm);
    if (first_msg && msg_size) {
        strncpy(first_msg, buf, msg_size - 1);
        first_msg[msg_size - 1] = '\0';
    }
    if (first_code) { *first_code = c; }
    if (who) { *who = first; }
    return 0;
}
