/* What scripts/peers/ggml_ffn.c and ggml_moe.c share: the clock, the sort of the timed runs,
 * weights filled the same way in any type, and the buffer llama.cpp gives weights of a type. */
#ifndef CLFFN_GGML_PEER_H
#define CLFFN_GGML_PEER_H

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Uniform values in ±1/√ne0 for every row of t (any rank), in its type, set through the
 * backend (which repacks them where the buffer does). */
static int fill_weight(struct ggml_tensor *t, uint64_t seed) {
    const int64_t cols = t->ne[0], rows = ggml_nrows(t);
    float *src = malloc((size_t)(cols * rows) * sizeof *src);
    void *dst = malloc(ggml_nbytes(t));
    if (!src || !dst) { return -1; }
    const float scale = 1.0f / sqrtf((float)cols);
    for (int64_t i = 0; i < cols * rows; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        src[i] = scale * (float)((double)(seed >> 40) / 8388608.0 - 1.0);
    }
    if (t->type == GGML_TYPE_F32) {
        memcpy(dst, src, ggml_nbytes(t));
    } else {
        ggml_quantize_chunk(t->type, src, dst, 0, rows, cols, NULL);
    }
    ggml_backend_tensor_set(t, dst, 0, ggml_nbytes(t));
    free(src);
    free(dst);
    return 0;
}

/* The buffer type llama.cpp would give weights of this type with `rows` rows per matrix:
 * CPU_REPACK where it repacks them here (q4_0 on x86 with AVX2, rows a multiple of 8, the
 * condition of ggml-cpu/repack.cpp), else the CPU's own. */
static ggml_backend_buffer_type_t weight_buft(ggml_backend_t cpu, enum ggml_type type,
                                              int64_t rows) {
    ggml_backend_dev_t dev = ggml_backend_get_device(cpu);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t extra = (ggml_backend_dev_get_extra_bufts_t)
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (type == GGML_TYPE_Q4_0 && ggml_cpu_has_avx2() && rows % 8 == 0 && extra) {
        for (ggml_backend_buffer_type_t *b = extra(dev); b && *b; ++b) {
            if (strstr(ggml_backend_buft_name(*b), "REPACK")) { return *b; }
        }
    }
    return ggml_backend_get_default_buffer_type(cpu);
}

#endif
