/* Weight types on the host: the quantizers against GGUF's reference rounding bit for bit, the
 * f16 and bf16 conversions against an independent formula, and the dequantization against
 * GGUF's. The references here are written from ggml's quantize_row_q8_0_ref,
 * quantize_row_q4_0_ref, dequantize_row_*, its FP32→FP16 conversion (the float-arithmetic
 * round-to-nearest-even of the FP16 library) and its FP32→BF16, independently of src/dtype.c. */
#include "common.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the references ------------------------------------------------------------------------ */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ggml_compute_fp32_to_fp16: rounding done by the FPU's own float addition */
static uint16_t ref_f32_to_f16(float f) {
    const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) { bias = 0x71000000u; }
    base = from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t b = bits(base);
    const uint32_t exp_bits = (b >> 13) & 0x00007C00u, mantissa_bits = b & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

/* ggml_compute_fp16_to_fp32 */
static float ref_f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = from_bits((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    const uint32_t result =
        sign | (two_w < denormalized_cutoff ? bits(denormalized) : bits(normalized));
    return from_bits(result);
}

static uint16_t ref_f32_to_bf16(float s) {
    const uint32_t u = bits(s);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return (uint16_t)((u >> 16) | 64); }
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

#define MAXF(a, b) ((a) > (b) ? (a) : (b))
#define MINI(a, b) ((a) < (b) ? (a) : (b))

static void ref_quantize_q8_0(const float *x, uint8_t *y, size_t k) {
    for (size_t i = 0; i < k / 32; i++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) { amax = MAXF(amax, fabsf(x[i * 32 + j])); }
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        const uint16_t dh = ref_f32_to_f16(d);
        memcpy(y + i * 34, &dh, 2);
        for (int j = 0; j < 32; ++j) {
            const float x0 = x[i * 32 + j] * id;
            y[i * 34 + 2 + j] = (uint8_t)(int8_t)roundf(x0);
        }
    }
}

static void ref_quantize_q4_0(const float *x, uint8_t *y, size_t k) {
    for (size_t i = 0; i < k / 32; i++) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[i * 32 + j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        const uint16_t dh = ref_f32_to_f16(d);
        memcpy(y + i * 18, &dh, 2);
        for (int j = 0; j < 16; ++j) {
            const float x0 = x[i * 32 + 0 + j] * id, x1 = x[i * 32 + 16 + j] * id;
            const uint8_t xi0 = (uint8_t)MINI(15, (int8_t)(x0 + 8.5f));
            const uint8_t xi1 = (uint8_t)MINI(15, (int8_t)(x1 + 8.5f));
            y[i * 18 + 2 + j] = (uint8_t)(xi0 | (uint8_t)(xi1 << 4));
        }
    }
}

static float ref_block_value(clffn_dtype t, const uint8_t *blk, int j) {
    uint16_t dh;
    memcpy(&dh, blk, 2);
    const float d = ref_f16_to_f32(dh);
    if (t == CLFFN_DTYPE_Q8_0) { return (float)(int8_t)blk[2 + j] * d; }
    const int q = j < 16 ? (blk[2 + j] & 0x0F) - 8 : (blk[2 + j - 16] >> 4) - 8;
    return (float)q * d;
}

/* ---- the cases ------------------------------------------------------------------------------ */

/* A block's 32 values for each edge case. */
enum { N_CASES = 12 };
static void edge_block(int c, float *x) {
    fill_uniform(x, 32, -1.0f, 1.0f, 100 + (uint64_t)c);
    switch (c) {
    case 0: memset(x, 0, 32 * sizeof *x); break; /* all zeros: d = 0, id = 0 */
    case 1: /* one outlier: the rest quantize to small values or 0 */
        for (int j = 0; j < 32; ++j) { x[j] *= 1e-3f; }
        x[13] = 1000.0f;
        break;
    case 2: x[0] = FLT_MAX, x[31] = -FLT_MAX; break; /* the scale overflows f16 */
    case 3: /* ±max: the largest magnitude negative (q4_0 takes its sign) */
        x[7] = -3.0f, x[20] = 3.0f;
        break;
    case 4: /* q8_0 midpoints: d = 1, so x·id is k + 0.5 */
        for (int j = 0; j < 32; ++j) { x[j] = (float)(j - 16) + 0.5f; }
        x[0] = 127.0f;
        break;
    case 5: /* q4_0 midpoints: d = 1 (max = -8), x + 8.5 lands on whole numbers */
        for (int j = 0; j < 32; ++j) { x[j] = (float)(j % 16) - 7.5f; }
        x[9] = -8.0f;
        break;
    case 6: /* a scale in f16's subnormal range (amax/127 < 2^-14) */
        for (int j = 0; j < 32; ++j) { x[j] *= 1e-4f; }
        break;
    case 7: /* a scale below f16's smallest subnormal: it rounds to 0 */
        for (int j = 0; j < 32; ++j) { x[j] *= 1e-9f; }
        break;
    case 8: /* subnormal floats */
        for (int j = 0; j < 32; ++j) { x[j] *= 1e-39f; }
        break;
    case 9: /* a tie for the largest magnitude: q4_0 keeps the first */
        x[3] = -2.0f, x[11] = 2.0f;
        break;
    case 10: /* negative zeros and zeros with one value */
        for (int j = 0; j < 32; ++j) { x[j] = j % 2 ? -0.0f : 0.0f; }
        x[5] = 0.25f;
        break;
    default: break; /* random */
    }
}

Test(dtypes, quantizers_bit_exact_against_gguf_reference) {
    static const clffn_dtype types[2] = {CLFFN_DTYPE_Q8_0, CLFFN_DTYPE_Q4_0};
    float x[N_CASES * 32];
    for (int c = 0; c < N_CASES; ++c) { edge_block(c, x + 32 * c); }
    for (int t = 0; t < 2; ++t) {
        const size_t bb = types[t] == CLFFN_DTYPE_Q8_0 ? 34 : 18, n = N_CASES * 32;
        uint8_t got[N_CASES * 34], want[N_CASES * 34];
        size_t bytes;
        ASSERT_OK(clffn_dtype_bytes(types[t], n, &bytes));
        cr_assert_eq(bytes, N_CASES * bb);
        ASSERT_OK(clffn_convert_weights(types[t], x, n, got, sizeof got));
        if (types[t] == CLFFN_DTYPE_Q8_0) {
            ref_quantize_q8_0(x, want, n);
        } else {
            ref_quantize_q4_0(x, want, n);
        }
        for (int c = 0; c < N_CASES; ++c) {
            cr_assert(memcmp(got + c * bb, want + c * bb, bb) == 0, "%s, case %d differs",
                      clffn_dtype_name(types[t]), c);
        }
        /* and back: GGUF's dequantization */
        float back[N_CASES * 32];
        ASSERT_OK(clffn_convert_to_f32(types[t], got, bytes, n, back, n));
        for (size_t i = 0; i < n; ++i) {
            const float r = ref_block_value(types[t], want + i / 32 * bb, (int)(i % 32));
            cr_assert(bits(back[i]) == bits(r) || (isnan(r) && isnan(back[i])),
                      "%s value %zu: %a, not %a", clffn_dtype_name(types[t]), i, back[i], r);
        }
    }
}

/* Specific known answers: a block with d = 1 keeps its integers exactly. */
Test(dtypes, quantizer_known_answers) {
    float x[32];
    for (int j = 0; j < 32; ++j) { x[j] = (float)(j - 16); }
    x[0] = 127.0f;
    uint8_t q8[34];
    ASSERT_OK(clffn_convert_weights(CLFFN_DTYPE_Q8_0, x, 32, q8, sizeof q8));
    cr_assert_eq(q8[0] | q8[1] << 8, 0x3c00, "d = 1.0 in f16"); /* 127 / 127 */
    cr_assert_eq((int8_t)q8[2], 127);
    cr_assert_eq((int8_t)q8[2 + 5], -11);
    for (int j = 0; j < 32; ++j) { x[j] = (float)(j % 16 - 8); } /* max magnitude -8: d = 1 */
    uint8_t q4[18];
    ASSERT_OK(clffn_convert_weights(CLFFN_DTYPE_Q4_0, x, 32, q4, sizeof q4));
    cr_assert_eq(q4[0] | q4[1] << 8, 0x3c00);
    for (int j = 0; j < 16; ++j) {
        cr_assert_eq(q4[2 + j] & 15, j, "low nibble %d", j);
        cr_assert_eq(q4[2 + j] >> 4, j, "high nibble %d", j);
    }
}

/* f16 and bf16 over every f16 value's neighbourhood, the rounding boundaries and the specials,
 * against the independent formulas. */
Test(dtypes, half_and_bfloat_round_to_nearest_even) {
    uint16_t got, want;
    size_t checked = 0;
    for (uint32_t h = 0; h < 0x10000u; ++h) {
        const float f = ref_f16_to_f32((uint16_t)h);
        float back;
        ASSERT_OK(clffn_convert_to_f32(CLFFN_DTYPE_F16, &(uint16_t){(uint16_t)h}, 2, 1, &back, 1));
        cr_assert(bits(back) == bits(f) || (isnan(f) && isnan(back)), "f16 %04x", h);
        if (isnan(f)) { continue; }
        /* the value itself, and the floats around the midpoints to its neighbours */
        const uint32_t u = bits(f);
        const float probes[5] = {f, from_bits(u + 0xfff), from_bits(u + 0x1000),
                                 from_bits(u + 0x1001), from_bits(u + 0x1fff)};
        for (int p = 0; p < 5; ++p) {
            ASSERT_OK(clffn_convert_weights(CLFFN_DTYPE_F16, &probes[p], 1, &got, 2));
            want = ref_f32_to_f16(probes[p]);
            cr_assert_eq(got, want, "f16 of %a: %04x, not %04x", probes[p], got, want);
            ASSERT_OK(clffn_convert_weights(CLFFN_DTYPE_BF16, &probes[p], 1, &got, 2));
            want = ref_f32_to_bf16(probes[p]);
            cr_assert_eq(got, want, "bf16 of %a: %04x, not %04x", probes[p], got, want);
            ++checked;
        }
    }
    const float specials[] = {NAN,      -NAN,     INFINITY,        -INFINITY, FLT_MAX, 65519.99f,
                              65520.0f, 0x1p-25f, 0x1.000002p-25f, 0x1p-24f,  1e-45f,  -0.0f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) {
        ASSERT_OK(clffn_convert_weights(CLFFN_DTYPE_F16, &specials[i], 1, &got, 2));
        cr_assert_eq(got, ref_f32_to_f16(specials[i]), "f16 of %a", specials[i]);
        ASSERT_OK(clffn_convert_weights(CLFFN_DTYPE_BF16, &specials[i], 1, &got, 2));
        cr_assert_eq(got, ref_f32_to_bf16(specials[i]), "bf16 of %a", specials[i]);
    }
    cr_assert(checked > 300000);
}

Test(dtypes, names_sizes_and_refusals) {
    static const char *const names[CLFFN_DTYPE_COUNT_] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) {
        clffn_dtype d;
        cr_assert_str_eq(clffn_dtype_name((clffn_dtype)t), names[t]);
        ASSERT_OK(clffn_dtype_parse(names[t], &d));
        cr_assert_eq(d, t);
    }
    clffn_dtype d = CLFFN_DTYPE_F16;
    ASSERT_OK(clffn_dtype_parse("Q8_0", &d));
    cr_assert_eq(d, CLFFN_DTYPE_Q8_0);
    ASSERT_STATUS(clffn_dtype_parse("q5_k", &d), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_dtype_parse(NULL, &d), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_null(clffn_dtype_name(CLFFN_DTYPE_COUNT_));
    size_t b = 7;
    const size_t want[CLFFN_DTYPE_COUNT_] = {256, 128, 128, 68, 36};
    for (int t = 0; t < CLFFN_DTYPE_COUNT_; ++t) {
        ASSERT_OK(clffn_dtype_bytes((clffn_dtype)t, 64, &b));
        cr_assert_eq(b, want[t], "%s", names[t]);
    }
    b = 7;
    ASSERT_STATUS(clffn_dtype_bytes(CLFFN_DTYPE_Q4_0, 33, &b), CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_dtype_bytes(CLFFN_DTYPE_F32, SIZE_MAX / 2, &b), CLFFN_ERROR_SIZE_OVERFLOW);
    ASSERT_STATUS(clffn_dtype_bytes((clffn_dtype)9, 32, &b), CLFFN_ERROR_INVALID_ARGUMENT);
    cr_assert_eq(b, 7, "nothing written on a refusal");
    /* the quantizers refuse what GGUF's reference leaves undefined, and write nothing */
    float x[32] = {0};
    uint8_t out[34];
    memset(out, 0xab, sizeof out);
    x[4] = NAN;
    ASSERT_STATUS(clffn_convert_weights(CLFFN_DTYPE_Q8_0, x, 32, out, sizeof out),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    x[4] = INFINITY;
    ASSERT_STATUS(clffn_convert_weights(CLFFN_DTYPE_Q4_0, x, 32, out, sizeof out),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    for (size_t i = 0; i < sizeof out; ++i) { cr_assert_eq(out[i], 0xab); }
    x[4] = 1.0f;
    ASSERT_STATUS(clffn_convert_weights(CLFFN_DTYPE_Q8_0, x, 32, out, 33),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    ASSERT_STATUS(clffn_convert_weights(CLFFN_DTYPE_Q8_0, x, 16, out, 34),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_convert_weights(CLFFN_DTYPE_Q8_0, NULL, 32, out, 34),
                  CLFFN_ERROR_NULL_ARGUMENT);
    float back[32];
    ASSERT_STATUS(clffn_convert_to_f32(CLFFN_DTYPE_Q8_0, out, 33, 32, back, 32),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    ASSERT_STATUS(clffn_convert_to_f32(CLFFN_DTYPE_Q8_0, out, 34, 32, back, 31),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
}
