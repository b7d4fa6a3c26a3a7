/* Writes a small annotated-preset checkpoint and an input for clffn-run's exit tests:
 * d_model 16, d_ff 200, 6 tokens, the shape at which a process without clffn_release_all() died
 * at exit under Oclgrind. Usage: fixture DIR (writes DIR/w.safetensors and DIR/x.npy). */
#include "clffn_io.h"

#include <stdio.h>

#define D 16
#define F 200
#define T 6

static float w1[F * D], b1[F], w2[D * F], b2[D], x[T * D];

static void fill(float *a, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; ++i) {
        a[i] = (float)((i * 2654435761u + seed) % 1000) / 1000.0f - 0.5f;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fixture DIR\n");
        return 2;
    }
    fill(w1, F * D, 1), fill(b1, F, 2), fill(w2, D * F, 3), fill(b2, D, 4), fill(x, T * D, 5);
    const uint64_t s_w1[2] = {F, D}, s_b1[1] = {F}, s_w2[2] = {D, F}, s_b2[1] = {D};
    const clffn_st_out t[4] = {{"w_1.weight", 2, s_w1, w1},
                               {"w_1.bias", 1, s_b1, b1},
                               {"w_2.weight", 2, s_w2, w2},
                               {"w_2.bias", 1, s_b2, b2}};
    char path[4096], err[CLFFN_IO_ERR];
    snprintf(path, sizeof path, "%s/w.safetensors", argv[1]);
    if (clffn_st_write(path, t, 4, err) != 0) {
        fprintf(stderr, "fixture: %s\n", err);
        return 1;
    }
    const uint64_t shape[3] = {1, T, D};
    snprintf(path, sizeof path, "%s/x.npy", argv[1]);
    if (clffn_npy_save(path, x, 3, shape, err) != 0) {
        fprintf(stderr, "fixture: %s\n", err);
        return 1;
    }
    return 0;
}
