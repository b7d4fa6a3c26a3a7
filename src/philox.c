/* Philox4x32-10 and the dropout decision on the host: the plain-C twin of cl/philox.cl. */
#include "philox.h"

#include "clffn_defs.h"

#include <math.h>

void clffn_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += CLFFN_PHILOX_W0;
            k1 += CLFFN_PHILOX_W1;
        }
        const uint64_t p0 = (uint64_t)CLFFN_PHILOX_M0 * c0;
        const uint64_t p1 = (uint64_t)CLFFN_PHILOX_M1 * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* round(p · 2^32): p = 0 keeps every element, p = 1 (threshold 2^32) drops every one. */
uint64_t clffn__drop_threshold(float p) {
    if (!(p > 0.0f)) { return 0; }
    if (p >= 1.0f) { return (uint64_t)1 << 32; }
    return (uint64_t)llround((double)p * 4294967296.0);
}

/* 1/(1 − p) in float, as the kernels multiply; 0 for p = 1, where nothing is kept anyway. */
float clffn__drop_scale(float p) { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }

int clffn_dropout_keep(float p, uint64_t seed, uint64_t offset, uint64_t index) {
    const uint64_t c = offset + (index >> 2);
    const uint32_t ctr[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    clffn_philox4x32_10(ctr, key, r);
    return (uint64_t)r[index & 3] >= clffn__drop_threshold(p);
}
