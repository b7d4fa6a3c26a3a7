/* Weight types on the host: names, sizes, and the conversions to and from float32 — the plain-C
 * twins of the device kernels' decoding (cl/weights.cl), which the tests compare bit for bit.
 *
 * q8_0 and q4_0 follow GGUF's reference quantizers (ggml-quants.c) value for value: the scale
 * is computed in float32 from the block's largest magnitude, the quants from the float32
 * reciprocal of that scale (not from the scale rounded to f16), and only then is the scale
 * rounded to f16, to nearest even, subnormals included. */
#include "dtype.h"

#include <ctype.h>
#include <math.h>
#include <string.h>

static const char *const names[CLFFN_DTYPE_COUNT_] = {"f32", "f16", "bf16", "q8_0", "q4_0"};

const char *clffn_dtype_name(clffn_dtype t) {
    return (unsigned)t < (unsigned)CLFFN_DTYPE_COUNT_ ? names[t] : NULL;
}

clffn_status clffn_dtype_parse(const char *name, clffn_dtype *out) {
    if (!name || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    for (int t = 0; t < (int)CLFFN_DTYPE_COUNT_; ++t) {
        const char *a = name, *b = names[t];
        while (*a && tolower((unsigned char)*a) == *b) { ++a, ++b; }
        if (!*a && !*b) {
            *out = (clffn_dtype)t;
            return CLFFN_SUCCESS;
        }
    }
    return CLFFN_ERROR_INVALID_ARGUMENT;
}

size_t clffn__dtype_block_bytes(clffn_dtype t) {
    switch (t) {
    case CLFFN_DTYPE_F32: return 4;
    case CLFFN_DTYPE_F16:
    case CLFFN_DTYPE_BF16: return 2;
    case CLFFN_DTYPE_Q8_0: return 2 + CLFFN_QK;
    case CLFFN_DTYPE_Q4_0: return 2 + CLFFN_QK / 2;
    default: return 0;
    }
}

bool clffn__dtype_quantized(clffn_dtype t) {
    return t == CLFFN_DTYPE_Q8_0 || t == CLFFN_DTYPE_Q4_0;
}

clffn_status clffn_dtype_bytes(clffn_dtype t, size_t n, size_t *bytes) {
    if (!bytes) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const size_t unit = clffn__dtype_block_bytes(t);
    if (!unit) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    const size_t per = clffn__dtype_quantized(t) ? CLFFN_QK : 1;
    if (n % per) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    return clffn__mul_ok(n / per, unit, bytes) ? CLFFN_SUCCESS : CLFFN_ERROR_SIZE_OVERFLOW;
}

/* ------------------------------------------------------------------------------------------ */
/* f16 and bf16 */

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t clffn__f32_to_f16(float f) {
    const uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) { return (uint16_t)(sign | 0x7e00u); }  /* NaN: quiet, as PyTorch's */
    if (mag >= 0x477ff000u) { return (uint16_t)(sign | 0x7c00u); } /* rounds to ≥ 65520: inf */
    if (mag < 0x38800000u) { /* below f16's smallest normal, 2^-14: a subnormal or 0 */
        if (mag < 0x33000000u) { return (uint16_t)sign; } /* < 2^-25 rounds to 0 */
        const uint32_t e = mag >> 23, m = (mag & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e; /* value = m·2^(e-150), in units of 2^-24 */
        const uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        const uint32_t r = q + (rest > half || (rest == half && (q & 1)));
        return (uint16_t)(sign | r);
    }
    /* normal: rebias the exponent, round the 13 dropped bits to nearest even */
    const uint32_t base = mag - 0x38000000u, rest = base & 0x1fffu;
    uint32_t h = base >> 13;
    h += rest > 0x1000u || (rest == 0x1000u && (h & 1));
    return (uint16_t)(sign | h);
}

float clffn__f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) { return float_of(sign | 0x7f800000u | (m << 13)); }
    if (e != 0) { return float_of(sign | ((e + 112) << 23) | (m << 13)); }
    const float v = (float)m * 0x1p-24f; /* subnormal or 0: exact */
    return sign ? -v : v;
}

uint16_t clffn__f32_to_bf16(float f) {
    const uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((u >> 16) | 0x40u); } /* quiet */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

float clffn__bf16_to_f32(uint16_t b) { return float_of((uint32_t)b << 16); }

/* ------------------------------------------------------------------------------------------ */
/* GGUF's blocks */

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* quantize_row_q8_0_ref on one block */
static void quantize_q8_0(const float *x, uint8_t *blk) {
    float amax = 0.0f;
    for (int j = 0; j < CLFFN_QK; ++j) {
        const float a = fabsf(x[j]);
        amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(blk, clffn__f32_to_f16(d));
    for (int j = 0; j < CLFFN_QK; ++j) { blk[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id); }
}

/* quantize_row_q4_0_ref on one block: the scale is the signed value of largest magnitude over
 * -8 (the first such value on a tie), so that value becomes q = 0 exactly */
static void quantize_q4_0(const float *x, uint8_t *blk) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < CLFFN_QK; ++j) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put16(blk, clffn__f32_to_f16(d));
    for (int j = 0; j < CLFFN_QK / 2; ++j) {
        const int8_t lo = (int8_t)(x[j] * id + 8.5f),
                     hi = (int8_t)(x[j + CLFFN_QK / 2] * id + 8.5f);
        const uint8_t q0 = (uint8_t)(lo < 15 ? lo : 15), q1 = (uint8_t)(hi < 15 ? hi : 15);
        blk[2 + j] = (uint8_t)(q0 | q1 << 4);
    }
}

float clffn__block_value(clffn_dtype t, const uint8_t *blk, size_t j) {
    const float d = clffn__f16_to_f32(get16(blk));
    if (t == CLFFN_DTYPE_Q8_0) { return d * (float)(int8_t)blk[2 + j]; }
    const uint8_t byte = blk[2 + j % (CLFFN_QK / 2)];
    const int q = j < CLFFN_QK / 2 ? (byte & 15) : (byte >> 4);
    return d * (float)(q - 8);
}

clffn_status clffn_convert_weights(clffn_dtype t, const float *src, size_t n, void *dst,
                                   size_t dst_bytes) {
    if (!src || !dst) { return CLFFN_ERROR_NULL_ARGUMENT; }
    size_t need;
    const clffn_status st = clffn_dtype_bytes(t, n, &need);
    if (st != CLFFN_SUCCESS) { return st; }
    if (dst_bytes < need) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    uint8_t *out = dst;
    if (clffn__dtype_quantized(t)) {
        for (size_t i = 0; i < n; ++i) { /* checked first: dst is written only on success */
            if (!isfinite(src[i])) { return CLFFN_ERROR_INVALID_ARGUMENT; }
        }
        const size_t bb = clffn__dtype_block_bytes(t);
        for (size_t b = 0; b < n / CLFFN_QK; ++b) {
            if (t == CLFFN_DTYPE_Q8_0) {
                quantize_q8_0(src + b * CLFFN_QK, out + b * bb);
            } else {
                quantize_q4_0(src + b * CLFFN_QK, out + b * bb);
            }
        }
        return CLFFN_SUCCESS;
    }
    for (size_t i = 0; i < n; ++i) {
        if (t == CLFFN_DTYPE_F32) {
            memcpy(out + 4 * i, &src[i], 4);
        } else {
            put16(out + 2 * i,
                  t == CLFFN_DTYPE_F16 ? clffn__f32_to_f16(src[i]) : clffn__f32_to_bf16(src[i]));
        }
    }
    return CLFFN_SUCCESS;
}

clffn_status clffn_convert_to_f32(clffn_dtype t, const void *src, size_t src_bytes, size_t n,
                                  float *dst, size_t dst_len) {
    if (!src || !dst) { return CLFFN_ERROR_NULL_ARGUMENT; }
    size_t need;
    const clffn_status st = clffn_dtype_bytes(t, n, &need);
    if (st != CLFFN_SUCCESS) { return st; }
    if (src_bytes < need || dst_len < n) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    const uint8_t *in = src;
    const size_t bb = clffn__dtype_block_bytes(t);
    for (size_t i = 0; i < n; ++i) {
        switch (t) {
        case CLFFN_DTYPE_F32: memcpy(&dst[i], in + 4 * i, 4); break;
        case CLFFN_DTYPE_F16: dst[i] = clffn__f16_to_f32(get16(in + 2 * i)); break;
        case CLFFN_DTYPE_BF16: dst[i] = clffn__bf16_to_f32(get16(in + 2 * i)); break;
        default: dst[i] = clffn__block_value(t, in + i / CLFFN_QK * bb, i % CLFFN_QK);
        }
    }
    return CLFFN_SUCCESS;
}
