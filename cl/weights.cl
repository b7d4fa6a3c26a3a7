// =================================================================================================
// weights.cl — products over weights kept in their stored type (f32, f16, bf16, GGUF's q8_0 and
// q4_0), for few tokens, and the dequantizer that feeds CLBlast's SGEMM for many.
//
// A weight matrix W is `rows` rows of `cols` values, each row `row_bytes` long, starting w_off
// bytes into w: for q8_0 and q4_0 a row is cols/32 blocks (34 or 18 bytes: an f16 scale d, then
// the quants), for the others cols values. Only core OpenCL 1.2: halves go through vload_half
// (no fp16 extension) or integer arithmetic, or clang's __fp16 conversions where the compiler
// targets a CPU with F16C (below), bfloat16 through bit shifts.
//
//   clffn_wgemv_rows  y[t, r] = Σ_c W[r, c]·x[t, c] (+ β·y)   the reduction along a row
//   clffn_wgemv_cols  y[t, c] = Σ_r W[r, c]·x[t, r] (+ β·y)   the reduction down the columns
//   clffn_wgemv_strip the same on CPUs (CLFFN_COL_SPLIT 1), a strip of columns per work-item
//   clffn_wgemv_sum   y[t, c] = Σ_k part[k, t, c] (+ β·y)     the column kernels' row chunks
//   clffn_wdequant    out[i, j] = W[r0 + i, c0 + j] as f32
//   clffn_wdequant_t  out[j, i] = W[r0 + i, c0 + j] as f32         the same, transposed
//   clffn_wdequant_tl the same through local memory, for GPUs
//
// The GEMVs read each weight once for all the pass's tokens (up to CLFFN_WTOKENS, a build
// option, which the host rounds up to 1, 2, 4, 8 or 16), and split the reduction over a
// work-group: CLFFN_ROW_SPLIT work-items share a row, CLFFN_COL_SPLIT share a column group, their
// partial sums added in local memory. So a row of 4096 values is not one work-item's serial
// walk, as it is in a GEMV with one work-item per output. Rows are read in blocks of 32 values
// (a quantized block; 32 values of the others); a row whose length is not a multiple of 32 (f32,
// f16, bf16 only) ends in a scalar tail.
// The GEMVs take the most tokens of the pass (max_tokens, which sets the strides of the column
// kernel's partial sums) and, optionally, a count on the device (clffn_pass_tokens).
//
// Parameters (build options; defaults below, the host passes the device's tuned ones):
// =================================================================================================

#ifndef CLFFN_WTYPE
  #define CLFFN_WTYPE CLFFN_WTYPE_F32
#endif
#ifndef CLFFN_WTOKENS
  #define CLFFN_WTOKENS 1   // tokens one launch handles at most
#endif
#ifndef CLFFN_ROW_SPLIT
  #define CLFFN_ROW_SPLIT 1 // work-items per row in clffn_wgemv_rows (a power of 2)
#endif
#ifndef CLFFN_ROW_ROWS
  #define CLFFN_ROW_ROWS 16 // rows per work-group in clffn_wgemv_rows
#endif
#ifndef CLFFN_COL_WIDTH
  #define CLFFN_COL_WIDTH 32 // columns per work-item in clffn_wgemv_cols (8, 16, 32 or a
                             // multiple of 32); fewer where many tokens would need more
                             // accumulators than CLFFN_WCOL_VALUES (clffn_defs.h)
#endif
#ifndef CLFFN_COL_SPLIT
  #define CLFFN_COL_SPLIT 1 // work-items sharing a column group's rows (a power of 2)
#endif
#ifndef CLFFN_COL_GROUPS
  #define CLFFN_COL_GROUPS 8 // column groups per work-group in clffn_wgemv_cols
#endif
#ifndef CLFFN_SOFT_HALF
  #define CLFFN_SOFT_HALF 0 // 1: f16 weights and scales decoded in integer arithmetic (exact,
                            // no subnormal float), for devices whose vload_half is a long
                            // emulation (CPU devices); CLFFN_NATIVE_HALF below goes first
#endif

// Clang compiling for an x86 CPU with F16C (POCL's CPU device) turns a conversion of its storage
// type __fp16 into one instruction (vcvtph2ps) for 8 or 16 halves; vload_half on a device without
// cl_khr_fp16 is POCL's long emulation, and the soft form below some ten integer instructions.
// Elsewhere (GPU compilers, SPIR-V, other CPUs) the test fails and the core forms stay.
#ifndef CLFFN_NATIVE_HALF
  #if defined(__clang__) && defined(__F16C__)
    #define CLFFN_NATIVE_HALF 1
  #else
    #define CLFFN_NATIVE_HALF 0
  #endif
#endif

#define CLFFN_QK 32
// Clang's inliner gives up on a function as large as clffn_block_dot with its token loop
// written out; other compilers inline as they see fit.
#if defined(__clang__)
  #define CLFFN_ALWAYS_INLINE __attribute__((always_inline))
#else
  #define CLFFN_ALWAYS_INLINE
#endif
// 2^23 + 8: a nibble q as the float 2^23 + q (its bits OR-ed into 2^23's), less this, is q - 8,
// exactly, in two instructions instead of a subtraction and a conversion.
#define CLFFN_Q4_BIAS 8388616.0f
// Clang compiling for an x86 CPU with AVX-512 (POCL's CPU device there) looks a q4_0 nibble up
// as the float q - 8 in a 16-entry table, one vpermps for 16 values, which reads an index's low
// 4 bits alone, so the low nibbles need no mask. Up to 2 tokens, where decoding outweighs the
// multiply-adds (4096 -> 11008 SwiGLU, one token, four alternated rounds: 3.4-4.1 -> 3.0-3.5
// ms); at 4 tokens it measured 4-9% slower, so the 2^23 form above stays there and elsewhere.
// OpenCL's shuffle() reads the low bits alone too, but POCL builds a variable shuffle lane by
// lane (4x slower).
#ifndef CLFFN_Q4_PERMUTE
  #if defined(__clang__) && defined(__AVX512F__)
    #define CLFFN_Q4_PERMUTE 1
  #else
    #define CLFFN_Q4_PERMUTE 0
  #endif
#endif
#define CLFFN_QUANTIZED (CLFFN_WTYPE == CLFFN_WTYPE_Q8_0 || CLFFN_WTYPE == CLFFN_WTYPE_Q4_0)
#if CLFFN_WTYPE == CLFFN_WTYPE_Q8_0
  #define CLFFN_BLOCK_BYTES 34
#elif CLFFN_WTYPE == CLFFN_WTYPE_Q4_0
  #define CLFFN_BLOCK_BYTES 18
#endif

// Where several rows go to one work-item on a CPU (clffn_wgemv_rows2 and _rows4), the line
// CLFFN_ROW_PREFETCH bytes ahead in each row is prefetched into the cache as a block is read: a
// core then has more lines in flight than its hardware prefetcher gives two or four streams.
// Clang compiling for x86 (POCL's CPU device) turns __builtin_prefetch into prefetcht0;
// elsewhere it is left out. 4096 -> 11008 SwiGLU at one token on an Intel Xeon (2 cores), three
// alternated rounds, 8 blocks ahead against none: f16 9.7-10.5 -> 9.0-9.3 ms, q8_0 6.6-7.1 ->
// 6.3-6.4, bf16 9.8-10.1 -> 8.7-9.5. Eight blocks are 512 bytes of f16 and bf16 and 1024 of f32,
// which stay; q8_0's and q4_0's blocks are smaller (272 and 144 bytes ahead), and 512 bytes
// measured faster for both (docs/PERFORMANCE.md).
#ifndef CLFFN_ROW_PREFETCH
  #if CLFFN_WTYPE == CLFFN_WTYPE_F32
    #define CLFFN_ROW_PREFETCH 1024 // bytes ahead; 0: none
  #else
    #define CLFFN_ROW_PREFETCH 512
  #endif
#endif
#if CLFFN_QUANTIZED
  #define CLFFN_ROW_BLOCK_BYTES CLFFN_BLOCK_BYTES
#elif CLFFN_WTYPE == CLFFN_WTYPE_F32
  #define CLFFN_ROW_BLOCK_BYTES (4 * CLFFN_QK)
#else
  #define CLFFN_ROW_BLOCK_BYTES (2 * CLFFN_QK)
#endif
// The line at p into the cache, and the line `bytes` past p (no-op for 0 bytes); both no-ops
// where clang does not compile for x86.
#if defined(__clang__) && defined(__SSE2__)
  #define CLFFN_PREFETCH(p) __builtin_prefetch(p)
#else
  #define CLFFN_PREFETCH(p) do {} while (0)
#endif
#define CLFFN_PREFETCH_AHEAD(p, bytes)                                                         \
  do {                                                                                         \
    if ((bytes) > 0) { CLFFN_PREFETCH((p) + (bytes)); }                                        \
  } while (0)
#define CLFFN_ROW_AHEAD(row, b)                                                                \
  CLFFN_PREFETCH_AHEAD((row) + (b) * CLFFN_ROW_BLOCK_BYTES, CLFFN_ROW_PREFETCH)
// As CLFFN_ROW_AHEAD where a work-item takes n adjacent rows, but the lines past a row's end go
// to the same row of the next n (the next work-item's, which a CPU thread runs next): their
// first lines missed, a twelfth of a row of 4096 q8_0 values and a third of one of 768 f16
// values. 4096 -> 11008 SwiGLU on an Intel Xeon (2 cores), three alternated rounds, ms: one
// token q8_0 5.2-5.7 -> 4.8-4.9, q4_0 4.0-4.2 -> 3.7, bf16 9.2-9.5 -> 8.5-8.8, f16 8.4-8.9 ->
// 8.3-9.4; 4 tokens q8_0 8.5-8.8 -> 6.8-7.6, f16 10.0-10.6 -> 9.0-9.6; Qwen3's 128-expert
// layer in f16 1.53-1.63 -> 1.48-1.50. Two and three rows a work-item (8 and 16 tokens, where
// the multiply-adds bound the products): q8_0 at 8 tokens 13.4-14.5 -> 12.1-12.9, the others
// within the rounds' spread. f32's rows (1024 bytes ahead) lost 4-8% so, and keep theirs.
// The line `at` bytes into row, one of a work-item's n adjacent rows (row_bytes apart); past
// the row's end, the same place in the same row of the next work-item's n.
#define CLFFN_PREFETCH_NEXT(row, at, row_bytes, n)                                             \
  CLFFN_PREFETCH((row) + ((at) < (row_bytes) ? (at) : (at) + ((n) - 1) * (row_bytes)))
#if CLFFN_WTYPE == CLFFN_WTYPE_F32 || CLFFN_ROW_PREFETCH == 0
  #define CLFFN_ROW_AHEAD_N(row, b, row_bytes, n) CLFFN_ROW_AHEAD(row, b)
#else
  #define CLFFN_ROW_AHEAD_N(row, b, row_bytes, n)                                              \
    CLFFN_PREFETCH_NEXT(row, (b) * CLFFN_ROW_BLOCK_BYTES + CLFFN_ROW_PREFETCH, row_bytes, n)
#endif

// CLFFN_ROW_DIRECT 1 (the host's choice on CPU devices other than Mesa's llvmpipe): from 3 tokens
// the row kernels scale a block's weights once and add each token's products straight into its
// accumulator (clffn_block_dot), and where the compiler targets AVX-512 their vectors stay 16
// values wide past 4 tokens, a register each. On POCL on an Intel Xeon (2 cores), 4096 -> 11008
// SwiGLU, forward, alternated against 0: 16 tokens 17-26% and 64 tokens 19-25% faster
// (docs/PERFORMANCE.md). llvmpipe's compiler took several times longer over those sums (a cold
// build of the compressed tests 81 -> 266 s), so it keeps 0.
#ifndef CLFFN_ROW_DIRECT
  #define CLFFN_ROW_DIRECT 0
#endif
// The row kernel's vectors: 16 values while the tokens' accumulators stay few (or fit AVX-512's
// 32 registers, above), else 8; and two blocks in flight (two accumulator chains) for up to 4
// tokens. Where the compiler targets AVX2 without AVX-512, 8 at every count: a 16-value vector
// takes two of its 16 registers, and four rows' accumulators for 2 tokens (clffn_wgemv_rows4)
// took them all. 4096 -> 11008 SwiGLU on an AMD EPYC (2 cores), two alternated rounds, ms: f32 at
// 2 tokens 24.5-24.8 -> 19.5-19.9, at 4 26.8-28.6 -> 22.9-23.6; f16 at 2 9.3-9.5 -> 8.6-8.7;
// q4_0 at 2 10.2-10.3 -> 8.5; one token level (docs/PERFORMANCE.md).
#if (CLFFN_WTOKENS <= 4 && !(defined(__AVX2__) && !defined(__AVX512F__))) ||                    \
    (CLFFN_ROW_DIRECT && defined(__AVX512F__))
  #define CLFFN_RV 16
#else
  #define CLFFN_RV 8
#endif
#if CLFFN_WTOKENS <= 4
  #define CLFFN_ROW_UNROLL 2
#else
  #define CLFFN_ROW_UNROLL 1
#endif
#define CLFFN_CAT_(a, b) a##b
#define CLFFN_CAT(a, b) CLFFN_CAT_(a, b)
#define floatRV CLFFN_CAT(float, CLFFN_RV)
#define CLFFN_NV (CLFFN_QK / CLFFN_RV) // vectors per block

#define CLFFN_COL_W CLFFN_WCOL_WIDTH(CLFFN_COL_WIDTH, CLFFN_WTOKENS)
#define CLFFN_COL_VECS (CLFFN_COL_W / 8)

// ---- decoding -----------------------------------------------------------------------------------

// Halves as floats. With F16C, one conversion instruction, exact for every half (a subnormal
// half is a normal float). Else in integer arithmetic, exactly, with no subnormal float
// anywhere: a CPU takes a slow assist for each multiply with a subnormal operand (some hundred
// cycles on Intel cores, where about one in 250 of a layer's f16 weights is a subnormal half),
// and a device without CL_FP_DENORM flushes it. Exponent and mantissa move to a float's places
// and the exponent is rebiased (15 -> 127, once more for infinities and NaNs, which keep their
// payload); a subnormal half m * 2^-24 is 2^-14 * (1 + m / 1024) less 2^-14, exact; the sign
// goes on last, so -0 stays -0.
#if CLFFN_NATIVE_HALF
typedef __fp16 clffn_fp16x2 __attribute__((ext_vector_type(2)));
typedef __fp16 clffn_fp16x8 __attribute__((ext_vector_type(8)));
typedef __fp16 clffn_fp16x16 __attribute__((ext_vector_type(16)));
  #define CLFFN_HALVES(n)                                                                        \
    inline float##n clffn_halves##n(ushort##n h16) {                                             \
      return __builtin_convertvector(__builtin_bit_cast(clffn_fp16x##n, h16), float##n);         \
    }
#else
  #define CLFFN_HALVES(n)                                                                        \
    inline float##n clffn_halves##n(ushort##n h16) {                                             \
      const uint##n h = convert_uint##n(h16);                                                    \
      const uint##n em = (h & 0x7fffu) << 13;                                                    \
      const uint##n e = em & 0x0f800000u;                                                        \
      const uint##n u =                                                                          \
          em + select((uint##n)0x38000000u, (uint##n)0x70000000u, as_uint##n(e == 0x0f800000u)); \
      const float##n f =                                                                         \
          select(as_float##n(u), as_float##n(u + 0x00800000u) - 0x1p-14f, as_int##n(e == 0u));   \
      return as_float##n(as_uint##n(f) | ((h & 0x8000u) << 16));                                 \
    }
#endif
CLFFN_HALVES(8)
CLFFN_HALVES(16)

// The half at p (a block's scale, an f16 weight): vload_half, or one of the forms above where
// vload_half is a long emulation.
inline float clffn_whalf(__global const uchar *blk) {
#if CLFFN_NATIVE_HALF
  const ushort2 h = (ushort2)(*(__global const ushort *)blk, 0); // __fp16 has no scalar load
  return __builtin_convertvector(__builtin_bit_cast(clffn_fp16x2, h), float2).s0;
#elif CLFFN_SOFT_HALF
  const uint h = *(__global const ushort *)blk;
  const uint em = (h & 0x7fffu) << 13;
  const uint e = em & 0x0f800000u;
  const uint u = em + (e == 0x0f800000u ? 0x70000000u : 0x38000000u);
  const float f = e == 0u ? as_float(u + 0x00800000u) - 0x1p-14f : as_float(u);
  return as_float(as_uint(f) | ((h & 0x8000u) << 16));
#else
  return vload_half(0, (__global const half *)blk);
#endif
}

// Besides being shorter than POCL's emulation, the soft halves read through ushort vectors,
// which POCL loads unaligned: its vload_half16 has been seen to load as if 32-byte aligned and
// fault on a row of 70 halves.
#if CLFFN_SOFT_HALF || CLFFN_NATIVE_HALF
  #define CLFFN_VLOAD_HALF(n, i, p)                                                             \
    CLFFN_CAT(clffn_halves, n)(CLFFN_CAT(vload, n)(i, (__global const ushort *)(p)))
#else
  #define CLFFN_VLOAD_HALF(n, i, p) CLFFN_CAT(vload_half, n)(i, (__global const half *)(p))
#endif

// Value c of a row (any c < cols), for tails and odd shapes.
inline float clffn_wvalue(__global const uchar *row, ulong c) {
#if CLFFN_WTYPE == CLFFN_WTYPE_F32
  return ((__global const float *)row)[c];
#elif CLFFN_WTYPE == CLFFN_WTYPE_F16
  return clffn_whalf(row + 2 * c);
#elif CLFFN_WTYPE == CLFFN_WTYPE_BF16
  return as_float((uint)((__global const ushort *)row)[c] << 16);
#else
  __global const uchar *blk = row + (c / CLFFN_QK) * CLFFN_BLOCK_BYTES;
  const float d = clffn_whalf(blk);
  const uint j = (uint)(c % CLFFN_QK);
  #if CLFFN_WTYPE == CLFFN_WTYPE_Q8_0
    return d * (float)((__global const char *)(blk + 2))[j];
  #else
    const uchar b = blk[2 + (j & 15)];
    return d * (float)((int)(j < 16 ? (b & 15) : (b >> 4)) - 8);
  #endif
#endif
}

// Eight values c .. c+7 of a row, c a multiple of 8 (c + 8 ≤ cols). For the quantized types
// they come without the block's scale, which *d receives: the caller multiplies once per block.
inline float8 clffn_wload8(__global const uchar *row, ulong c, float *d) {
#if CLFFN_WTYPE == CLFFN_WTYPE_F32
  *d = 1.0f;
  return vload8(0, (__global const float *)row + c);
#elif CLFFN_WTYPE == CLFFN_WTYPE_F16
  *d = 1.0f;
  return CLFFN_VLOAD_HALF(8, 0, (__global const half *)row + c);
#elif CLFFN_WTYPE == CLFFN_WTYPE_BF16
  *d = 1.0f;
  return as_float8(convert_uint8(vload8(0, (__global const ushort *)row + c)) << 16);
#else
  __global const uchar *blk = row + (c / CLFFN_QK) * CLFFN_BLOCK_BYTES;
  *d = clffn_whalf(blk);
  const uint j = (uint)(c % CLFFN_QK);
  #if CLFFN_WTYPE == CLFFN_WTYPE_Q8_0
    return convert_float8(vload8(0, (__global const char *)(blk + 2 + j)));
  #else
    const uchar8 b = vload8(0, blk + 2 + (j & 15));
    return convert_float8(j < 16 ? (b & (uchar)15) : (b >> (uchar)4)) - 8.0f;
  #endif
#endif
}

// A q4_0 block's 32 values (the block at blk) as four 8-wide vectors, in order, without the
// scale: two 8-byte loads, each nibble q made the float 2^23 + q (halves of a uchar16 are
// shuffles Oclgrind 21.10 mistracks).
inline void clffn_q4_vecs8(__global const uchar *blk, float8 v[4]) {
  const uint8 b0 = convert_uint8(vload8(0, blk + 2)), b1 = convert_uint8(vload8(1, blk + 2));
  v[0] = as_float8((b0 & 15u) | 0x4B000000u) - CLFFN_Q4_BIAS;
  v[1] = as_float8((b1 & 15u) | 0x4B000000u) - CLFFN_Q4_BIAS;
  v[2] = as_float8((b0 >> 4) | 0x4B000000u) - CLFFN_Q4_BIAS;
  v[3] = as_float8((b1 >> 4) | 0x4B000000u) - CLFFN_Q4_BIAS;
}

// The same as two 16-wide vectors: the bytes widened once, each nibble q made the float 2^23 + q.
inline void clffn_q4_vecs16(__global const uchar *blk, float16 v[2]) {
  const uint16 b = convert_uint16(vload16(0, blk + 2));
  v[0] = as_float16((b & 15u) | 0x4B000000u) - CLFFN_Q4_BIAS;
  v[1] = as_float16((b >> 4) | 0x4B000000u) - CLFFN_Q4_BIAS;
}

// The 32 values of the block at c (a multiple of 32) as CLFFN_NV vectors, without the scale
// for the quantized types (*d receives it). q4_0's low nibbles are values 0-15, the high ones
// 16-31.
inline void clffn_wload_block(__global const uchar *row, ulong c, float *d, floatRV v[CLFFN_NV]) {
#if !CLFFN_QUANTIZED
  *d = 1.0f;
  #if CLFFN_WTYPE == CLFFN_WTYPE_F32
    #define CLFFN_WV(i) v[i] = CLFFN_CAT(vload, CLFFN_RV)(i, (__global const float *)row + c);
  #elif CLFFN_WTYPE == CLFFN_WTYPE_F16
    #define CLFFN_WV(i) v[i] = CLFFN_VLOAD_HALF(CLFFN_RV, i, (__global const half *)row + c);
  #else
    #define CLFFN_WV(i)                                                                            \
      v[i] = CLFFN_CAT(as_float, CLFFN_RV)(CLFFN_CAT(convert_uint, CLFFN_RV)(                      \
          CLFFN_CAT(vload, CLFFN_RV)(i, (__global const ushort *)row + c)) << 16);
  #endif
#else
  __global const uchar *blk = row + (c / CLFFN_QK) * CLFFN_BLOCK_BYTES;
  *d = clffn_whalf(blk);
  #if CLFFN_WTYPE == CLFFN_WTYPE_Q8_0
    #define CLFFN_WV(i)                                                                            \
      v[i] = CLFFN_CAT(convert_float, CLFFN_RV)(                                                   \
          CLFFN_CAT(vload, CLFFN_RV)(i, (__global const char *)(blk + 2)));
  #endif
#endif
#ifdef CLFFN_WV // written out, not looped: a loop here kept v in memory on POCL
  CLFFN_WV(0) CLFFN_WV(1)
  #if CLFFN_NV == 4
  CLFFN_WV(2) CLFFN_WV(3)
  #endif
  #undef CLFFN_WV
#elif CLFFN_RV == 16 && CLFFN_Q4_PERMUTE && CLFFN_WTOKENS <= 2 // q4_0: each nibble looked up
  typedef float clffn_v16sf __attribute__((__vector_size__(64)));
  typedef int clffn_v16si __attribute__((__vector_size__(64)));
  const clffn_v16sf lut = (clffn_v16sf)(float16)(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f,
                                                 -1.0f, 0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f,
                                                 7.0f);
  const uint16 b = convert_uint16(vload16(0, blk + 2));
  v[0] = as_float16(__builtin_ia32_permvarsf512(lut, (clffn_v16si)b));
  v[1] = as_float16(__builtin_ia32_permvarsf512(lut, (clffn_v16si)(b >> 4)));
#elif CLFFN_RV == 16
  clffn_q4_vecs16(blk, v);
#else
  clffn_q4_vecs8(blk, v);
#endif
}

// Lane sums through dot: the optimizer turns a sum written lane by lane into shuffles with
// undefined lanes, which Oclgrind's uninitialized-value check (21.10) crashes on; dot costs
// the same here, once per output.
inline float clffn_hsum8(float8 v) {
  return dot(v.lo, (float4)1.0f) + dot(v.hi, (float4)1.0f);
}

// A float16's lanes summed from local memory, four at a time, through the work-item's own 16
// floats at mine: Oclgrind 21.10 loses track of a float16's upper eight lanes in the shuffle a
// .hi is compiled into, and this runs once per output. Every work-item of the group calls it (it
// holds barriers). CLFFN_LANE_SUM(v) is the lane sum of a row kernel's vector, either width.
inline float clffn_hsum16_local(float16 v, __local float *mine) {
  vstore16(v, 0, mine);
  barrier(CLK_LOCAL_MEM_FENCE);
  const float4 q = (vload4(0, mine) + vload4(1, mine)) + (vload4(2, mine) + vload4(3, mine));
  barrier(CLK_LOCAL_MEM_FENCE);
  return dot(q, (float4)1.0f);
}
// Where the compiler targets x86 (POCL's CPU device), a float16's lanes are summed in registers,
// in the same order: the local-memory form's barriers and stores cost the 8-expert layer at 512
// tokens (1024 -> 2816, f16, on an Intel Xeon) 6-9% of its time. Oclgrind's and GPUs' compilers
// target no x86 and keep the local-memory form.
inline float clffn_hsum16(float16 v) {
  const float4 q = (v.s0123 + v.s4567) + (v.s89ab + v.scdef);
  return dot(q, (float4)1.0f);
}
#if CLFFN_RV == 16 && !defined(__SSE2__)
  #define CLFFN_LANE_LOCAL 1 // the lanes summed through local memory (mine)
#else
  #define CLFFN_LANE_LOCAL 0
#endif
#if CLFFN_LANE_LOCAL
  #define CLFFN_LANE_SUM(v) clffn_hsum16_local(v, mine)
#elif CLFFN_RV == 16
  #define CLFFN_LANE_SUM(v) clffn_hsum16(v)
#else
  #define CLFFN_LANE_SUM(v) clffn_hsum8(v)
#endif

// acc[t] += d·Σ_i v[i]·x[t, c + RV·i] for the pass's tokens: one block's share of each token.
// The loop is written out, and the function always inlined. As a loop, POCL's compiler kept
// acc in stack memory and took the rows' weights apart into scalar loads (f16 4096 -> 11008
// SwiGLU, two tokens: 9.6-10.1 ms against 6.6-6.7 for one; written out, 7.0-7.7); written out
// from 4 tokens on, its inliner left this a call per row and block (4 tokens: 13.5-13.9 ms
// against 10.8-11.2 as a loop). Both together: 4 tokens 8.2-8.3 ms, 8 tokens 14.9-15.0 against
// 18.4-19.4 (docs/PERFORMANCE.md).
// With CLFFN_ROW_DIRECT, from 3 tokens the weights are scaled once, d·v (exact: d has 11
// significant bits, a q8_0 or q4_0 value at most 8), and each token's products go straight into
// its accumulator: two multiply-adds a token and vector pair instead of a product, a
// multiply-add and a scaled add. The sums then run in another order than the other form's, so
// the last bits differ. f32, f16 and bf16 (d is 1) take that form up to 2 tokens too, where the
// other one's sum of a block's products, then added, kept a core's stream of one f32 row below
// the memory's: 4096 -> 11008 SwiGLU at one token on an AMD EPYC (2 cores), f32 18.7-19.2 ->
// 16.5-17.4 ms, ggml's 16.5-16.7 (docs/PERFORMANCE.md).
inline CLFFN_ALWAYS_INLINE void clffn_block_dot(const floatRV v[CLFFN_NV], float d,
                                                __global const float *xr, ulong ldx, ulong c,
                                                uint tokens, floatRV acc[CLFFN_WTOKENS]) {
#if (CLFFN_ROW_DIRECT && CLFFN_WTOKENS > 2) || (!CLFFN_QUANTIZED && CLFFN_WTOKENS <= 2)
  const floatRV w0 = v[0] * d, w1 = v[1] * d;
  #if CLFFN_NV == 4
  const floatRV w2 = v[2] * d, w3 = v[3] * d;
  #endif
  #pragma unroll
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t < tokens) {
      __global const float *xt = xr + t * ldx + c;
      floatRV a = fma(w0, CLFFN_CAT(vload, CLFFN_RV)(0, xt), acc[t]);
      a = fma(w1, CLFFN_CAT(vload, CLFFN_RV)(1, xt), a);
  #if CLFFN_NV == 4
      a = fma(w2, CLFFN_CAT(vload, CLFFN_RV)(2, xt), a);
      a = fma(w3, CLFFN_CAT(vload, CLFFN_RV)(3, xt), a);
  #endif
      acc[t] = a;
    }
  }
#else
  #pragma unroll
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t < tokens) {
      __global const float *xt = xr + t * ldx + c;
      floatRV p = v[0] * CLFFN_CAT(vload, CLFFN_RV)(0, xt);
      p = fma(v[1], CLFFN_CAT(vload, CLFFN_RV)(1, xt), p);
#if CLFFN_NV == 4
      p = fma(v[2], CLFFN_CAT(vload, CLFFN_RV)(2, xt), p);
      p = fma(v[3], CLFFN_CAT(vload, CLFFN_RV)(3, xt), p);
#endif
      acc[t] = fma((floatRV)d, p, acc[t]);
    }
  }
#endif
}

// ---- GPU forms: lanes interleaved by eight values, and loads as wide as the data allow ----------

// Eight floats at p: two 16-byte loads where p is 16-byte aligned (a GPU then moves each in one
// instruction; vload8 may assume only 4-byte alignment, and NVIDIA's compiler then issues eight
// 4-byte loads), else vload8.
inline float8 clffn_fload8(__global const float *p) {
  if (((size_t)p & 15) == 0) {
    __global const float4 *q = (__global const float4 *)p;
    return (float8)(q[0], q[1]);
  }
  return vload8(0, p);
}

#if CLFFN_WTYPE == CLFFN_WTYPE_F16 || CLFFN_WTYPE == CLFFN_WTYPE_BF16
// Eight 2-byte values as one 16-byte load filled them, as floats.
inline float8 clffn_decode8(uint4 raw) {
  #if CLFFN_WTYPE == CLFFN_WTYPE_F16 && !CLFFN_SOFT_HALF && !CLFFN_NATIVE_HALF
  // vload_half from the registers the load filled: a GPU converts a half in one instruction,
  // where the integer form takes some ten (H200, one token of 4096 -> 11008 SwiGLU in f16:
  // 0.146 -> 0.121 ms). vload_half8 from global memory may assume only 2-byte alignment, and
  // NVIDIA's compiler then issues eight loads (0.158 ms).
  return vload_half8(0, (__private const half *)&raw);
  #elif CLFFN_WTYPE == CLFFN_WTYPE_F16
  return clffn_halves8(as_ushort8(raw));
  #else
  return as_float8(convert_uint8(as_ushort8(raw)) << 16);
  #endif
}
#endif

// clffn_wload8 through 16-byte loads where the eight values are aligned so (f32, f16, bf16; the
// quantized blocks, 34 and 18 bytes, seldom are, and go through clffn_wload8).
inline float8 clffn_wload8_wide(__global const uchar *row, ulong c, float *d) {
#if CLFFN_WTYPE == CLFFN_WTYPE_F32
  *d = 1.0f;
  return clffn_fload8((__global const float *)row + c);
#elif CLFFN_WTYPE == CLFFN_WTYPE_F16 || CLFFN_WTYPE == CLFFN_WTYPE_BF16
  __global const ushort *p = (__global const ushort *)row + c;
  if (((size_t)p & 15) != 0) { return clffn_wload8(row, c, d); }
  *d = 1.0f;
  return clffn_decode8(*(__global const uint4 *)p);
#else
  return clffn_wload8(row, c, d);
#endif
}

// acc[t] += wv·x[t, c .. c+7] for the pass's tokens, in four lanes.
inline void clffn_chunk_dot(float8 wv, __global const float *xr, ulong ldx, ulong c, uint tokens,
                            float4 acc[CLFFN_WTOKENS]) {
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t < tokens) {
      const float8 xv = clffn_fload8(xr + t * ldx + c);
      acc[t] = fma(wv.lo, xv.lo, acc[t]);
      acc[t] = fma(wv.hi, xv.hi, acc[t]);
    }
  }
}

// One row's share of lane s of CLFFN_ROW_SPLIT: the row's eight-value chunks s, s + SPLIT, …, so
// that the lanes' loads at each step cover SPLIT·8 consecutive values (a warp's load is then one
// run of memory; whole blocks per lane would leave 32 values between neighbours). CLFFN_ROW_FLIGHT
// chunks are loaded before their products: that many loads in flight per lane. The chunks meet
// the sums in the same order whatever CLFFN_ROW_FLIGHT is, so it changes no bit. Eight ran slower
// than four on the H200 (one token of 4096 -> 11008 SwiGLU, ms: f16 0.121 -> 0.123-0.133, bf16
// 0.131-0.133 -> 0.139-0.145, f32 0.165-0.167 -> 0.168-0.173), its chunks held as floats: 64
// registers a lane. CLFFN_ROW_RAW holds f16 and bf16 chunks as loaded, 4 registers a chunk, and
// decodes each just before its products; the same values in the same order. On the H200 that
// took the decoding token from 0.123-0.127 to 0.110-0.117 ms in f16 and from 0.132-0.136 to
// 0.114-0.120 in bf16 (five rounds alternated), and Mixtral's layer at one token from 0.283-0.299
// to 0.256-0.268 in f16; on the H100 it was level or ahead (f16 0.138-0.141 -> 0.133-0.138).
// Only the lanes' form (CLFFN_ROW_SPLIT > 1, GPUs' shapes) reads it. `scripts/gpu-report.sh
// BUILD OUT variants` times these forms.
#ifndef CLFFN_ROW_FLIGHT
  #define CLFFN_ROW_FLIGHT 4 // 8-value chunks a lane loads before their products
#endif
#ifndef CLFFN_ROW_RAW
  #define CLFFN_ROW_RAW 1 // 0: f16 and bf16 chunks widened to floats as they are loaded
#endif
inline void clffn_row_lanes(__global const uchar *row, ulong cols, __global const float *xr,
                            ulong ldx, uint tokens, uint s, float sum[CLFFN_WTOKENS]) {
  float4 acc[CLFFN_WTOKENS];
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] = (float4)0.0f; }
  const ulong chunks = cols / 8;
  ulong j = s;
#if CLFFN_ROW_RAW && (CLFFN_WTYPE == CLFFN_WTYPE_F16 || CLFFN_WTYPE == CLFFN_WTYPE_BF16)
  if (((size_t)row & 15) == 0) { // every chunk 16-byte aligned: held as loaded until its products
    __global const uint4 *q = (__global const uint4 *)row;
    for (; j + (CLFFN_ROW_FLIGHT - 1) * CLFFN_ROW_SPLIT < chunks;
         j += CLFFN_ROW_FLIGHT * CLFFN_ROW_SPLIT) {
      uint4 raw[CLFFN_ROW_FLIGHT];
  #pragma unroll
      for (uint k = 0; k < CLFFN_ROW_FLIGHT; ++k) { raw[k] = q[j + k * CLFFN_ROW_SPLIT]; }
  #pragma unroll
      for (uint k = 0; k < CLFFN_ROW_FLIGHT; ++k) {
        clffn_chunk_dot(clffn_decode8(raw[k]), xr, ldx, 8 * (j + k * CLFFN_ROW_SPLIT), tokens,
                        acc);
      }
    }
  }
#endif
  for (; j + (CLFFN_ROW_FLIGHT - 1) * CLFFN_ROW_SPLIT < chunks;
       j += CLFFN_ROW_FLIGHT * CLFFN_ROW_SPLIT) {
    float d[CLFFN_ROW_FLIGHT];
    float8 v[CLFFN_ROW_FLIGHT];
#pragma unroll
    for (uint k = 0; k < CLFFN_ROW_FLIGHT; ++k) {
      v[k] = clffn_wload8_wide(row, 8 * (j + k * CLFFN_ROW_SPLIT), &d[k]);
    }
#pragma unroll
    for (uint k = 0; k < CLFFN_ROW_FLIGHT; ++k) {
      clffn_chunk_dot(v[k] * d[k], xr, ldx, 8 * (j + k * CLFFN_ROW_SPLIT), tokens, acc);
    }
  }
  for (; j < chunks; j += CLFFN_ROW_SPLIT) {
    float d;
    const float8 v = clffn_wload8_wide(row, 8 * j, &d);
    clffn_chunk_dot(v * d, xr, ldx, 8 * j, tokens, acc);
  }
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[t] = dot(acc[t], (float4)1.0f); }
#if !CLFFN_QUANTIZED
  for (ulong c = chunks * 8 + s; c < cols; c += CLFFN_ROW_SPLIT) { // the values past the last 8
    const float v = clffn_wvalue(row, c);
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) { sum[t] = fma(v, xr[t * ldx + c], sum[t]); }
    }
  }
#endif
}

#if CLFFN_ROW_SPLIT > 1
// A row's lanes' partial sums met in local memory (part: the row's CLFFN_WTOKENS ×
// CLFFN_ROW_SPLIT floats), in a tree; every lane of the work-group must call it.
inline void clffn_lanes_sum(__local float part[CLFFN_WTOKENS][CLFFN_ROW_SPLIT], uint s,
                            float sum[CLFFN_WTOKENS]) {
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { part[t][s] = sum[t]; }
  for (uint half_n = CLFFN_ROW_SPLIT / 2; half_n > 0; half_n /= 2) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (s < half_n) {
      for (uint t = 0; t < CLFFN_WTOKENS; ++t) { part[t][s] += part[t][s + half_n]; }
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[t] = part[t][0]; }
}
#endif

// The pass's tokens: max_tokens, or count[count_at] where the count lives on the device (an
// expert of a mixture-of-experts layer, whose rows the host does not read back: it launches for
// the most it could have, and with a count of 0, live is 0 and no weight is read). count is NULL
// otherwise. Not an early return: Mesa's compiler warns of every kernel argument read after
// one at the top of a kernel ("load_kernel_arg in control flow").
inline uint clffn_pass_tokens(uint max_tokens, __global const uint *count, uint count_at) {
  return count ? min(max_tokens, count[count_at]) : max_tokens;
}
#define CLFFN_PASS_TOKENS()                                                                  \
  const uint tokens = clffn_pass_tokens(max_tokens, count, count_at);                        \
  const int live = tokens > 0

// The row kernels (clffn_wgemv_rows, _rows_ep, _act, _glu, _rows2, _rows3, _rows4) take a launch
// of several passes of CLFFN_WTOKENS tokens, P = ⌈max_tokens / CLFFN_WTOKENS⌉: pass p sums tokens
// p·CLFFN_WTOKENS on of the max_tokens (or count's), x and y moved there (and h, where the kernel
// writes one, by CLFFN_ROW_PASS_H), as a launch of its own would. One launch for a product of
// many tokens, where POCL spends some 10-40 us between two launches. The host lays the passes
// out one of two ways, which the kernel tells apart by the first dimension's work-groups:
//  - along the first dimension (work-group p there, the rows' group row_group_ of the second):
//    POCL runs those work-groups in turn, so a group's rows go through every pass while they are
//    in the cache. For f32, f16 and bf16 weights, heavier than the pass's x: on an Intel Xeon
//    (2 cores), the 8-expert layer at 512 tokens (1024 -> 2816, f16) ran its products in 4% less
//    time than pass by pass, 4096 -> 11008 at 64 tokens 8-10%.
//  - along the second, P runs of its ⌈rows / CLFFN_ROW_ROWS⌉ work-groups, pass by pass as
//    separate launches run them: x stays in the cache and the weights stream. For q8_0 and q4_0,
//    which weigh a byte a value or less (q4_0 at 64 tokens, 4096 -> 11008: 4-9% faster so).
// row_id_ is the work-item's row (or its first) in the second dimension's terms.
#define CLFFN_ROW_PASS_TOKENS()                                                              \
  const uint all_ = clffn_pass_tokens(max_tokens, count, count_at);                          \
  const uint passes_ =                                                                       \
      max(1u, max_tokens / CLFFN_WTOKENS + (max_tokens % CLFFN_WTOKENS != 0 ? 1u : 0u));      \
  const int minor_ = get_num_groups(0) > 1;                                                  \
  const ulong groups_ = get_num_groups(1) / (minor_ ? 1u : passes_);                         \
  const uint pass_ = minor_ ? (uint)get_group_id(0) : (uint)(get_group_id(1) / groups_);     \
  const ulong row_group_ = get_group_id(1) - (minor_ ? 0 : pass_ * groups_);                 \
  const ulong row_id_ = row_group_ * CLFFN_ROW_ROWS + get_local_id(1);                       \
  const uint t0_ = pass_ * CLFFN_WTOKENS;                                                    \
  const long left_ = (long)all_ - (long)t0_;                                                 \
  const uint tokens = left_ <= 0 ? 0u : (uint)min(left_, (long)CLFFN_WTOKENS);                \
  const int live = tokens > 0;                                                               \
  x += (ulong)t0_ * ldx;                                                                     \
  y += (ulong)t0_ * ldy
#define CLFFN_ROW_PASS_H() h += (ulong)t0_ * ldh

// A grouped launch runs the same product for several experts of a mixture-of-experts layer at
// once, one a step of the third dimension (work-group size 1 there): step g's expert e is
// ids[grp.s4 + g] where grp.s4 is set (ids is the layer's counts, then the list of the experts
// with rows, then experts numbered E, whose count[E] is 0), else g. ids is read either way (any
// buffer of a uint where grp.s4 is 0): a kernel argument read only under a condition is one
// Mesa's compiler warns of, and whose value it may take wrongly ("load_kernel_arg in control
// flow"). Expert e's weights lie e·grp.s0 bytes after
// the first's, its input e·grp.s1 values after, its output e·grp.s2 values, and its count is
// count[count_at + e]; the launch's own scratch goes by the step: its partial sums g·grp.s3
// values on, its quantized input rows g·grp.s1 (rows_qx) or g·grp.s2 (xquant) bytes on.
// One product is the group of one, grp all zero. An expert with no rows reads nothing (the
// pointers past the last expert for E are never read), and each expert's sums are those its own
// launch would make, in the same order, so grouping changes no bit.
// A tiled launch (grp.s7 set; more tokens than one pass) takes its rows by tile instead: step g
// is tile g of CLFFN_WTOKENS rows (grp.s4 0), its rows, count and outputs g times the strides
// on, and only its weights (and biases) go by its expert, ids[grp.s7 + g] (cl/moe.cl,
// clffn_moe_tiles). expert_ is the step's weights' index, group_ its rows'.
#define CLFFN_GROUP_EXPERT()                                                                 \
  const uint listed_ = ids[grp.s4 + get_global_id(2)];                                       \
  const ulong group_ = grp.s4 ? listed_ : get_global_id(2);                                  \
  const uint tiled_ = ids[grp.s7 + group_];                                                  \
  const ulong expert_ = grp.s7 ? tiled_ : group_
#define CLFFN_GROUP_SHIFT(W, X, Y)                                                           \
  CLFFN_GROUP_EXPERT();                                                                      \
  W += expert_ * grp.s0;                                                                     \
  X += group_ * grp.s1;                                                                      \
  Y += group_ * grp.s2;                                                                      \
  count += group_

// ---- y = x·Wᵀ: along the rows -------------------------------------------------------------------

// The GEMV kernels' first parameters (src/wmatrix.c sets them alike for each): the weights, x,
// the pass's tokens and their count on the device, and y; R is restrict for a kernel's, and
// nothing for a function inlined into one: clang marks an inlined function's restrict pointers
// with llvm.experimental.noalias.scope.decl, which Oclgrind 21.10's LLVM does not know.
#define CLFFN_ROWS_PARAMS_R(R)                                                                 \
  __global const uchar *R w, const ulong w_off, const ulong row_bytes, const ulong rows,        \
      const ulong cols, __global const float *R x, const ulong x_off, const ulong ldx,          \
      const uint max_tokens, __global const uint *R count, const uint count_at,               \
      __global float *R y, const ulong y_off, const ulong ldy
#define CLFFN_ROWS_PARAMS CLFFN_ROWS_PARAMS_R(restrict)

// Row r's sums for the pass's tokens (sum: CLFFN_WTOKENS floats), where r < rows and live.
// With one work-item per row (CPUs), it walks the row's blocks two at a time into two
// accumulators where CLFFN_ROW_UNROLL is 2 (a chain of dependent adds per block is what bounds a
// CPU here), its vectors' lanes summed through mine (CLFFN_LANE_SUM). With more (GPUs),
// clffn_row_lanes interleaves them, and the row's partial sums meet in part, where the row's
// total then stays at part[t][0]. Every work-item of the group calls it (both hold barriers).
inline CLFFN_ALWAYS_INLINE void clffn_row_sums(
    __global const uchar *w, ulong w_off, ulong row_bytes, ulong rows, ulong cols,
    __global const float *x, ulong x_off, ulong ldx, uint tokens, int live, ulong r,
    __local float *mine, __local float part[CLFFN_WTOKENS][CLFFN_ROW_SPLIT],
    float sum[CLFFN_WTOKENS]) {
  const uint s = get_local_id(0);
#if CLFFN_ROW_SPLIT > 1
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[t] = 0.0f; }
  if (r < rows && live) {
    clffn_row_lanes(w + w_off + r * row_bytes, cols, x + x_off, ldx, tokens, s, sum);
  }
  clffn_lanes_sum(part, s, sum);
#else
  floatRV acc[CLFFN_WTOKENS];
  float tail[CLFFN_WTOKENS];
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] = (floatRV)0.0f; tail[t] = 0.0f; }
  if (r < rows && live) {
    __global const uchar *row = w + w_off + r * row_bytes;
    __global const float *xr = x + x_off;
    const ulong blocks = cols / CLFFN_QK;
    ulong b = 0;
#if CLFFN_ROW_UNROLL == 2
    floatRV acc2[CLFFN_WTOKENS];
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc2[t] = (floatRV)0.0f; }
    for (; b + 1 < blocks; b += 2) {
      const ulong c = b * CLFFN_QK, c2 = c + CLFFN_QK;
      float d, d2;
      floatRV v[CLFFN_NV], v2[CLFFN_NV];
      clffn_wload_block(row, c, &d, v);
      clffn_wload_block(row, c2, &d2, v2);
      clffn_block_dot(v, d, xr, ldx, c, tokens, acc);
      clffn_block_dot(v2, d2, xr, ldx, c2, tokens, acc2);
    }
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] += acc2[t]; }
#endif
    for (; b < blocks; ++b) {
      const ulong c = b * CLFFN_QK;
      float d;
      floatRV v[CLFFN_NV];
      clffn_wload_block(row, c, &d, v);
      clffn_block_dot(v, d, xr, ldx, c, tokens, acc);
    }
#if !CLFFN_QUANTIZED
    for (ulong c = blocks * CLFFN_QK; c < cols; ++c) { // the values past the last whole 32
      const float v = clffn_wvalue(row, c);
      for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
        if (t < tokens) { tail[t] = fma(v, xr[t * ldx + c], tail[t]); }
      }
    }
#endif
  }
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[t] = CLFFN_LANE_SUM(acc[t]) + tail[t]; }
#endif
}

// The row kernels' local memory: each work-item's 16 floats for CLFFN_LANE_SUM (mine), and each
// row's slots for its lanes' partial sums (part, indexed by the row in the work-group).
#if CLFFN_LANE_LOCAL
  #define CLFFN_ROW_LOCALS()                                                                   \
    __local float lanes_[CLFFN_ROW_ROWS * 16];                                                 \
    __local float *mine = lanes_ + get_local_id(1) * 16;                                       \
    __local float part[CLFFN_ROW_ROWS][CLFFN_WTOKENS][CLFFN_ROW_SPLIT]
#else
  #define CLFFN_ROW_LOCALS()                                                                   \
    __local float *mine = 0;                                                                   \
    __local float part[CLFFN_ROW_ROWS][CLFFN_WTOKENS][CLFFN_ROW_SPLIT]
#endif

// NDRange (CLFFN_ROW_SPLIT, ⌈rows / CLFFN_ROW_ROWS⌉·CLFFN_ROW_ROWS), work-group (CLFFN_ROW_SPLIT,
// CLFFN_ROW_ROWS): a row a work-item (CPUs) or CLFFN_ROW_SPLIT lanes a row (GPUs), as
// clffn_row_sums says. beta = 0 does not read y.
__kernel __attribute__((reqd_work_group_size(CLFFN_ROW_SPLIT, CLFFN_ROW_ROWS, 1)))
void clffn_wgemv_rows(CLFFN_ROWS_PARAMS, const float beta, __global const uint *restrict ids,
                      const ulong8 grp) {
  CLFFN_GROUP_SHIFT(w, x, y);
  CLFFN_ROW_PASS_TOKENS();
  const uint s = get_local_id(0);
  const ulong r = row_id_;
  CLFFN_ROW_LOCALS();
  float sum[CLFFN_WTOKENS];
  clffn_row_sums(w, w_off, row_bytes, rows, cols, x, x_off, ldx, tokens, live, r, mine,
                 part[get_local_id(1)], sum);
  if (s == 0 && r < rows && live) {
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        __global float *yt = y + y_off + t * ldy + r;
        *yt = beta != 0.0f ? fma(beta, *yt, sum[t]) : sum[t];
      }
    }
  }
}

// clffn_wgemv_rows with an FFN's epilogue applied as the sums are written, so that it needs no
// launch of its own (a few-token forward's fixed cost is its launches on a GPU):
//   clffn_wgemv_rows_ep   the second epilogue: y[t, r] = sum + b[r]
//   clffn_wgemv_rows_act  the first: y keeps the sums (z, which the backward reads) and
//                         h[t, j] = act(z[t, j] + b[j]), act a clffn_activation id
//   clffn_wgemv_rows_glu  the same ⊙ (z[t, pair + j] + bg[j]): a gated first layer, W1's pair
//                         rows in w, V's as many at wv_off bytes into wv (after W1's in w when
//                         stacked, or a buffer of their own). W1's row j and V's row j meet in
//                         one work-group, its first CLFFN_ROW_ROWS / 2 rows W1's and the others
//                         V's, the gate's sums read from part (CLFFN_ROW_ROWS even; NDRange
//                         (CLFFN_ROW_SPLIT, ⌈pair / (CLFFN_ROW_ROWS / 2)⌉ · CLFFN_ROW_ROWS))
// ep's flags (clffn_defs.h) say whether b and bg are added (CLFFN_EP_BIAS, CLFFN_EP_BIAS_GATE;
// else never read), and whether the activation takes its float4 form (CLFFN_EP_VEC4, where
// epilogue.cl's clffn_epilogue1 would). Each value is the one epilogue.cl's kernels compute
// from the same sums, in the same order. A grouped launch's expert also moves h by grp.s6
// floats and the biases by grp.s5. beta is 0. Three kernels, not flags: POCL ran the product's
// sums slower with the other forms' code beside them under a branch.
#define CLFFN_ROWS_EP_PARAMS_R(R)                                                              \
  CLFFN_ROWS_PARAMS_R(R), __global float *R h, const ulong h_off, const ulong ldh,              \
      __global const float *R b, const ulong b_off, __global const float *R bg,               \
      const ulong bg_off, const uint ep, const uint act, const ulong pair,                    \
      __global const uchar *R wv, const ulong wv_off, __global const uint *R ids,             \
      const ulong8 grp
#define CLFFN_ROWS_EP_PARAMS CLFFN_ROWS_EP_PARAMS_R(restrict)
#define CLFFN_ROWS_EP_ARGS                                                                     \
  w, w_off, row_bytes, rows, cols, x, x_off, ldx, max_tokens, count, count_at, y, y_off, ldy,  \
      h, h_off, ldh, b, b_off, bg, bg_off, ep, act, pair, wv, wv_off, ids, grp

inline CLFFN_ALWAYS_INLINE void clffn_rows_ep(
    CLFFN_ROWS_EP_PARAMS_R(), const int hidden, const int pairs, __local float *mine,
    __local float part[][CLFFN_WTOKENS][CLFFN_ROW_SPLIT]) {
  CLFFN_GROUP_SHIFT(w, x, y);
  wv += expert_ * grp.s0;
  h += group_ * grp.s6;
  b += expert_ * grp.s5;
  bg += expert_ * grp.s5;
  CLFFN_ROW_PASS_TOKENS();
  CLFFN_ROW_PASS_H();
  const uint s = get_local_id(0), l = get_local_id(1);
  float sum[CLFFN_WTOKENS], gate[CLFFN_WTOKENS];
  const uint half_rows = CLFFN_ROW_ROWS / 2;
  const ulong j = pairs ? row_group_ * half_rows + (l < half_rows ? l : l - half_rows)
                        : row_id_;
  const int v_row = pairs && l >= half_rows; // V's row j, whose sums are the gate
  const ulong r = v_row ? pair + j : j;       // the row's column of y (z)
  const int mine_row = pairs ? j < pair : r < rows;
  clffn_row_sums(v_row ? wv : w, v_row ? wv_off : w_off, row_bytes, mine_row ? rows : 0, cols, x,
                 x_off, ldx, tokens, live, v_row ? j : r, mine, part[l], sum);
  if (pairs) { // each row's sums at part[l][t][0], where clffn_lanes_sum leaves a split row's
#if CLFFN_ROW_SPLIT == 1
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) { part[l][t][0] = sum[t]; }
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!v_row) { // W1's row: its gate is the V row half a work-group on
      for (uint t = 0; t < CLFFN_WTOKENS; ++t) { gate[t] = part[l + half_rows][t][0]; }
    }
  }
  if (s != 0 || !mine_row || !live) { return; }
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t >= tokens) { break; }
    float v = sum[t];
    if (!hidden && (ep & CLFFN_EP_BIAS)) { v += b[b_off + r]; }
    y[y_off + t * ldy + r] = v;
    if (!hidden || v_row) { continue; }
    float a = sum[t];
    if (ep & CLFFN_EP_BIAS) { a += b[b_off + j]; }
    float o = clffn_activate_by(act, a, (ep & CLFFN_EP_VEC4) != 0);
    if (pairs) {
      float g = gate[t];
      if (ep & CLFFN_EP_BIAS_GATE) { g += bg[bg_off + j]; }
      o *= g;
    }
    h[h_off + t * ldh + j] = o;
  }
}

__kernel __attribute__((reqd_work_group_size(CLFFN_ROW_SPLIT, CLFFN_ROW_ROWS, 1)))
void clffn_wgemv_rows_ep(CLFFN_ROWS_EP_PARAMS) {
  CLFFN_ROW_LOCALS();
  clffn_rows_ep(CLFFN_ROWS_EP_ARGS, 0, 0, mine, part);
}

__kernel __attribute__((reqd_work_group_size(CLFFN_ROW_SPLIT, CLFFN_ROW_ROWS, 1)))
void clffn_wgemv_rows_act(CLFFN_ROWS_EP_PARAMS) {
  CLFFN_ROW_LOCALS();
  clffn_rows_ep(CLFFN_ROWS_EP_ARGS, 1, 0, mine, part);
}

__kernel __attribute__((reqd_work_group_size(CLFFN_ROW_SPLIT, CLFFN_ROW_ROWS, 1)))
void clffn_wgemv_rows_glu(CLFFN_ROWS_EP_PARAMS) {
  CLFFN_ROW_LOCALS();
  clffn_rows_ep(CLFFN_ROWS_EP_ARGS, 1, 1, mine, part);
}

// Past 8 tokens with the direct sums (CLFFN_ROW_DIRECT), clffn_wgemv_rows2 walks its two rows
// once for each part of 8 tokens: two rows' accumulators for all 16 tokens are 32 vectors, every
// register AVX-512 has, and the compiler spilled them in every block; 16 a part leave room for
// the weights and x, and the second walk reads the rows from the cache, decoding them again. The
// sums are those of one walk, bit for bit. 4096 -> 11008 SwiGLU at 16 tokens on an Intel Xeon
// (2 cores), two alternated rounds: f16 29.4, 33.1 -> 26.1, 26.9 ms, q8_0 26.7, 25.9 -> 22.4,
// 21.2; 1024 -> 2816 f16 3.6, 3.4 -> 2.7, 2.6 (parts of 4 tokens were slower than of 8).
#if CLFFN_ROW_DIRECT && CLFFN_WTOKENS > 8
  #define CLFFN_ROW_PART 8
  #define CLFFN_ROW_PARTS (CLFFN_WTOKENS / CLFFN_ROW_PART)
#else
  #define CLFFN_ROW_PARTS 1
#endif
#if CLFFN_ROW_PARTS > 1
// acc[t] and acc2[t] += rows row and row2's sums for tokens t0 + t, t < CLFFN_ROW_PART; the
// first walk (ahead) prefetches (rows row_bytes apart).
inline CLFFN_ALWAYS_INLINE void clffn_rows2_part(__global const uchar *row,
                                                 __global const uchar *row2, ulong row_bytes,
                                                 ulong blocks,
                                                 __global const float *xr, ulong ldx, uint t0,
                                                 uint tokens, int ahead,
                                                 floatRV acc[CLFFN_ROW_PART],
                                                 floatRV acc2[CLFFN_ROW_PART]) {
  floatRV a[CLFFN_ROW_PART], a2[CLFFN_ROW_PART];
  #pragma unroll
  for (uint t = 0; t < CLFFN_ROW_PART; ++t) { a[t] = a2[t] = (floatRV)0.0f; }
  __global const float *xp = xr + t0 * ldx;
  for (ulong b = 0; b < blocks; ++b) {
    const ulong c = b * CLFFN_QK;
    float d, d2;
    floatRV v[CLFFN_NV], v2[CLFFN_NV];
    if (ahead) {
      CLFFN_ROW_AHEAD_N(row, b, row_bytes, 2);
      CLFFN_ROW_AHEAD_N(row2, b, row_bytes, 2);
    }
    clffn_wload_block(row, c, &d, v);
    clffn_wload_block(row2, c, &d2, v2);
    floatRV w[CLFFN_NV], w2[CLFFN_NV];
    #pragma unroll
    for (uint i = 0; i < CLFFN_NV; ++i) {
      w[i] = v[i] * d;
      w2[i] = v2[i] * d2;
    }
    #pragma unroll
    for (uint t = 0; t < CLFFN_ROW_PART; ++t) {
      if (t0 + t < tokens) { // not t < tokens - t0, whose saturating form Oclgrind lacks
        __global const float *xt = xp + t * ldx + c;
        #pragma unroll
        for (uint i = 0; i < CLFFN_NV; ++i) {
          const floatRV xv = CLFFN_CAT(vload, CLFFN_RV)(i, xt);
          a[t] = fma(w[i], xv, a[t]);
          a2[t] = fma(w2[i], xv, a2[t]);
        }
      }
    }
  }
  #pragma unroll
  for (uint t = 0; t < CLFFN_ROW_PART; ++t) {
    acc[t] = a[t];
    acc2[t] = a2[t];
  }
}
#endif

// y[t, r0 + i] = sum[i·CLFFN_WTOKENS + t] (+ β·y) for n rows and the pass's tokens: the rows
// a work-item of clffn_wgemv_rows3, _rows4 or _rows_qx took.
inline void clffn_store_rows(__global float *y, ulong ldy, ulong r0, ulong n, uint tokens,
                             float beta, const float *sum) {
  for (ulong i = 0; i < n; ++i) {
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        __global float *yt = y + t * ldy + r0 + i;
        const float v = sum[i * CLFFN_WTOKENS + t];
        *yt = beta != 0.0f ? fma(beta, *yt, v) : v;
      }
    }
  }
}

#if !CLFFN_QUANTIZED
// tail[i·CLFFN_WTOKENS + t] += the products of row i's values past its last whole 32 and x's,
// for the n rows from row0 (row_bytes apart) a work-item of clffn_wgemv_rows3 or _rows4 took.
inline void clffn_rows_tail(__global const uchar *row0, ulong row_bytes, ulong n, ulong cols,
                            __global const float *xr, ulong ldx, uint tokens, float *tail) {
  for (ulong c = cols / CLFFN_QK * CLFFN_QK; c < cols; ++c) {
    for (ulong i = 0; i < n; ++i) {
      const float v = clffn_wvalue(row0 + i * row_bytes, c);
      for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
        float *s = tail + i * CLFFN_WTOKENS + t;
        if (t < tokens) { *s = fma(v, xr[t * ldx + c], *s); }
      }
    }
  }
}
#endif

// Two rows per work-item, 2·g and 2·g + 1: where x outgrows a CPU's first-level cache (x of the
// context's row-grouping boundary or more, src/wmatrix.c), each vector of x read then serves
// both rows. NDRange
// (1, ⌈⌈rows / 2⌉ / CLFFN_ROW_ROWS⌉·CLFFN_ROW_ROWS), work-group (1, CLFFN_ROW_ROWS); built where
// CLFFN_ROW_SPLIT is 1, which is what the host uses it with.
#if CLFFN_ROW_SPLIT == 1
__kernel __attribute__((reqd_work_group_size(1, CLFFN_ROW_ROWS, 1)))
void clffn_wgemv_rows2(CLFFN_ROWS_PARAMS, const float beta, __global const uint *restrict ids,
                       const ulong8 grp) {
  CLFFN_GROUP_SHIFT(w, x, y);
  CLFFN_ROW_PASS_TOKENS();
  const ulong r = 2 * row_id_;
  floatRV acc[CLFFN_WTOKENS], acc2[CLFFN_WTOKENS];
  float tail[CLFFN_WTOKENS], tail2[CLFFN_WTOKENS];
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    acc[t] = acc2[t] = (floatRV)0.0f;
    tail[t] = tail2[t] = 0.0f;
  }
  if (r < rows && live) {
    __global const uchar *row = w + w_off + r * row_bytes;
    __global const uchar *row2 = r + 1 < rows ? row + row_bytes : row; // an odd last row: unused
    __global const float *xr = x + x_off;
    const ulong blocks = cols / CLFFN_QK;
#if CLFFN_ROW_PARTS > 1
    #pragma unroll
    for (uint p = 0; p < CLFFN_ROW_PARTS; ++p) {
      if (p * CLFFN_ROW_PART >= tokens) { break; } // a short pass's empty parts read nothing
      clffn_rows2_part(row, row2, row_bytes, blocks, xr, ldx, p * CLFFN_ROW_PART, tokens, p == 0,
                       acc + p * CLFFN_ROW_PART, acc2 + p * CLFFN_ROW_PART);
    }
#else
    for (ulong b = 0; b < blocks; ++b) {
      const ulong c = b * CLFFN_QK;
      float d, d2;
      floatRV v[CLFFN_NV], v2[CLFFN_NV];
      CLFFN_ROW_AHEAD_N(row, b, row_bytes, 2);
      CLFFN_ROW_AHEAD_N(row2, b, row_bytes, 2);
      clffn_wload_block(row, c, &d, v);
      clffn_wload_block(row2, c, &d2, v2);
      clffn_block_dot(v, d, xr, ldx, c, tokens, acc);
      clffn_block_dot(v2, d2, xr, ldx, c, tokens, acc2);
    }
#endif
#if !CLFFN_QUANTIZED
    for (ulong c = blocks * CLFFN_QK; c < cols; ++c) {
      const float v = clffn_wvalue(row, c), v2 = clffn_wvalue(row2, c);
      for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
        if (t < tokens) {
          tail[t] = fma(v, xr[t * ldx + c], tail[t]);
          tail2[t] = fma(v2, xr[t * ldx + c], tail2[t]);
        }
      }
    }
#endif
  }
  float sum[CLFFN_WTOKENS], sum2[CLFFN_WTOKENS];
#if CLFFN_LANE_LOCAL
  __local float lanes[CLFFN_ROW_ROWS * 16];
  __local float *mine = lanes + get_local_id(1) * 16;
#endif
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    sum[t] = CLFFN_LANE_SUM(acc[t]) + tail[t];
    sum2[t] = CLFFN_LANE_SUM(acc2[t]) + tail2[t];
  }
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t < tokens && r < rows) {
      __global float *yt = y + y_off + t * ldy + r;
      yt[0] = beta != 0.0f ? fma(beta, yt[0], sum[t]) : sum[t];
      if (r + 1 < rows) { yt[1] = beta != 0.0f ? fma(beta, yt[1], sum2[t]) : sum2[t]; }
    }
  }
}

// Three rows per work-item, 3·g to 3·g + 2, from 8 tokens with the direct sums (the host's choice
// for f32, f16 and bf16 there): each vector of x read then serves three rows, where two rows'
// parts of 8 tokens took a load for every two multiply-adds. A part is 8 tokens where AVX-512's
// 32 registers hold its 24 sums, else 4. Each sum runs in clffn_wgemv_rows2's order, to the
// bit. On an Intel Xeon (2 cores), 4096 -> 11008 SwiGLU in f16, 8 tokens 16-22% and 16 tokens
// 8-14% faster than in twos. NDRange (passes, ⌈⌈rows / 3⌉ / CLFFN_ROW_ROWS⌉·CLFFN_ROW_ROWS) or
// its passes along the second dimension (CLFFN_ROW_PASS_TOKENS), work-group (1, CLFFN_ROW_ROWS).
#if CLFFN_ROW_DIRECT && CLFFN_WTOKENS >= 8
  #if defined(__AVX512F__)
    #define CLFFN_ROW3_PART 8
  #else
    #define CLFFN_ROW3_PART 4
  #endif
  #define CLFFN_ROW3_PARTS (CLFFN_WTOKENS / CLFFN_ROW3_PART)
inline CLFFN_ALWAYS_INLINE void clffn_rows3_part(__global const uchar *row0,
                                                 __global const uchar *row1,
                                                 __global const uchar *row2, ulong row_bytes,
                                                 ulong blocks,
                                                 __global const float *xr, ulong ldx, uint t0,
                                                 uint tokens, int ahead,
                                                 floatRV acc0[CLFFN_ROW3_PART],
                                                 floatRV acc1[CLFFN_ROW3_PART],
                                                 floatRV acc2[CLFFN_ROW3_PART]) {
  floatRV a0[CLFFN_ROW3_PART], a1[CLFFN_ROW3_PART], a2[CLFFN_ROW3_PART];
  #pragma unroll
  for (uint t = 0; t < CLFFN_ROW3_PART; ++t) { a0[t] = a1[t] = a2[t] = (floatRV)0.0f; }
  __global const float *xp = xr + t0 * ldx;
  for (ulong b = 0; b < blocks; ++b) {
    const ulong c = b * CLFFN_QK;
    float d0, d1, d2;
    floatRV v0[CLFFN_NV], v1[CLFFN_NV], v2[CLFFN_NV];
    if (ahead) {
      CLFFN_ROW_AHEAD_N(row0, b, row_bytes, 3);
      CLFFN_ROW_AHEAD_N(row1, b, row_bytes, 3);
      CLFFN_ROW_AHEAD_N(row2, b, row_bytes, 3);
    }
    clffn_wload_block(row0, c, &d0, v0);
    clffn_wload_block(row1, c, &d1, v1);
    clffn_wload_block(row2, c, &d2, v2);
    #pragma unroll
    for (uint i = 0; i < CLFFN_NV; ++i) {
      const floatRV w0 = v0[i] * d0, w1 = v1[i] * d1, w2 = v2[i] * d2;
      #pragma unroll
      for (uint t = 0; t < CLFFN_ROW3_PART; ++t) {
        if (t0 + t < tokens) {
          const floatRV xv = CLFFN_CAT(vload, CLFFN_RV)(i, xp + t * ldx + c);
          a0[t] = fma(w0, xv, a0[t]);
          a1[t] = fma(w1, xv, a1[t]);
          a2[t] = fma(w2, xv, a2[t]);
        }
      }
    }
  }
  #pragma unroll
  for (uint t = 0; t < CLFFN_ROW3_PART; ++t) {
    acc0[t] = a0[t];
    acc1[t] = a1[t];
    acc2[t] = a2[t];
  }
}

__kernel __attribute__((reqd_work_group_size(1, CLFFN_ROW_ROWS, 1)))
void clffn_wgemv_rows3(CLFFN_ROWS_PARAMS, const float beta, __global const uint *restrict ids,
                       const ulong8 grp) {
  CLFFN_GROUP_SHIFT(w, x, y);
  CLFFN_ROW_PASS_TOKENS();
  const ulong r = 3 * row_id_;
  floatRV acc[3][CLFFN_WTOKENS];
  float tail[3 * CLFFN_WTOKENS]; // row i's at i·CLFFN_WTOKENS, as clffn_rows_tail takes them
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[0][t] = acc[1][t] = acc[2][t] = (floatRV)0.0f; }
  for (uint t = 0; t < 3 * CLFFN_WTOKENS; ++t) { tail[t] = 0.0f; }
  if (r < rows && live) {
    __global const uchar *row0 = w + w_off + r * row_bytes;
    __global const uchar *row1 = r + 1 < rows ? row0 + row_bytes : row0; // past the last: unused
    __global const uchar *row2 = r + 2 < rows ? row0 + 2 * row_bytes : row0;
    __global const float *xr = x + x_off;
    const ulong blocks = cols / CLFFN_QK;
    #pragma unroll
    for (uint p = 0; p < CLFFN_ROW3_PARTS; ++p) {
      if (p * CLFFN_ROW3_PART >= tokens) { break; }
      clffn_rows3_part(row0, row1, row2, row_bytes, blocks, xr, ldx, p * CLFFN_ROW3_PART, tokens,
                       p == 0,
                       acc[0] + p * CLFFN_ROW3_PART, acc[1] + p * CLFFN_ROW3_PART,
                       acc[2] + p * CLFFN_ROW3_PART);
    }
  #if !CLFFN_QUANTIZED
    clffn_rows_tail(row0, row_bytes, min((ulong)3, rows - r), cols, xr, ldx, tokens, tail);
  #endif
  }
  float sum[3 * CLFFN_WTOKENS]; // row i's at i·CLFFN_WTOKENS, as clffn_store_rows takes them
  #if CLFFN_LANE_LOCAL
  __local float lanes[CLFFN_ROW_ROWS * 16];
  __local float *mine = lanes + get_local_id(1) * 16;
  #endif
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    for (uint i = 0; i < 3; ++i) {
      sum[i * CLFFN_WTOKENS + t] = CLFFN_LANE_SUM(acc[i][t]) + tail[i * CLFFN_WTOKENS + t];
    }
  }
  if (r < rows) {
    clffn_store_rows(y + y_off, ldy, r, min((ulong)3, rows - r), tokens, beta, sum);
  }
}
#endif

// Four rows per work-item, 4·g to 4·g + 3, each summed as clffn_wgemv_rows sums it, up to 4
// tokens (16 accumulators; more would spill): each vector of x read serves four rows, and a
// core streams four rows at once. Where memory outpaces a core's stream of one or two rows (an
// AMD EPYC host: f16, 4096 -> 11008 at one token, two rows at a time, 16.5 GB/s a core against
// ggml's 30.8), that is what bounds the product. NDRange
// (1, ⌈⌈rows / 4⌉ / CLFFN_ROW_ROWS⌉·CLFFN_ROW_ROWS), work-group (1, CLFFN_ROW_ROWS).
#if CLFFN_WTOKENS <= 4
__kernel __attribute__((reqd_work_group_size(1, CLFFN_ROW_ROWS, 1)))
void clffn_wgemv_rows4(CLFFN_ROWS_PARAMS, const float beta, __global const uint *restrict ids,
                       const ulong8 grp) {
  CLFFN_GROUP_SHIFT(w, x, y);
  CLFFN_ROW_PASS_TOKENS();
  const ulong r = 4 * row_id_;
  floatRV acc0[CLFFN_WTOKENS], acc1[CLFFN_WTOKENS], acc2[CLFFN_WTOKENS], acc3[CLFFN_WTOKENS];
  float tail[4 * CLFFN_WTOKENS]; // row i's at i·CLFFN_WTOKENS, as clffn_rows_tail takes them
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    acc0[t] = acc1[t] = acc2[t] = acc3[t] = (floatRV)0.0f;
  }
  for (uint t = 0; t < 4 * CLFFN_WTOKENS; ++t) { tail[t] = 0.0f; }
  if (r < rows && live) {
    __global const uchar *row0 = w + w_off + r * row_bytes;
    __global const uchar *row1 = r + 1 < rows ? row0 + row_bytes : row0;
    __global const uchar *row2 = r + 2 < rows ? row0 + 2 * row_bytes : row0;
    __global const uchar *row3 = r + 3 < rows ? row0 + 3 * row_bytes : row0;
    __global const float *xr = x + x_off;
    const ulong blocks = cols / CLFFN_QK;
    for (ulong b = 0; b < blocks; ++b) {
      const ulong c = b * CLFFN_QK;
      float d0, d1, d2, d3;
      floatRV v0[CLFFN_NV], v1[CLFFN_NV], v2[CLFFN_NV], v3[CLFFN_NV];
      CLFFN_ROW_AHEAD_N(row0, b, row_bytes, 4);
      CLFFN_ROW_AHEAD_N(row1, b, row_bytes, 4);
      CLFFN_ROW_AHEAD_N(row2, b, row_bytes, 4);
      CLFFN_ROW_AHEAD_N(row3, b, row_bytes, 4);
      clffn_wload_block(row0, c, &d0, v0);
      clffn_wload_block(row1, c, &d1, v1);
      clffn_wload_block(row2, c, &d2, v2);
      clffn_wload_block(row3, c, &d3, v3);
      clffn_block_dot(v0, d0, xr, ldx, c, tokens, acc0);
      clffn_block_dot(v1, d1, xr, ldx, c, tokens, acc1);
      clffn_block_dot(v2, d2, xr, ldx, c, tokens, acc2);
      clffn_block_dot(v3, d3, xr, ldx, c, tokens, acc3);
    }
#if !CLFFN_QUANTIZED
    clffn_rows_tail(row0, row_bytes, min((ulong)4, rows - r), cols, xr, ldx, tokens, tail);
#endif
  }
  float sum[4 * CLFFN_WTOKENS]; // row i's at i·CLFFN_WTOKENS, as clffn_store_rows takes them
#if CLFFN_LANE_LOCAL
  __local float lanes[CLFFN_ROW_ROWS * 16];
  __local float *mine = lanes + get_local_id(1) * 16;
#endif
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    sum[t] = CLFFN_LANE_SUM(acc0[t]) + tail[t];
    sum[CLFFN_WTOKENS + t] = CLFFN_LANE_SUM(acc1[t]) + tail[CLFFN_WTOKENS + t];
    sum[2 * CLFFN_WTOKENS + t] = CLFFN_LANE_SUM(acc2[t]) + tail[2 * CLFFN_WTOKENS + t];
    sum[3 * CLFFN_WTOKENS + t] = CLFFN_LANE_SUM(acc3[t]) + tail[3 * CLFFN_WTOKENS + t];
  }
  if (r < rows) {
    clffn_store_rows(y + y_off, ldy, r, min((ulong)4, rows - r), tokens, beta, sum);
  }
}
#endif
#endif

// ---- y = x̃·Wᵀ, each input row rounded to q8_0 first (q8_0 and q4_0 weights, on request) --------
//
// Where the context asks for quantized inputs (clffn_context_set_quantized_inputs), a product
// over q8_0 or q4_0 weights first rounds each of its input rows to q8_0 blocks as GGUF's
// reference quantizer does (the input type ggml's dot products take for both), then multiplies in
// integers: each block's 32 products summed exactly, times the weight's and the input's scales
// in f32. clffn_xquant writes each token's row at xs = CLFFN_XQ_BYTES(blocks) apart, P =
// ⌈blocks / 2⌉ pairs of blocks, the block past the last (where blocks is odd) all zero:
//   q  char[64·P]  the quants; q + 128 as unsigned bytes where the row kernel takes them so
//                  (q4_0 weights at 2 tokens, and beyond where the 16-row form does not run;
//                  q8_0 ones with VNNI, likewise; CLFFN_XQ_OFFSET)
//   s  float[2·P]  each block's scale, d rounded to f16 as GGUF stores it (then 64-byte padding)
//   c  int[2·P]    q4_0 at one token, and both types in the 16-row form (CLFFN_XQ_C): each
//                  block's -Σq, for the offset of the weights' unsigned form (padded)
// Each row's quants take a byte a value, not the four of an f32 x: at 4 tokens, 16 KB against
// 64 KB for 4096 values, so the rows stay in a CPU's first-level cache beside the weights.
// The row kernel's head, the same for q8_0 inputs and bf16 ones (below), which the host
// launches alike.
#define CLFFN_ROWS_QX_KERNEL                                                                   \
  __kernel __attribute__((reqd_work_group_size(CLFFN_ROW_SPLIT, CLFFN_ROW_ROWS, 1))) void      \
  clffn_wgemv_rows_qx(__global const uchar *restrict w, const ulong w_off,                     \
                      const ulong row_bytes, const ulong rows, const ulong cols,               \
                      __global const uchar *restrict xq, const ulong xs,                       \
                      const uint max_tokens, __global const uint *restrict count,              \
                      const uint count_at, __global float *restrict y, const ulong y_off,      \
                      const ulong ldy, const float beta,                          \
                      __global const uint *restrict ids, const ulong8 grp)
// Both forms' first lines: as CLFFN_GROUP_SHIFT, but the quantized rows, the launch's own
// scratch, by the step.
#define CLFFN_ROWS_QX_SHIFT()                                                                \
  CLFFN_GROUP_EXPERT();                                                                      \
  w += expert_ * grp.s0;                                                                     \
  xq += get_global_id(2) * grp.s1;                                                           \
  y += group_ * grp.s2;                                                                      \
  count += group_
// clffn_xquant's head, the same for q8_0 rows and bf16 ones (below), and its first lines: x
// by the expert (grp.s1), the rows it writes, the launch's scratch, by the step (grp.s2).
#define CLFFN_XQUANT_KERNEL                                                                  \
  __kernel void clffn_xquant(__global const float *restrict x, const ulong x_off,            \
                             const ulong ldx, const ulong cols, const uint max_tokens,       \
                             __global const uint *restrict count, const uint count_at,       \
                             __global uchar *restrict xq, const ulong xs,                    \
                             __global const uint *restrict ids, const ulong8 grp)
#define CLFFN_XQUANT_SHIFT()                                                                 \
  CLFFN_GROUP_EXPERT();                                                                      \
  x += group_ * grp.s1;                                                                      \
  xq += get_global_id(2) * grp.s2;                                                           \
  count += group_
#if CLFFN_QUANTIZED
// Where the compiler is clang targeting x86 with AVX-512BW (POCL on such CPUs), a pair of blocks
// goes through vpmaddubsw (unsigned by signed bytes, pairs summed into 16 bits) and vpmaddwd
// (pairs of those into 32 bits): 64 products in two instructions. No pair sum passes 16 bits:
// q4_0 takes x's quants as q + 128 (unsigned, at most 255) times q_w - 8 (at least -8), 2·255·8,
// and takes 128·Σ(q_w - 8) off once a row's pair serves every token; q8_0 takes the weights'
// magnitudes (unsigned, at most 128) times x's quants with the weights' signs, 2·128·127.
// Where the CPU also has AVX-512 VNNI (CLFFN_QX_VNNI, which the host sets from its own CPU, a
// CPU device's; POCL's compiler targets a CPU model that may lack it), vpdpbusd does both steps
// and the add in one, with no 16-bit stage: q8_0 then takes x as q + 128 like q4_0, against the
// signed weights, less 128·Σq_w. Where clang targets x86 with AVX2 alone (POCL on Zen 1-3 and
// Intel's client cores), the same products go through the 256-bit forms of both instructions,
// two a pair of blocks (CLFFN_QX_AVX2), the same sums lane by lane. Elsewhere each block is summed
// in int arithmetic, value by value.
#ifndef CLFFN_QX_AVX512
  #if defined(__clang__) && defined(__AVX512BW__) && CLFFN_NATIVE_HALF
    #define CLFFN_QX_AVX512 1
  #else
    #define CLFFN_QX_AVX512 0
  #endif
#endif
#ifndef CLFFN_QX_AVX2
  #if defined(__clang__) && defined(__AVX2__) && CLFFN_NATIVE_HALF && !CLFFN_QX_AVX512
    #define CLFFN_QX_AVX2 1
  #else
    #define CLFFN_QX_AVX2 0
  #endif
#endif
// either x86 form: pairs of blocks in 64-byte vectors, one register (AVX-512) or two (AVX2)
#define CLFFN_QX_X86 (CLFFN_QX_AVX512 || CLFFN_QX_AVX2)
#ifndef CLFFN_QX_VNNI
  #define CLFFN_QX_VNNI 0
#endif
#if CLFFN_QX_AVX512 && CLFFN_QX_VNNI
  #define CLFFN_QX_DPBUSD 1
  // the functions that use it, and the row function not inlined: POCL's work-group function,
  // which would take its body, is compiled for the target's features alone
  #define CLFFN_QX_TARGET __attribute__((target("avx512vnni")))
  #define CLFFN_QX_ROW_INLINE __attribute__((noinline)) CLFFN_QX_TARGET
#else
  #define CLFFN_QX_DPBUSD 0
  #define CLFFN_QX_TARGET
  #define CLFFN_QX_ROW_INLINE inline CLFFN_ALWAYS_INLINE
#endif

  // this program's rows sixteen to a work-item (CLFFN_QX_WIDE), and in the 16-row form
  // (clffn_qx_rows16) where the CPU has VNNI
  #define CLFFN_QX_WIDE_HERE \
    CLFFN_QX_WIDE(CLFFN_ROW_SPLIT, CLFFN_WTOKENS, CLFFN_WTYPE == CLFFN_WTYPE_Q4_0)
  #if CLFFN_QX_DPBUSD && CLFFN_QX_WIDE_HERE
    #define CLFFN_QX_R16 1
  #else
    #define CLFFN_QX_R16 0
  #endif
  // the 16-row form in 256-bit vectors where the CPU has AVX2 alone (clffn_qx_rows16_avx2), for
  // q4_0, whose unsigned nibbles' products with x's quants vpmaddubsw sums in 16 bits
  #if CLFFN_QX_AVX2 && CLFFN_QX_WIDE_HERE && CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 && CLFFN_WTOKENS > 1
    #define CLFFN_QX_R16_AVX2 1
  #else
    #define CLFFN_QX_R16_AVX2 0
  #endif
  // either 16-row form: x's quantized rows block-major (CLFFN_XQ_SLOT)
  #define CLFFN_QX_TILED (CLFFN_QX_R16 || CLFFN_QX_R16_AVX2)
  #if (CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 && CLFFN_WTOKENS == 1) || CLFFN_QX_WIDE_HERE
    #define CLFFN_XQ_C 1
  #else
    #define CLFFN_XQ_C 0
  #endif
  #if (CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 && !CLFFN_XQ_C) || \
      (CLFFN_WTYPE == CLFFN_WTYPE_Q8_0 && CLFFN_QX_DPBUSD && !CLFFN_XQ_C)
    #define CLFFN_XQ_OFFSET 128
  #else
    #define CLFFN_XQ_OFFSET 0
  #endif

// The 16-row form reads the quantized inputs block-major: block b's quants for token t are at
// slot b·CLFFN_WTOKENS + t (32 bytes each, 2·P blocks), then the scales and the offset sums (these
// times 8 for q4_0, 128 for q8_0) by the same slots, so that one pointer a block reaches every
// token's at fixed displacements (token-major rows xs apart cost three pointers a token, kept on
// the stack). Elsewhere each token's row is xs bytes: P pairs of quants, the scales, the sums.
#define CLFFN_XQ_SLOT(b, t) ((b) * CLFFN_WTOKENS + (t))
// bytes from xq to that layout's scales and to its offset sums, for P pairs of blocks
#define CLFFN_XQ_SCALES_AT(pairs) (2 * (pairs) * CLFFN_WTOKENS * CLFFN_QK)
#define CLFFN_XQ_SUMS_AT(pairs) (2 * (pairs) * CLFFN_WTOKENS * (CLFFN_QK + 4))

// NDRange (2·P, max_tokens), any work-group: one block of one token's row per work-item. A
// block with a NaN or an infinity gets a NaN scale, so that token's outputs are NaN, as the f32
// path's would be (GGUF's quantizer gives such a block finite quants and scale).
CLFFN_XQUANT_KERNEL {
  CLFFN_XQUANT_SHIFT();
  CLFFN_PASS_TOKENS();
  const ulong b = get_global_id(0), blocks = cols / CLFFN_QK, pairs = (blocks + 1) / 2;
  const uint t = get_global_id(1);
  if (live && t < tokens && b < 2 * pairs) {
    int16 lo = (int16)0, hi = (int16)0;
    float d = 0.0f;
    if (b < blocks) {
      __global const float *xb = x + x_off + t * ldx + b * CLFFN_QK;
      const float16 v0 = vload16(0, xb), v1 = vload16(1, xb);
      // eight lanes at a time: Oclgrind 21.10 loses a float16's upper lanes in .hi
      const float8 p0 = vload8(0, xb), p1 = vload8(1, xb), p2 = vload8(2, xb), p3 = vload8(3, xb);
      const float8 a8 = fmax(fmax(fabs(p0), fabs(p1)), fmax(fabs(p2), fabs(p3)));
      const float4 a4 = fmax(a8.lo, a8.hi);
      const float amax = fmax(fmax(a4.s0, a4.s1), fmax(a4.s2, a4.s3));
      // the largest exponent field: all ones where a value is a NaN or an infinity; the
      // saturating conversions take a NaN to 0
      const uint8 e8 = max(max(as_uint8(p0) & 0x7f800000u, as_uint8(p1) & 0x7f800000u),
                           max(as_uint8(p2) & 0x7f800000u, as_uint8(p3) & 0x7f800000u));
      const uint4 e4 = max(e8.lo, e8.hi);
      const int finite = max(max(e4.s0, e4.s1), max(e4.s2, e4.s3)) != 0x7f800000u;
      const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
      lo = convert_int16_sat(round(v0 * id));
      hi = convert_int16_sat(round(v1 * id));
      ushort h; // the scale as GGUF stores it: rounded to f16, to nearest even
      vstore_half_rte(dd, 0, (__private half *)&h);
      d = finite ? vload_half(0, (__private const half *)&h) : NAN;
    }
  #if CLFFN_QX_TILED // block-major (see CLFFN_XQ_SLOT)
    __global uchar *q = xq + CLFFN_XQ_SLOT(b, t) * CLFFN_QK;
    ((__global float *)(xq + CLFFN_XQ_SCALES_AT(pairs)))[CLFFN_XQ_SLOT(b, t)] = d;
  #else
    __global uchar *row = xq + t * xs;
    __global uchar *q = row + b * CLFFN_QK;
    ((__global float *)(row + 64 * pairs))[b] = d;
  #endif
    vstore16(convert_uchar16(lo + CLFFN_XQ_OFFSET), 0, q); // two's complement where 0
    vstore16(convert_uchar16(hi + CLFFN_XQ_OFFSET), 1, q);
  #if CLFFN_XQ_C // through private memory: Oclgrind 21.10 mistracks swizzles of upper lanes
    int v[32];
    vstore16(lo, 0, v);
    vstore16(hi, 1, v);
    int sum = 0;
    for (uint i = 0; i < 32; ++i) { sum += v[i]; }
    #if CLFFN_QX_TILED
    ((__global int *)(xq + CLFFN_XQ_SUMS_AT(pairs)))[CLFFN_XQ_SLOT(b, t)] =
        -sum * (CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 ? 8 : 128);
    #else
    ((__global int *)(row + CLFFN_XQ_BYTES(blocks)))[b] = -sum;
    #endif
  #endif
  }
}

#if CLFFN_QX_X86
typedef char clffn_v64qi __attribute__((__vector_size__(64)));
typedef short clffn_v32hi __attribute__((__vector_size__(64)));
typedef int clffn_v16si __attribute__((__vector_size__(64)));
typedef char clffn_s8x32 __attribute__((ext_vector_type(32)));
typedef char clffn_s8x64 __attribute__((ext_vector_type(64)));
typedef short clffn_s16x32 __attribute__((ext_vector_type(32)));
  #define CLFFN_I16 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
  #define CLFFN_I16B 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31
  #define CLFFN_I32 CLFFN_I16, CLFFN_I16B
  #define CLFFN_I32B 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, \
                     51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
  #define CLFFN_I64 CLFFN_I32, CLFFN_I32B
  // a pair's two scales, each over its block's eight lanes
  #define CLFFN_PAIR_LANES(v2) \
    __builtin_shufflevector(v2, v2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)

  #if CLFFN_QX_AVX512
    // vpmaddubsw: unsigned bytes u by signed bytes s, adjacent pairs summed into 16 bits
    #define CLFFN_QX_MADDUBS(u, s) __builtin_ia32_pmaddubsw512((u), (s))
    // vpmaddwd: 16-bit lanes by 16-bit lanes, adjacent pairs summed into 32 bits
    #define CLFFN_QX_MADDWD(a, b) __builtin_ia32_pmaddwd512((a), (b))
  #else
    // the same from two 256-bit instructions, one a half: both sum adjacent lanes alone, so
    // the halves' results side by side are the whole vector's
    #define CLFFN_QX_HALVES(op, a, b, lo, hi, whole)                                           \
      __builtin_shufflevector(                                                               \
          op(__builtin_shufflevector(a, a, lo), __builtin_shufflevector(b, b, lo)),          \
          op(__builtin_shufflevector(a, a, hi), __builtin_shufflevector(b, b, hi)), whole)
    #define CLFFN_QX_MADDUBS(u, s) \
      CLFFN_QX_HALVES(__builtin_ia32_pmaddubsw256, (u), (s), CLFFN_I32, CLFFN_I32B, CLFFN_I32)
    #define CLFFN_QX_MADDWD(a, b) \
      CLFFN_QX_HALVES(__builtin_ia32_pmaddwd256, (a), (b), CLFFN_I16, CLFFN_I16B, CLFFN_I16)
  #endif

// 64 bytes at p, no alignment assumed: four 16-byte loads that the compiler joins, or one.
inline CLFFN_ALWAYS_INLINE clffn_s8x64 clffn_load64(__global const char *p) {
  #if CLFFN_QX_AVX2
  // one unaligned load: with AVX2, clang rebuilt the joined loads' upper half from eight-byte
  // pieces (eight instructions a pair; q4_0, 4096 -> 11008 SwiGLU, one token: 10.0 -> 5.7 ms)
  typedef char clffn_s8x64u __attribute__((ext_vector_type(64), aligned(1)));
  return *(__global const clffn_s8x64u *)p;
  #else
  const clffn_s8x32 a = __builtin_shufflevector(vload16(0, p), vload16(1, p), CLFFN_I32);
  const clffn_s8x32 b = __builtin_shufflevector(vload16(2, p), vload16(3, p), CLFFN_I32);
  return __builtin_shufflevector(a, b, CLFFN_I64);
  #endif
}

// A row's pair of blocks at ba (and ba + CLFFN_BLOCK_BYTES where two, else zeros), as the
// products take it: *w the signed bytes (q4_0: q - 8; q8_0: the quants' signs, -1, 0 or 1, whose
// product with x's quants vpmaddubsw's signed side takes), *u the unsigned ones (q8_0: the
// magnitudes), *off (q4_0) the 32-bit lanes' 128·Σ(q - 8), and the scales.
typedef struct clffn_qx_w {
  clffn_s8x64 w, u;
  clffn_v16si off;
  float16 d;
} clffn_qx_w;

inline CLFFN_ALWAYS_INLINE CLFFN_QX_TARGET clffn_qx_w clffn_qx_pair(__global const uchar *ba,
                                                                    const int two) {
  const clffn_v32hi ones = (clffn_v32hi)((clffn_s16x32)(short)1);
  __global const uchar *bb = ba + CLFFN_BLOCK_BYTES;
  clffn_qx_w r;
  #if CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 && CLFFN_XQ_C
  // one token: the nibbles themselves, unsigned, times x's signed quants; x's rows carry the
  // offset (c), which saves a subtraction a nibble and the row's own offset sums
  const uchar16 qa = vload16(0, ba + 2), qb = two ? vload16(0, bb + 2) : (uchar16)0;
  const clffn_s8x32 both = __builtin_shufflevector(as_char16(qa), as_char16(qb), CLFFN_I32);
  const clffn_s8x32 lo = both & (char)15, hi = (both >> (char)4) & (char)15;
  r.u = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 32,
                                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 16, 17,
                                18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 48, 49, 50,
                                51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63);
  r.w = (clffn_s8x64)0;
  r.off = (clffn_v16si)((int16)0);
  #elif CLFFN_WTYPE == CLFFN_WTYPE_Q4_0
  const uchar16 qa = vload16(0, ba + 2), qb = two ? vload16(0, bb + 2) : (uchar16)0x88;
  const clffn_s8x32 both = __builtin_shufflevector(as_char16(qa), as_char16(qb), CLFFN_I32);
  const clffn_s8x32 lo = (both & (char)15) - (char)8, hi = ((both >> (char)4) & (char)15) - (char)8;
  // each block's low nibbles (values 0-15), then its high ones (16-31)
  r.w = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 32,
                                33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 16, 17,
                                18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 48, 49, 50,
                                51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63);
  r.u = (clffn_s8x64)0;
  const clffn_v64qi c128 = (clffn_v64qi)((clffn_s8x64)(char)-128); // the byte 128, unsigned
  r.off = CLFFN_QX_MADDWD(CLFFN_QX_MADDUBS(c128, (clffn_v64qi)r.w), ones);
  #else
  __global const char *qa = (__global const char *)(ba + 2), *qb = (__global const char *)(bb + 2);
  const clffn_s8x32 a = __builtin_shufflevector(vload16(0, qa), vload16(1, qa), CLFFN_I32);
  const clffn_s8x32 b = two ? __builtin_shufflevector(vload16(0, qb), vload16(1, qb), CLFFN_I32)
                            : (clffn_s8x32)0;
  const clffn_s8x64 wq = __builtin_shufflevector(a, b, CLFFN_I64);
    #if CLFFN_QX_DPBUSD // x as q + 128 against the signed weights, less 128·Σq_w a lane
  r.w = wq;
  r.u = (clffn_s8x64)0;
  const clffn_v16si c128 = (clffn_v16si)((int16)(int)0x80808080);
  r.off = __builtin_ia32_vpdpbusd512((clffn_v16si)((int16)0), c128, (clffn_v16si)wq);
    #else
  const clffn_s8x64 neg = wq < (char)0;
  r.u = neg ? -wq : wq; // -(-128) wraps to the byte 128, the magnitude read unsigned
  r.w = neg;            // -1 where negative, else 0: x's quants are negated there (below)
  r.off = (clffn_v16si)((int16)0);
    #endif
  #endif
  // both scales in one conversion (clang's __fp16, as clffn_whalf takes one)
  const ushort2 h2 =
      (ushort2)(*(__global const ushort *)ba, two ? *(__global const ushort *)bb : (ushort)0);
  const float2 d2 = __builtin_convertvector(__builtin_bit_cast(clffn_fp16x2, h2), float2);
  r.d = CLFFN_PAIR_LANES(d2);
  return r;
}

// acc[t] += the pair's products with token t's quantized row (pair p), for the pass's tokens.
inline CLFFN_ALWAYS_INLINE CLFFN_QX_TARGET void clffn_qx_dot(const clffn_qx_w *pw,
                                                             __global const uchar *xq, ulong xs,
                                                             ulong pairs, ulong p, uint tokens,
                                                             float16 acc[CLFFN_WTOKENS]) {
  const clffn_v32hi ones = (clffn_v32hi)((clffn_s16x32)(short)1);
  #pragma unroll
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t < tokens) {
      __global const uchar *xt = xq + t * xs;
      const clffn_s8x64 xv = clffn_load64((__global const char *)xt + 64 * p);
  #if CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 && CLFFN_XQ_C && CLFFN_QX_DPBUSD
      const int2 c2 = vload2(p, (__global const int *)(xt + CLFFN_XQ_BYTES(2 * pairs)));
      const clffn_v16si d = __builtin_ia32_vpdpbusd512((clffn_v16si)CLFFN_PAIR_LANES(c2),
                                                       (clffn_v16si)pw->u, (clffn_v16si)xv);
  #elif CLFFN_QX_DPBUSD // q4_0 from 2 tokens on, q8_0: x as q + 128
      const clffn_v16si d =
          __builtin_ia32_vpdpbusd512(-pw->off, (clffn_v16si)xv, (clffn_v16si)pw->w);
  #elif CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 && CLFFN_XQ_C
      const int2 c2 = vload2(p, (__global const int *)(xt + CLFFN_XQ_BYTES(2 * pairs)));
      const clffn_v16si d = CLFFN_QX_MADDWD(
                                CLFFN_QX_MADDUBS((clffn_v64qi)pw->u, (clffn_v64qi)xv),
                                ones) +
                            (clffn_v16si)CLFFN_PAIR_LANES(c2);
  #elif CLFFN_WTYPE == CLFFN_WTYPE_Q4_0
      const clffn_v16si d = CLFFN_QX_MADDWD(
                                CLFFN_QX_MADDUBS((clffn_v64qi)xv, (clffn_v64qi)pw->w),
                                ones) -
                            pw->off;
  #else
      const clffn_s8x64 sx = (xv ^ pw->w) - pw->w; // -x where the weight is negative
      const clffn_v16si d = CLFFN_QX_MADDWD(
          CLFFN_QX_MADDUBS((clffn_v64qi)pw->u, (clffn_v64qi)sx), ones);
  #endif
      const float2 s2 = vload2(p, (__global const float *)(xt + 64 * pairs));
      acc[t] = fma(__builtin_convertvector(d, float16), pw->d * CLFFN_PAIR_LANES(s2), acc[t]);
    }
  }
}
#endif

// The portable form of one block: Σ_j q_w[j]·q_x[j] in int arithmetic.
inline int clffn_qx_block_isum(__global const uchar *blk, __global const uchar *xb) {
  int isum = 0;
  for (uint j = 0; j < 16; ++j) {
#if CLFFN_WTYPE == CLFFN_WTYPE_Q4_0
    const int qb = blk[2 + j];
    const int x0 = (char)(xb[j] ^ CLFFN_XQ_OFFSET), x1 = (char)(xb[j + 16] ^ CLFFN_XQ_OFFSET);
    isum += ((qb & 15) - 8) * x0 + ((qb >> 4) - 8) * x1;
#else
    __global const char *qw = (__global const char *)(blk + 2);
    const int x0 = (char)(xb[j] ^ CLFFN_XQ_OFFSET), x1 = (char)(xb[j + 16] ^ CLFFN_XQ_OFFSET);
    isum += qw[j] * x0 + qw[j + 16] * x1;
#endif
  }
  return isum;
}

// A row a work-item (clffn_qx_row, up to 2 tokens) is one stream of weights a core, and on an
// Intel Xeon host (POCL, 2 cores) the hardware prefetcher kept too few of its lines in flight:
// as each pair of blocks is read, the line CLFFN_QX_PREFETCH bytes ahead is prefetched (past a
// row's end, the rows that follow, the next work-items'). 4096 -> 11008 SwiGLU with quantized
// inputs, three alternated rounds, best of 15, ms, before → after: one token q8_0 7.7-8.3 →
// 5.7-6.1, q4_0 6.3-8.7 → 2.7-3.0; two tokens q8_0 9.7-9.9 → 5.9-6.8, q4_0 11.4-11.6 → 4.4-5.0.
// 2048 and 8192 bytes ahead measured within this host's noise of 4096; 1024 short of them.
// prefetcht0 where clang compiles for x86; elsewhere nothing.
#ifndef CLFFN_QX_PREFETCH
  #define CLFFN_QX_PREFETCH 4096 // bytes ahead; 0: none
#endif
// The sixteen-row form (clffn_qx_rows16) is sixteen streams a core, 18 or 34 bytes a step each,
// more than the hardware prefetcher follows: once a line of steps, each row's line
// CLFFN_QX_R16_PREFETCH bytes on is prefetched, past its end the same row of the next work-item's
// sixteen. 4096 -> 11008 SwiGLU, three alternated rounds, best of 20 (10 at 16 tokens), ms,
// none → 1024 bytes: q4_0 one token 2.2-2.5 → 1.8-1.9, q8_0 4 tokens 5.2-5.4 → 3.6-4.0, q4_0 16
// tokens 6.9-7.7 → 6.1-6.6; Qwen3's 128-expert layer in q4_0 at one token 0.71-0.72 → 0.62-0.67
// (POCL_AFFINITY=1). 512 bytes measured within the rounds' spread of 1024.
#ifndef CLFFN_QX_R16_PREFETCH
  #define CLFFN_QX_R16_PREFETCH 1024 // bytes ahead; 0: none
#endif

// sum[t] (+)= row's products with the pass's quantized rows; the portable form adds each
// block's sum in block order, the x86 forms pairs of blocks in 16 lanes.
CLFFN_QX_ROW_INLINE void clffn_qx_row(__global const uchar *row, ulong blocks,
                                             __global const uchar *xq, ulong xs, uint tokens,
                                             float sum[CLFFN_WTOKENS]) {
  const ulong pairs = (blocks + 1) / 2;
#if CLFFN_QX_X86
  float16 acc[CLFFN_WTOKENS];
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] = (float16)0.0f; }
  for (ulong p = 0; p < blocks / 2; ++p) {
    CLFFN_PREFETCH_AHEAD(row + 2 * p * CLFFN_BLOCK_BYTES, CLFFN_QX_PREFETCH);
    const clffn_qx_w pw = clffn_qx_pair(row + 2 * p * CLFFN_BLOCK_BYTES, 1);
    clffn_qx_dot(&pw, xq, xs, pairs, p, tokens, acc);
  }
  if (blocks % 2) { // the last block alone
    const ulong p = blocks / 2;
    const clffn_qx_w pw = clffn_qx_pair(row + 2 * p * CLFFN_BLOCK_BYTES, 0);
    clffn_qx_dot(&pw, xq, xs, pairs, p, tokens, acc);
  }
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    const float8 h = acc[t].lo + acc[t].hi;
    sum[t] = dot(h.lo + h.hi, (float4)1.0f);
  }
#else
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[t] = 0.0f; }
  for (ulong b = 0; b < blocks; ++b) {
    __global const uchar *blk = row + b * CLFFN_BLOCK_BYTES;
    const float dw = clffn_whalf(blk);
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        __global const uchar *xt = xq + t * xs;
        const int isum = clffn_qx_block_isum(blk, xt + b * CLFFN_QK);
        const float dx = ((__global const float *)(xt + 64 * pairs))[b];
        sum[t] = fma((float)isum, dw * dx, sum[t]);
      }
    }
  }
#endif
}

#if CLFFN_QX_WIDE_HERE
  #define CLFFN_QX_R CLFFN_QX_WIDE_ROWS // rows a work-item (the host launches alike)
#else
  #define CLFFN_QX_R 1
#endif

#if CLFFN_QX_TILED
// Both 16-row forms' first steps for block b of the rows at rp[16] (o bytes in): a line ahead
// prefetched in each row as a line of blocks begins, the rows' scales (dw), and their quants'
// 16 bytes, four rows in each of p0 … p3.
#define CLFFN_QX16_BLOCK()                                                                     \
  if (CLFFN_QX_R16_PREFETCH > 0 && b % (64 / CLFFN_BLOCK_BYTES) == 0) {                        \
    _Pragma("unroll") for (uint i = 0; i < 16; ++i) {                                          \
      CLFFN_PREFETCH_NEXT(rp[i], o + CLFFN_QX_R16_PREFETCH, row_bytes, 16);                    \
    }                                                                                          \
  }                                                                                            \
  ushort sc[16];                                                                               \
  uint4 a[16];                                                                                 \
  _Pragma("unroll") for (uint i = 0; i < 16; ++i) {                                            \
    sc[i] = *(__global const ushort *)(rp[i] + o);                                             \
    a[i] = as_uint4(vload16(0, rp[i] + o + 2));                                                \
  }                                                                                            \
  const float16 dw = clffn_halves16(vload16(0, sc));                                           \
  const uint16 p0 = (uint16)(a[0], a[1], a[2], a[3]), p1 = (uint16)(a[4], a[5], a[6], a[7]);   \
  const uint16 p2 = (uint16)(a[8], a[9], a[10], a[11]);                                        \
  const uint16 p3 = (uint16)(a[12], a[13], a[14], a[15])

#endif

#if CLFFN_QX_R16
// acc[t] (lane i: row i of 16 from row0, row_bytes apart; rows past `rows` repeat the last) =
// the rows' products with the pass's quantized rows. Each block's quants are transposed a dword
// (4 values) a lane for the 16 rows, so that one vpdpbusd, x's dword broadcast, adds 4 products
// to each of 16 outputs, and one conversion and multiply-add of 16 lanes a block and token take
// every row's scale, where one row a work-item takes three instructions a pair of blocks, row and
// token. ggml's repacked q4_0_8x8 reaches the same by storing the weights interleaved; these are
// the stored bytes, transposed in registers: 16 loads and three shuffles per dword, paid once
// for the pass's tokens (vpgatherdd measured twice as slow at 4 tokens). x's signed quants go on
// the side vpdpbusd broadcasts, so the weights go unsigned: q4_0's nibbles q, whose products plus
// 8·(-Σx) from x's rows (CLFFN_XQ_C) are Σ(q - 8)·x; q8_0's quants + 128, less 128·Σx.
CLFFN_QX_ROW_INLINE void clffn_qx_rows16(__global const uchar *row0, ulong row_bytes, uint rows,
                                         ulong blocks, __global const uchar *xq, uint tokens,
                                         float16 acc[CLFFN_WTOKENS]) {
  const ulong pairs = (blocks + 1) / 2;
  __global const float *ds = (__global const float *)(xq + CLFFN_XQ_SCALES_AT(pairs));
  __global const int *cs = (__global const int *)(xq + CLFFN_XQ_SUMS_AT(pairs));
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] = (float16)0.0f; }
  const clffn_v16si m4 = (clffn_v16si)((int16)0x0f0f0f0f);
  __global const uchar *rp[16];
  for (uint i = 0; i < 16; ++i) { rp[i] = row0 + min(i, rows - 1) * row_bytes; }
  for (ulong b = 0; b < blocks; ++b) {
    const ulong o = b * CLFFN_BLOCK_BYTES;
    CLFFN_QX16_BLOCK();
    clffn_v16si w[8];
  #define CLFFN_QX_T(j, p0, p1, p2, p3)                                                          \
    (clffn_v16si)(uint16)(__builtin_shufflevector(p0, p1, j, 4 + j, 8 + j, 12 + j, 16 + j,       \
                                                  20 + j, 24 + j, 28 + j),                       \
                          __builtin_shufflevector(p2, p3, j, 4 + j, 8 + j, 12 + j, 16 + j,       \
                                                  20 + j, 24 + j, 28 + j))
  #if CLFFN_WTYPE == CLFFN_WTYPE_Q4_0
  #define CLFFN_QX_Z(j)                                                                          \
    {                                                                                            \
      const clffn_v16si q = CLFFN_QX_T(j, p0, p1, p2, p3);                                       \
      w[j] = q & m4;                                                                             \
      w[j + 4] = (q >> 4) & m4;                                                                  \
    }
    CLFFN_QX_Z(0) CLFFN_QX_Z(1) CLFFN_QX_Z(2) CLFFN_QX_Z(3)
  #else // q8_0: the signed quants made unsigned (+ 128), less 128·Σx below
    uint4 e[16];
  #pragma unroll
    for (uint i = 0; i < 16; ++i) { e[i] = as_uint4(vload16(0, rp[i] + o + 18)); }
    const uint16 q0 = (uint16)(e[0], e[1], e[2], e[3]), q1 = (uint16)(e[4], e[5], e[6], e[7]);
    const uint16 q2 = (uint16)(e[8], e[9], e[10], e[11]);
    const uint16 q3 = (uint16)(e[12], e[13], e[14], e[15]);
    const clffn_v16si flip = (clffn_v16si)((int16)(int)0x80808080);
  #define CLFFN_QX_Z(j)                                                                          \
    w[j] = CLFFN_QX_T(j, p0, p1, p2, p3) ^ flip;                                                 \
    w[j + 4] = CLFFN_QX_T(j, q0, q1, q2, q3) ^ flip;
    CLFFN_QX_Z(0) CLFFN_QX_Z(1) CLFFN_QX_Z(2) CLFFN_QX_Z(3)
  #endif
  #undef CLFFN_QX_Z
  #undef CLFFN_QX_T
    __global const int *xd = (__global const int *)(xq + CLFFN_XQ_SLOT(b, 0) * CLFFN_QK);
    __global const float *dx = ds + CLFFN_XQ_SLOT(b, 0);
    __global const int *cx = cs + CLFFN_XQ_SLOT(b, 0);
  #pragma unroll
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        clffn_v16si sum = (clffn_v16si)((int16)cx[t]);
  #pragma unroll
        for (uint k = 0; k < 8; ++k) {
          sum = __builtin_ia32_vpdpbusd512(sum, w[k], (clffn_v16si)((int16)xd[8 * t + k]));
        }
        acc[t] = fma(__builtin_convertvector(sum, float16), dw * dx[t], acc[t]);
      }
    }
  }
}
#endif

#if CLFFN_QX_R16_AVX2
typedef char clffn_v32qi __attribute__((__vector_size__(32)));
typedef short clffn_v16hi __attribute__((__vector_size__(32)));
typedef int clffn_v8si __attribute__((__vector_size__(32)));
// clffn_qx_rows16 where the CPU has AVX2 without VNNI, for q4_0 from 2 tokens: the same
// transposed dwords, eight rows a register, and for each a vpmaddubsw (the nibbles unsigned
// against x's dword broadcast, signed; a pair at most 2·15·128) into 16-bit sums, added over the
// block's eight dwords (at most 8·3840, within 16 bits), then one vpmaddwd into each row's 32-bit
// sum. The integer sums are the VNNI form's, and so is every float step, so both give the same
// bits. Every token of the pass in one walk of the rows, though their sums outnumber AVX2's 16
// registers: in walks of 2, 4 or 8 tokens, each transposing the blocks again, 16 tokens took
// 26-38 ms against 16-26 (4096 -> 11008 SwiGLU, AMD EPYC, 2 cores; docs/PERFORMANCE.md).
CLFFN_QX_ROW_INLINE void clffn_qx_rows16_avx2(__global const uchar *row0, ulong row_bytes,
                                              uint rows, ulong blocks,
                                              __global const uchar *xq, uint tokens,
                                              float16 acc[CLFFN_WTOKENS]) {
  const ulong pairs = (blocks + 1) / 2;
  __global const float *ds = (__global const float *)(xq + CLFFN_XQ_SCALES_AT(pairs));
  __global const int *cs = (__global const int *)(xq + CLFFN_XQ_SUMS_AT(pairs));
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] = (float16)0.0f; }
  const uint8 m4 = (uint8)0x0f0f0f0fu;
  const clffn_v16hi ones = (clffn_v16hi)((short16)1);
  __global const uchar *rp[16];
  for (uint i = 0; i < 16; ++i) { rp[i] = row0 + min(i, rows - 1) * row_bytes; }
  for (ulong b = 0; b < blocks; ++b) {
    const ulong o = b * CLFFN_BLOCK_BYTES;
    CLFFN_QX16_BLOCK();
    __global const int *xd = (__global const int *)(xq + CLFFN_XQ_SLOT(b, 0) * CLFFN_QK);
    clffn_v16hi s[CLFFN_WTOKENS][2];
  #pragma unroll
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) { s[t][0] = s[t][1] = (clffn_v16hi)((short16)0); }
  // dword j of the block's quants (values 4j … 4j + 3 in the low nibbles, 16 + 4j … in the
  // high ones): rows 0-7's, then rows 8-15's, against each token's x there
  #define CLFFN_QX_A2_STEP(j)                                                                    \
    {                                                                                            \
      const uint8 q0 = __builtin_shufflevector(p0, p1, j, 4 + j, 8 + j, 12 + j, 16 + j, 20 + j,  \
                                               24 + j, 28 + j);                                  \
      const uint8 q1 = __builtin_shufflevector(p2, p3, j, 4 + j, 8 + j, 12 + j, 16 + j, 20 + j,  \
                                               24 + j, 28 + j);                                  \
      const clffn_v32qi lo0 = (clffn_v32qi)(q0 & m4), hi0 = (clffn_v32qi)((q0 >> 4) & m4);       \
      const clffn_v32qi lo1 = (clffn_v32qi)(q1 & m4), hi1 = (clffn_v32qi)((q1 >> 4) & m4);       \
      _Pragma("unroll") for (uint t = 0; t < CLFFN_WTOKENS; ++t) {                               \
        if (t < tokens) {                                                                        \
          const clffn_v32qi xl = (clffn_v32qi)((int8)xd[8 * t + (j)]);                           \
          const clffn_v32qi xh = (clffn_v32qi)((int8)xd[8 * t + 4 + (j)]);                       \
          s[t][0] += __builtin_ia32_pmaddubsw256(lo0, xl) + __builtin_ia32_pmaddubsw256(hi0, xh); \
          s[t][1] += __builtin_ia32_pmaddubsw256(lo1, xl) + __builtin_ia32_pmaddubsw256(hi1, xh); \
        }                                                                                        \
      }                                                                                          \
    }
    CLFFN_QX_A2_STEP(0) CLFFN_QX_A2_STEP(1) CLFFN_QX_A2_STEP(2) CLFFN_QX_A2_STEP(3)
  #undef CLFFN_QX_A2_STEP
  #pragma unroll
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        const clffn_v8si c = (clffn_v8si)((int8)cs[CLFFN_XQ_SLOT(b, t)]);
        const clffn_v8si i0 = __builtin_ia32_pmaddwd256(s[t][0], ones) + c;
        const clffn_v8si i1 = __builtin_ia32_pmaddwd256(s[t][1], ones) + c;
        const float16 f =
            (float16)(__builtin_convertvector(i0, float8), __builtin_convertvector(i1, float8));
        acc[t] = fma(f, dw * ds[CLFFN_XQ_SLOT(b, t)], acc[t]);
      }
    }
  }
}
#endif

#if CLFFN_ROW_SPLIT > 1
// Several lanes a row (GPUs): lane s takes the half-blocks s, s + SPLIT, …, so that a warp's
// loads fall on one run of the row, as in clffn_row_lanes. Half h of block b is quants 16h …
// 16h + 15 for q8_0, and bytes 8h … 8h + 7 for q4_0 (values 8h … 8h + 7 in the low nibbles,
// 8h + 16 … 8h + 23 in the high ones). Its 16 products are summed in int, exactly, then times
// both scales into a float per token; eight lanes at a time (Oclgrind 21.10 loses a 16-lane
// vector's upper lanes), and summed through private memory (it crashes on int8's .lo and .hi).
inline int clffn_isum8(int8 p) {
  int v[8];
  vstore8(p, 0, v);
  int sum = 0;
  for (uint i = 0; i < 8; ++i) { sum += v[i]; }
  return sum;
}

inline void clffn_qx_lanes(__global const uchar *row, ulong blocks, __global const uchar *xq,
                           ulong xs, uint tokens, uint s, float sum[CLFFN_WTOKENS]) {
  const ulong pairs = (blocks + 1) / 2;
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[t] = 0.0f; }
  for (ulong u = s; u < 2 * blocks; u += CLFFN_ROW_SPLIT) {
    const ulong b = u / 2, h = u % 2;
    __global const uchar *blk = row + b * CLFFN_BLOCK_BYTES;
    const float dw = clffn_whalf(blk);
  #if CLFFN_WTYPE == CLFFN_WTYPE_Q4_0
    const uchar8 qb = vload8(0, blk + 2 + 8 * h);
    const int8 w0 = convert_int8(qb & (uchar)15) - 8, w1 = convert_int8(qb >> (uchar)4) - 8;
  #else
    __global const char *qw = (__global const char *)(blk + 2 + 16 * h);
    const int8 w0 = convert_int8(vload8(0, qw)), w1 = convert_int8(vload8(1, qw));
  #endif
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        __global const uchar *xt = xq + t * xs;
  #if CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 // x's values 8h … and 8h + 16 …, q + 128 from 2 tokens
        __global const uchar *xb = xt + b * CLFFN_QK + 8 * h;
        const int8 x0 = convert_int8(as_char8(vload8(0, xb) ^ (uchar)CLFFN_XQ_OFFSET));
        const int8 x1 = convert_int8(as_char8(vload8(2, xb) ^ (uchar)CLFFN_XQ_OFFSET));
  #else // q + 128 where the CPU form takes it so (CLFFN_QX_DPBUSD)
        __global const uchar *xb = xt + b * CLFFN_QK + 16 * h;
        const int8 x0 = convert_int8(as_char8(vload8(0, xb) ^ (uchar)CLFFN_XQ_OFFSET));
        const int8 x1 = convert_int8(as_char8(vload8(1, xb) ^ (uchar)CLFFN_XQ_OFFSET));
  #endif
        const int isum = clffn_isum8(w0 * x0 + w1 * x1);
        const float dx = ((__global const float *)(xt + 64 * pairs))[b];
        sum[t] = fma((float)isum, dw * dx, sum[t]);
      }
    }
  }
}
#endif

// y[t, r] = Σ_b dw[r, b]·dx[t, b]·Σ_j q_w[r, b, j]·q_x[t, b, j] (+ β·y) for the pass's tokens,
// from clffn_xquant's rows (xq, xs bytes apart; block-major in the 16-row form). NDRange
// (CLFFN_ROW_SPLIT, ⌈⌈rows / CLFFN_QX_R⌉ / CLFFN_ROW_ROWS⌉·CLFFN_ROW_ROWS), work-group
// (CLFFN_ROW_SPLIT, CLFFN_ROW_ROWS). On a CPU q8_0 goes one row a work-item up to 2 tokens: the
// quantized rows fit the first-level cache, and four rows side by side measured slower there
// (4096 -> 11008, one token, 22016 rows of 4096: 2.4-2.6 ms against 1.2-1.3 one by one); from 4
// tokens, and q4_0 at every count, sixteen, transposed (clffn_qx_rows16, CLFFN_QX_WIDE). On a GPU
// the row's lanes share it (clffn_qx_lanes).
CLFFN_ROWS_QX_KERNEL {
  CLFFN_ROWS_QX_SHIFT();
  CLFFN_PASS_TOKENS();
  const ulong r0 = get_global_id(1) * CLFFN_QX_R;
  float sum[CLFFN_QX_R * CLFFN_WTOKENS]; // row i's at i·CLFFN_WTOKENS (clffn_store_rows)
#if CLFFN_ROW_SPLIT > 1
  const uint s = get_local_id(0);
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[t] = 0.0f; }
  if (r0 < rows && live) {
    clffn_qx_lanes(w + w_off + r0 * row_bytes, cols / CLFFN_QK, xq, xs, tokens, s, sum);
  }
  __local float part[CLFFN_ROW_ROWS][CLFFN_WTOKENS][CLFFN_ROW_SPLIT];
  clffn_lanes_sum(part[get_local_id(1)], s, sum);
#elif CLFFN_QX_TILED
  // stores its rows here, a token's 16 at a time, not through sum below: copied into sum, the
  // 4- and 16-token kernels measured 0-12% slower in three alternated rounds
  const uint s = 1;
  if (r0 < rows && live) {
    float16 acc[CLFFN_WTOKENS];
    const uint n = (uint)min((ulong)16, rows - r0);
  #if CLFFN_QX_R16
    clffn_qx_rows16(w + w_off + r0 * row_bytes, row_bytes, n, cols / CLFFN_QK, xq, tokens, acc);
  #else
    clffn_qx_rows16_avx2(w + w_off + r0 * row_bytes, row_bytes, n, cols / CLFFN_QK, xq, tokens,
                         acc);
  #endif
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        float v[16];
        vstore16(acc[t], 0, v);
        __global float *yt = y + y_off + t * ldy + r0;
        for (uint i = 0; i < n; ++i) { yt[i] = beta != 0.0f ? fma(beta, yt[i], v[i]) : v[i]; }
      }
    }
  }
#else
  const uint s = 0;
  for (uint i = 0; i < CLFFN_QX_R; ++i) {
    if (r0 + i < rows && live) {
      clffn_qx_row(w + w_off + (r0 + i) * row_bytes, cols / CLFFN_QK, xq, xs, tokens,
                   sum + i * CLFFN_WTOKENS);
    }
  }
#endif
  if (s == 0 && live && r0 < rows) {
    clffn_store_rows(y + y_off, ldy, r0, min((ulong)CLFFN_QX_R, rows - r0), tokens, beta, sum);
  }
}

#endif

// ---- y = x̃·Wᵀ, each input row rounded to bf16 first (bf16 weights, on request) ---------------
//
// The bf16 program's form of quantized inputs: each input row is rounded to bf16 (to nearest
// even, as clffn_convert_weights rounds f32 to bf16), the input type ggml's dot products take
// for bf16 weights, and each product of two bf16 values is exact in f32. clffn_xquant writes
// each token's row at xs = CLFFN_XB_BYTES(cols) apart: ⌈cols / 32⌉ chunks of 32 values, zeros
// past cols. Where the compiler is clang targeting x86 with AVX-512 and the CPU has AVX-512
// BF16 (CLFFN_CPU_BF16, which the host sets from its own CPU, a CPU device's), vdpbf16ps
// takes 32 pairs of values into 16 f32 sums in one instruction, where f32 inputs take a
// widening, a shift and two multiply-adds a token; it treats subnormal values and sums as zero
// (below 2^-126, far under the 1e-5 the results keep). Elsewhere each value is widened to f32
// (a shift) and multiplied in f32.
#if CLFFN_WTYPE == CLFFN_WTYPE_BF16
#ifndef CLFFN_CPU_BF16
  #define CLFFN_CPU_BF16 0
#endif
#if defined(__clang__) && defined(__AVX512BW__) && CLFFN_NATIVE_HALF && CLFFN_CPU_BF16 && \
    CLFFN_ROW_SPLIT == 1
  #define CLFFN_BX_DPBF16 1
  // as CLFFN_QX_TARGET and CLFFN_QX_ROW_INLINE are for VNNI (the quantized programs' section)
  #define CLFFN_BX_TARGET __attribute__((target("avx512bf16")))
  #define CLFFN_BX_ROW_INLINE __attribute__((noinline)) CLFFN_BX_TARGET
#else
  #define CLFFN_BX_DPBF16 0
#endif
// rows a work-item: the host launches ⌈rows / CLFFN_BX_R⌉ where a row has one lane
#if CLFFN_ROW_SPLIT == 1
  #define CLFFN_BX_R CLFFN_BX_ROWS(CLFFN_WTOKENS)
#else
  #define CLFFN_BX_R 1
#endif
#ifndef CLFFN_BX_TT
  #define CLFFN_BX_TT 4
#endif

// sum[t] += the row's values c0, c0 + step, … < cols times token t's rounded ones, one by one:
// the values past the last whole vector.
inline void clffn_bx_tail(__global const uchar *row, ulong c0, ulong step, ulong cols,
                          __global const uchar *xq, ulong xs, uint tokens,
                          float sum[CLFFN_WTOKENS]) {
  for (ulong c = c0; c < cols; c += step) {
    const float v = as_float((uint)((__global const ushort *)row)[c] << 16);
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        const ushort xb = ((__global const ushort *)(xq + t * xs))[c];
        sum[t] = fma(v, as_float((uint)xb << 16), sum[t]);
      }
    }
  }
}

// f32 to bf16, to nearest even; a NaN stays a (quiet) NaN, an infinity an infinity.
inline uint8 clffn_to_bf16x8(float8 v) {
  const uint8 u = as_uint8(v);
  const int8 nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return select(rounded, (u >> 16) | 0x40u, as_uint8(nan));
}

// NDRange (⌈cols / 32⌉, max_tokens), any work-group: 32 values of one token's row a work-item.
CLFFN_XQUANT_KERNEL {
  CLFFN_XQUANT_SHIFT();
  CLFFN_PASS_TOKENS();
  const ulong b = get_global_id(0), c0 = b * 32;
  const uint t = get_global_id(1);
  if (live && t < tokens && c0 < cols) {
    __global const float *xr = x + x_off + t * ldx;
    __global ushort *q = (__global ushort *)(xq + t * xs) + c0;
    for (uint i = 0; i < 4; ++i) {
      const ulong c = c0 + 8 * i;
      float8 v = (float8)0.0f;
      if (c + 8 <= cols) {
        v = vload8(0, xr + c);
      } else {
        float p[8];
        for (uint j = 0; j < 8; ++j) { p[j] = c + j < cols ? xr[c + j] : 0.0f; }
        v = vload8(0, p);
      }
      vstore8(convert_ushort8(clffn_to_bf16x8(v)), 0, q + 8 * i);
    }
  }
}

#if CLFFN_BX_DPBF16
typedef float clffn_v16sf __attribute__((__vector_size__(64)));
typedef short clffn_v32hi __attribute__((__vector_size__(64)));
typedef int clffn_v16si __attribute__((__vector_size__(64))); // the builtin's type for 32 bf16

// 32 bf16 values at p (64 bytes), through two 32-byte loads that the compiler joins.
inline CLFFN_ALWAYS_INLINE clffn_v32hi clffn_bload32(__global const ushort *p) {
  const short16 a = as_short16(vload16(0, p)), b = as_short16(vload16(1, p));
  return (clffn_v32hi)__builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                              14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                                              27, 28, 29, 30, 31);
}

// acc[t] += the 32 values at w times token t's chunk k, for the pass's tokens.
inline CLFFN_ALWAYS_INLINE CLFFN_BX_TARGET void clffn_bx_dot(clffn_v32hi wv,
                                                             __global const uchar *xq, ulong xs,
                                                             ulong k, uint tokens,
                                                             float16 acc[CLFFN_WTOKENS]) {
  #pragma unroll
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t < tokens) {
      const clffn_v32hi xv = clffn_bload32((__global const ushort *)(xq + t * xs) + 32 * k);
      acc[t] = as_float16(
          __builtin_ia32_dpbf16ps_512((clffn_v16sf)acc[t], (clffn_v16si)wv, (clffn_v16si)xv));
    }
  }
}

// sum[i][t] = row i's products with the pass's rounded rows (rows ≤ CLFFN_BX_R of them from
// row0, row_bytes apart; the others repeat the last and are not stored): whole chunks of 32
// through vdpbf16ps, each chunk of x read once for all the rows; two chains where one row and
// few tokens would leave the instruction's latency exposed. Then the values past the last whole
// chunk one by one.
CLFFN_BX_ROW_INLINE void clffn_bx_rows(__global const uchar *row0, ulong row_bytes, uint rows,
                                       ulong cols, __global const uchar *xq, ulong xs,
                                       uint tokens, float *sum) {
  __global const ushort *wr[CLFFN_BX_R];
  for (uint i = 0; i < CLFFN_BX_R; ++i) {
    wr[i] = (__global const ushort *)(row0 + min(i, rows - 1) * row_bytes);
  }
  const ulong chunks = cols / 32;
#if CLFFN_BX_R == 1
  float16 acc[CLFFN_WTOKENS];
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] = (float16)0.0f; }
  ulong k = 0;
  #if CLFFN_WTOKENS <= 4
  float16 acc2[CLFFN_WTOKENS];
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc2[t] = (float16)0.0f; }
  for (; k + 1 < chunks; k += 2) {
    const clffn_v32hi w0 = clffn_bload32(wr[0] + 32 * k), w1 = clffn_bload32(wr[0] + 32 * k + 32);
    clffn_bx_dot(w0, xq, xs, k, tokens, acc);
    clffn_bx_dot(w1, xq, xs, k + 1, tokens, acc2);
  }
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] += acc2[t]; }
  #endif
  for (; k < chunks; ++k) { clffn_bx_dot(clffn_bload32(wr[0] + 32 * k), xq, xs, k, tokens, acc); }
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    const float8 h = acc[t].lo + acc[t].hi;
    sum[t] = dot(h.lo + h.hi, (float4)1.0f);
  }
#else
  // the tokens in groups of CLFFN_BX_TT, each group a pass over the rows (from the caches
  // after the first)
  for (uint t0 = 0; t0 < tokens; t0 += CLFFN_BX_TT) {
    float16 acc[CLFFN_BX_R][CLFFN_BX_TT];
    for (uint i = 0; i < CLFFN_BX_R; ++i) {
      for (uint j = 0; j < CLFFN_BX_TT; ++j) { acc[i][j] = (float16)0.0f; }
    }
    __global const uchar *xg = xq + t0 * xs;
    const uint n = min((uint)CLFFN_BX_TT, tokens - t0);
    for (ulong k = 0; k < chunks; ++k) {
      clffn_v32hi wv[CLFFN_BX_R];
  #pragma unroll
      for (uint i = 0; i < CLFFN_BX_R; ++i) { wv[i] = clffn_bload32(wr[i] + 32 * k); }
  #pragma unroll
      for (uint j = 0; j < CLFFN_BX_TT; ++j) {
        if (j < n) {
          const clffn_v32hi xv = clffn_bload32((__global const ushort *)(xg + j * xs) + 32 * k);
  #pragma unroll
          for (uint i = 0; i < CLFFN_BX_R; ++i) {
            acc[i][j] = as_float16(__builtin_ia32_dpbf16ps_512(
                (clffn_v16sf)acc[i][j], (clffn_v16si)wv[i], (clffn_v16si)xv));
          }
        }
      }
    }
    for (uint i = 0; i < CLFFN_BX_R; ++i) {
      for (uint j = 0; j < CLFFN_BX_TT; ++j) {
        const float8 h = acc[i][j].lo + acc[i][j].hi;
        if (j < n) { sum[i * CLFFN_WTOKENS + t0 + j] = dot(h.lo + h.hi, (float4)1.0f); }
      }
    }
  }
#endif
  for (uint i = 0; i < CLFFN_BX_R; ++i) {
    clffn_bx_tail((__global const uchar *)wr[i], chunks * 32, 1, cols, xq, xs, tokens,
                  sum + i * CLFFN_WTOKENS);
  }
}
#endif

// The portable form, lane s of CLFFN_ROW_SPLIT (one lane on a CPU): the row's eight-value chunks
// s, s + SPLIT, …, as in clffn_row_lanes, each value widened to f32; then the values past the
// last whole eight.
inline void clffn_bx_lanes(__global const uchar *row, ulong cols, __global const uchar *xq,
                           ulong xs, uint tokens, uint s, float sum[CLFFN_WTOKENS]) {
  float4 acc[CLFFN_WTOKENS];
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { acc[t] = (float4)0.0f; }
  const ulong chunks = cols / 8;
  for (ulong j = s; j < chunks; j += CLFFN_ROW_SPLIT) {
    float d;
    const float8 wv = clffn_wload8_wide(row, 8 * j, &d);
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        __global const ushort *xt = (__global const ushort *)(xq + t * xs) + 8 * j;
        const float8 xv = as_float8(convert_uint8(vload8(0, xt)) << 16);
        acc[t] = fma(wv.lo, xv.lo, acc[t]);
        acc[t] = fma(wv.hi, xv.hi, acc[t]);
      }
    }
  }
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[t] = dot(acc[t], (float4)1.0f); }
  clffn_bx_tail(row, chunks * 8 + s, CLFFN_ROW_SPLIT, cols, xq, xs, tokens, sum);
}

// y[t, r] = Σ_c W[r, c]·x̃[t, c] (+ β·y) for the pass's tokens, from clffn_xquant's rows (xq, xs
// bytes apart). NDRange (CLFFN_ROW_SPLIT, ⌈⌈rows / CLFFN_BX_R⌉ / CLFFN_ROW_ROWS⌉·CLFFN_ROW_ROWS),
// work-group (CLFFN_ROW_SPLIT, CLFFN_ROW_ROWS): CLFFN_BX_R rows a work-item where a row has one
// lane (CPUs), a row's lanes side by side where it has several (GPUs).
CLFFN_ROWS_QX_KERNEL {
  CLFFN_ROWS_QX_SHIFT();
  CLFFN_PASS_TOKENS();
  const ulong g = get_global_id(1), r0 = g * CLFFN_BX_R;
  const uint s = get_local_id(0);
  float sum[CLFFN_BX_R * CLFFN_WTOKENS]; // row i's at i·CLFFN_WTOKENS
#if CLFFN_BX_DPBF16
  if (r0 < rows && live) {
    clffn_bx_rows(w + w_off + r0 * row_bytes, row_bytes, (uint)min((ulong)CLFFN_BX_R, rows - r0),
                  cols, xq, xs, tokens, sum);
  }
#else
  for (uint i = 0; i < CLFFN_BX_R; ++i) {
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) { sum[i * CLFFN_WTOKENS + t] = 0.0f; }
    if (r0 + i < rows && live) {
      clffn_bx_lanes(w + w_off + (r0 + i) * row_bytes, cols, xq, xs, tokens, s,
                     sum + i * CLFFN_WTOKENS);
    }
  }
  #if CLFFN_ROW_SPLIT > 1
  __local float part[CLFFN_ROW_ROWS][CLFFN_WTOKENS][CLFFN_ROW_SPLIT];
  clffn_lanes_sum(part[get_local_id(1)], s, sum);
  #endif
#endif
  if (s == 0 && live && r0 < rows) {
    clffn_store_rows(y + y_off, ldy, r0, min((ulong)CLFFN_BX_R, rows - r0), tokens, beta, sum);
  }
}
#endif

// ---- y = x·W: down the columns ------------------------------------------------------------------

// Eight values c .. c+7 of a row where the row may end inside them (zeros past cols).
inline float8 clffn_wload8_edge(__global const uchar *row, ulong c, ulong cols) {
  float8 v = (float8)0.0f;
  if (c + 0 < cols) { v.s0 = clffn_wvalue(row, c + 0); }
  if (c + 1 < cols) { v.s1 = clffn_wvalue(row, c + 1); }
  if (c + 2 < cols) { v.s2 = clffn_wvalue(row, c + 2); }
  if (c + 3 < cols) { v.s3 = clffn_wvalue(row, c + 3); }
  if (c + 4 < cols) { v.s4 = clffn_wvalue(row, c + 4); }
  if (c + 5 < cols) { v.s5 = clffn_wvalue(row, c + 5); }
  if (c + 6 < cols) { v.s6 = clffn_wvalue(row, c + 6); }
  if (c + 7 < cols) { v.s7 = clffn_wvalue(row, c + 7); }
  return v;
}

// acc[t][k] += Σ over the rows r0 + s, r0 + s + SPLIT, … < r1 of W[r, c0 + 8k + i]·x[t, r]; the
// whole form reads eight values at a time, the other stops at cols.
// Split columns run on GPUs: their loads as wide as the alignment allows (see clffn_fload8).
#if CLFFN_COL_SPLIT > 1
  #define CLFFN_COL_LOAD8 clffn_wload8_wide
#else
  #define CLFFN_COL_LOAD8 clffn_wload8
#endif
inline void clffn_col_sums(__global const uchar *w, ulong row_bytes, ulong r0, ulong r1,
                           ulong c0, ulong cols, __global const float *xr, ulong ldx,
                           uint tokens, int whole, float8 acc[CLFFN_WTOKENS][CLFFN_COL_VECS]) {
  for (ulong r = r0; r < r1; r += CLFFN_COL_SPLIT) {
    __global const uchar *row = w + r * row_bytes;
    float8 wv[CLFFN_COL_VECS];
    float d = 1.0f;
    #pragma unroll
    for (uint k = 0; k < CLFFN_COL_VECS; ++k) {
#if CLFFN_COL_W < CLFFN_QK
      const int new_block = 1;
#else
      const int new_block = k % 4 == 0;
#endif
      if (!whole) {
        wv[k] = clffn_wload8_edge(row, c0 + 8 * k, cols);
      } else if (new_block) { // its scale too, set by the load before it is read
        wv[k] = CLFFN_COL_LOAD8(row, c0 + 8 * k, &d);
        wv[k] *= d;
      } else {
        float unused;
        wv[k] = CLFFN_COL_LOAD8(row, c0 + 8 * k, &unused) * d;
      }
    }
    for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
      if (t < tokens) {
        const float8 xv = (float8)xr[t * ldx + r];
        #pragma unroll
        for (uint k = 0; k < CLFFN_COL_VECS; ++k) { acc[t][k] = fma(wv[k], xv, acc[t][k]); }
      }
    }
  }
}

// NDRange (⌈groups / CLFFN_COL_GROUPS⌉·CLFFN_COL_GROUPS, CLFFN_COL_SPLIT·chunks), work-group
// (CLFFN_COL_GROUPS, CLFFN_COL_SPLIT), groups = ⌈cols / CLFFN_COL_W⌉, chunks = ⌈rows /
// chunk_rows⌉. Work-item (g, s) of chunk k sums the columns [g·W, (g + 1)·W) over the chunk's
// rows s, s + SPLIT, …; the partial sums meet in local memory. One chunk writes y; more write
// part[k, t, c] (tokens × cols each), which clffn_wgemv_sum adds: the chunks give a GPU
// work-groups enough where the columns are few.
__kernel __attribute__((reqd_work_group_size(CLFFN_COL_GROUPS, CLFFN_COL_SPLIT, 1)))
void clffn_wgemv_cols(CLFFN_ROWS_PARAMS, const float beta, const ulong chunk_rows,
                      __global float *restrict part,
                      __global const uint *restrict ids, const ulong8 grp) {
  CLFFN_GROUP_SHIFT(w, x, y);
  part += get_global_id(2) * grp.s3;
  CLFFN_PASS_TOKENS();
  const ulong c0 = get_global_id(0) * CLFFN_COL_W;
  const uint s = get_local_id(1);
  const ulong k = get_group_id(1), r0 = k * chunk_rows;
  const ulong r1 = rows - r0 < chunk_rows ? rows : r0 + chunk_rows;
  float8 acc[CLFFN_WTOKENS][CLFFN_COL_VECS];
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    #pragma unroll
    for (uint v = 0; v < CLFFN_COL_VECS; ++v) { acc[t][v] = (float8)0.0f; }
  }
  if (c0 < cols && live) {
    const int whole = c0 + CLFFN_COL_W <= cols;
    if (whole) {
      clffn_col_sums(w + w_off, row_bytes, r0 + s, r1, c0, cols, x + x_off, ldx, tokens, 1, acc);
    } else {
      clffn_col_sums(w + w_off, row_bytes, r0 + s, r1, c0, cols, x + x_off, ldx, tokens, 0, acc);
    }
  }
#if CLFFN_COL_SPLIT > 1
  __local float8 shared[CLFFN_COL_GROUPS][CLFFN_COL_SPLIT];
  const uint g = get_local_id(0);
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    #pragma unroll
    for (uint v = 0; v < CLFFN_COL_VECS; ++v) {
      barrier(CLK_LOCAL_MEM_FENCE);
      shared[g][s] = acc[t][v];
      for (uint half_n = CLFFN_COL_SPLIT / 2; half_n > 0; half_n /= 2) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (s < half_n) { shared[g][s] += shared[g][s + half_n]; }
      }
      barrier(CLK_LOCAL_MEM_FENCE);
      acc[t][v] = shared[g][0];
    }
  }
#endif
  if (s != 0 || c0 >= cols || !live) { return; }
  const int direct = chunk_rows >= rows;
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t >= tokens) { continue; }
    __global float *out =
        direct ? y + y_off + t * ldy + c0 : part + (k * max_tokens + t) * cols + c0;
    #pragma unroll
    for (uint v = 0; v < CLFFN_COL_VECS; ++v) {
      if (c0 + 8 * v + 8 <= cols) {
        const float8 a = acc[t][v];
        vstore8(direct && beta != 0.0f ? fma((float8)beta, vload8(v, out), a) : a, v, out);
      } else {
        const float8 a = acc[t][v];
        const float e[8] = {a.s0, a.s1, a.s2, a.s3, a.s4, a.s5, a.s6, a.s7};
        for (uint i = 0; i < 8 && c0 + 8 * v + i < cols; ++i) {
          __global float *o = out + 8 * v + i;
          *o = direct && beta != 0.0f ? fma(beta, *o, e[i]) : e[i];
        }
      }
    }
  }
}

#if CLFFN_COL_SPLIT == 1
// CPUs: one work-item per strip of CLFFN_STRIP columns (CLFFN_WCOL_STRIP values over the pass's
// tokens) and chunk of rows, its sums in private memory. The columns kernel's strip of 64 reads a
// few cache lines of each row it passes; a hardware prefetcher follows a stream of whole
// kilobytes, and the sums, kilobytes too, stay in the first-level cache.
#define CLFFN_STRIP CLFFN_WCOL_STRIP(CLFFN_WTOKENS)
#define CLFFN_STRIP_BLOCKS (CLFFN_STRIP / CLFFN_QK)
// f16, bf16 and f32 strips from 8 tokens walk their rows once for each part of 4 tokens: the
// sums of all the tokens (64 vectors) were loaded and stored around every multiply-add, and a
// part's 16 fit the registers, while decoding these types again costs an instruction or two a
// vector. ∂x through 4096 -> 11008 SwiGLU on an Intel Xeon (2 cores), two alternated rounds:
// f16 at 16 tokens 78.6-84.9 -> 57.9-58.7 ms, at 8 44.8-47.3 -> 40.8-41.5; bf16 77.8-83.7 ->
// 55.8-57.0 and 43.9-45.8 -> 39.8-40.2. Parts of 8 gained less (f16 at 16: 63-64 ms); q8_0
// and q4_0, whose decoding costs more, ran slower in parts (q4_0 at 16 tokens 56 -> 60-64).
#if !CLFFN_QUANTIZED && CLFFN_WTOKENS >= 8
  #define CLFFN_STRIP_PART 4
#else
  #define CLFFN_STRIP_PART CLFFN_WTOKENS
#endif

// The strip's vectors: the row kernels', but 8 values for q4_0 past 4 tokens, decoded from two
// 8-byte loads. 16-wide q4_0 vectors (CLFFN_ROW_DIRECT on AVX-512) made ∂x through 4096 -> 11008
// SwiGLU at 16 tokens on an Intel Xeon slower (57.6-59.5 -> 67.5-68.3 ms; the strip kernel 25.2
// -> 33.4 ms a launch, and 33.4 still with the 16-wide decoding split into halves); the other
// types' strips ran level or faster at 16. Up to 4 tokens they are 16 values where the rows' are
// 8 (AVX2): 8-wide strips made ∂x through 4096 -> 11008 SwiGLU on an AMD EPYC (2 cores) slower,
// best of five alternated rounds, q4_0 at 2 tokens 13.1 -> 15.1 ms, and of four, bf16 at one
// token 14.6 -> 17.3, q8_0 12.1 -> 14.0, f16 at 2 19.8 -> 22.6.
#if CLFFN_WTYPE == CLFFN_WTYPE_Q4_0 && CLFFN_WTOKENS > 4
  #define CLFFN_SV 8
#elif CLFFN_WTOKENS <= 4
  #define CLFFN_SV 16
#else
  #define CLFFN_SV CLFFN_RV
#endif
#define floatSV CLFFN_CAT(float, CLFFN_SV)
#define CLFFN_SNV (CLFFN_QK / CLFFN_SV)
#if CLFFN_SV == CLFFN_RV
  #define clffn_strip_load clffn_wload_block
#else
  #if CLFFN_SV == 8 // q4_0, beside 16-wide rows
inline void clffn_strip_load(__global const uchar *row, ulong c, float *d, float8 v[4]) {
  __global const uchar *blk = row + (c / CLFFN_QK) * CLFFN_BLOCK_BYTES;
  *d = clffn_whalf(blk);
  clffn_q4_vecs8(blk, v);
}
  #else // beside 8-wide rows: their vectors, joined in pairs (the values in the same order)
inline void clffn_strip_load(__global const uchar *row, ulong c, float *d, float16 v[2]) {
  float8 h[4];
  clffn_wload_block(row, c, d, h);
  v[0] = (float16)(h[0], h[1]);
  v[1] = (float16)(h[2], h[3]);
}
  #endif
#endif

// clffn_strip_load where live, else zeros (and d = 0).
inline void clffn_wload_block_if(int live, __global const uchar *row, ulong c, float *d,
                                 floatSV v[CLFFN_SNV]) {
  if (live) {
    clffn_strip_load(row, c, d, v);
  } else {
    *d = 0.0f;
    #pragma unroll
    for (uint i = 0; i < CLFFN_SNV; ++i) { v[i] = (floatSV)0.0f; }
  }
}

// acc[t][j / SV] += Σ over the m (≤ 4) rows from r of W[r, c0 + j]·x[t, r] for j < 32·blocks
// (whole blocks of 32), tail[t][k] likewise for the eight columns from 32·blocks + 8k on, up to n,
// for the part's tokens t < min(tokens, CLFFN_STRIP_PART), x and the sums already at its first.
// Every index into the sums is a constant once the loops are unrolled (faster on POCL than the
// same sums indexed at run time, and what a compiler that turns a run-time index into a chain of
// selects, as Mesa's does, builds in reasonable time). Inlined by force: with m a constant, a
// whole group's loads are unconditional; POCL otherwise kept a call that branched on m in
// every block.
__attribute__((always_inline)) inline void
clffn_strip_group(__global const uchar *row0, ulong row_bytes, uint m, ulong c0, uint blocks,
                  uint n, __global const float *xr, ulong ldx, ulong r, uint tokens,
                  floatSV acc[CLFFN_STRIP_PART][CLFFN_STRIP / CLFFN_SV],
                  float8 tail[CLFFN_STRIP_PART][CLFFN_QK / 8]) {
  __global const uchar *row1 = m > 1 ? row0 + row_bytes : row0;
  __global const uchar *row2 = m > 2 ? row0 + 2 * row_bytes : row0;
  __global const uchar *row3 = m > 3 ? row0 + 3 * row_bytes : row0;
  float xs[CLFFN_STRIP_PART][4];
  #pragma unroll
  for (uint t = 0; t < CLFFN_STRIP_PART; ++t) {
    __global const float *xt = xr + t * ldx + r;
    xs[t][0] = t < tokens ? xt[0] : 0.0f;
    xs[t][1] = t < tokens && m > 1 ? xt[1] : 0.0f;
    xs[t][2] = t < tokens && m > 2 ? xt[2] : 0.0f;
    xs[t][3] = t < tokens && m > 3 ? xt[3] : 0.0f;
  }
  #pragma unroll
  for (uint b = 0; b < CLFFN_STRIP_BLOCKS; ++b) {
    if (b < blocks) {
      floatSV v0[CLFFN_SNV], v1[CLFFN_SNV], v2[CLFFN_SNV], v3[CLFFN_SNV];
      float d0, d1, d2, d3;
      clffn_strip_load(row0, c0 + CLFFN_QK * b, &d0, v0);
      clffn_wload_block_if(m > 1, row1, c0 + CLFFN_QK * b, &d1, v1);
      clffn_wload_block_if(m > 2, row2, c0 + CLFFN_QK * b, &d2, v2);
      clffn_wload_block_if(m > 3, row3, c0 + CLFFN_QK * b, &d3, v3);
      #pragma unroll
      for (uint t = 0; t < CLFFN_STRIP_PART; ++t) {
        if (t < tokens) {
          const floatSV x0 = (floatSV)(xs[t][0] * d0), x1 = (floatSV)(xs[t][1] * d1);
          const floatSV x2 = (floatSV)(xs[t][2] * d2), x3 = (floatSV)(xs[t][3] * d3);
          #pragma unroll
          for (uint i = 0; i < CLFFN_SNV; ++i) {
            const floatSV p = fma(v3[i], x3, fma(v2[i], x2, fma(v1[i], x1, v0[i] * x0)));
            acc[t][CLFFN_SNV * b + i] += p;
          }
        }
      }
    }
  }
  #pragma unroll
  for (uint k = 0; k < CLFFN_QK / 8; ++k) { // f32, f16 and bf16 rows only
    const ulong c = c0 + CLFFN_QK * blocks + 8 * k;
    if (CLFFN_QK * blocks + 8 * k < n) {
      const ulong end = c0 + n; // a missing row's values all lie past its end: zeros
      const float8 w0 = clffn_wload8_edge(row0, c, end);
      const float8 w1 = clffn_wload8_edge(row1, c, m > 1 ? end : c0);
      const float8 w2 = clffn_wload8_edge(row2, c, m > 2 ? end : c0);
      const float8 w3 = clffn_wload8_edge(row3, c, m > 3 ? end : c0);
      #pragma unroll
      for (uint t = 0; t < CLFFN_STRIP_PART; ++t) {
        if (t < tokens) {
          const float8 p = fma(w3, (float8)xs[t][3],
                               fma(w2, (float8)xs[t][2], fma(w1, (float8)xs[t][1], w0 * xs[t][0])));
          tail[t][k] += p;
        }
      }
    }
  }
}

// The strip's bytes in each row it passes are a few cache lines a row apart (kilobytes), which no
// hardware prefetcher follows past a token or two, so every line of the strip in the group
// CLFFN_STRIP_AHEAD rows on is prefetched before each group (CLFFN_PREFETCH). ∂x through 4096 ->
// 11008 SwiGLU on an Intel Xeon (2 cores), two alternated rounds, 8 rows ahead against none, ms:
// f16 at 1 token 16.0-16.3 -> 11.2-11.5, at 4 31.5-33.4 -> 18.1-19.3, at 16 60.7-61.2 -> 45.9;
// q8_0 at 2 16.2-16.6 -> 12.2-13.0, at 16 73.3-74.4 -> 51.2-52.8; q4_0 at 8 35.1-37.9 ->
// 24.7-26.4, at 16 59.2-61.8 -> 56.3-57.3. The forward through f32 weights kept [in, out] runs
// down the same strips: 2 and 4 tokens 23.8-24.7 -> 20.9-21.4 and 33.7-36.0 -> 22.2-23.6 ms, but
// one token, whose strips are 4 KB of each row, a stream the hardware follows, 18.4-18.5 ->
// 22.5-25.2, so strips of more than 2 KB are left to the hardware (docs/PERFORMANCE.md).
#define CLFFN_STRIP_BYTES (CLFFN_STRIP_BLOCKS * CLFFN_ROW_BLOCK_BYTES)
#define CLFFN_STRIP_LINES (CLFFN_STRIP_BYTES / 64 + 1) // an unaligned strip's lines, at most
#ifndef CLFFN_STRIP_AHEAD
  #if CLFFN_STRIP_BYTES <= 2048
    #define CLFFN_STRIP_AHEAD 8 // rows; 0: none
  #else
    #define CLFFN_STRIP_AHEAD 0
  #endif
#endif

// Four rows at a time: four streams for the prefetchers, a quarter of the sums' traffic. The
// rows after the last whole group go one at a time (m = 1: the other three rows are not read,
// zeros in their place, not a weight times 0, which is NaN for an infinite one). A second copy
// of the group for m of 1 to 3, known only at run time, cost more to compile than the whole
// group: on POCL on an AMD EPYC (AVX2), this kernel's code generation at one token took 14-17 s
// for each type against 6-7 s one row at a time, at 2 tokens 5.4-8.5 s against 4.4-6.2; the
// backward ran level (q8_0 at one token through 4096 -> 11008 SwiGLU, best of five alternated
// rounds, 16.2 ms either way).
inline void clffn_strip_sums(__global const uchar *w, ulong row_bytes, ulong r0, ulong r1,
                             ulong c0, uint blocks, uint n, __global const float *xr, ulong ldx,
                             uint tokens, floatSV acc[CLFFN_STRIP_PART][CLFFN_STRIP / CLFFN_SV],
                             float8 tail[CLFFN_STRIP_PART][CLFFN_QK / 8]) {
  const ulong c0_bytes = c0 / CLFFN_QK * CLFFN_ROW_BLOCK_BYTES;
  for (ulong r = r0; r < r1; r += 4) {
    __global const uchar *row = w + r * row_bytes;
    if (CLFFN_STRIP_AHEAD > 0 && r + CLFFN_STRIP_AHEAD + 4 <= r1) {
      #pragma unroll
      for (uint q = 0; q < 4; ++q) {
        __global const uchar *ahead = row + (CLFFN_STRIP_AHEAD + q) * row_bytes + c0_bytes;
        #pragma unroll
        for (uint l = 0; l < CLFFN_STRIP_LINES; ++l) { CLFFN_PREFETCH(ahead + 64 * l); }
      }
    }
    if (r1 - r >= 4) { // the group whole, its loads unconditional once inlined
      clffn_strip_group(row, row_bytes, 4, c0, blocks, n, xr, ldx, r, tokens, acc, tail);
    } else {
      for (ulong q = r; q < r1; ++q) {
        clffn_strip_group(w + q * row_bytes, row_bytes, 1, c0, blocks, n, xr, ldx, q, tokens, acc,
                          tail);
      }
    }
  }
}

// NDRange (⌈cols / CLFFN_STRIP⌉, chunks), work-group (1, 1), chunks = ⌈rows / chunk_rows⌉; the
// arguments, and part when there are several chunks, as clffn_wgemv_cols has them.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void clffn_wgemv_strip(CLFFN_ROWS_PARAMS, const float beta, const ulong chunk_rows,
                       __global float *restrict part,
                      __global const uint *restrict ids, const ulong8 grp) {
  CLFFN_GROUP_SHIFT(w, x, y);
  part += get_global_id(2) * grp.s3;
  CLFFN_PASS_TOKENS();
  const ulong c0 = get_global_id(0) * CLFFN_STRIP;
  const ulong k = get_global_id(1), r0 = k * chunk_rows;
  const ulong r1 = rows - r0 < chunk_rows ? rows : r0 + chunk_rows;
  if (c0 >= cols || !live) { return; }
  const uint n = cols - c0 < CLFFN_STRIP ? (uint)(cols - c0) : CLFFN_STRIP;
  const uint blocks = n / CLFFN_QK;
  floatSV acc[CLFFN_WTOKENS][CLFFN_STRIP / CLFFN_SV];
  float8 tail[CLFFN_WTOKENS][CLFFN_QK / 8];
  #pragma unroll
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    #pragma unroll
    for (uint i = 0; i < CLFFN_STRIP / CLFFN_SV; ++i) { acc[t][i] = (floatSV)0.0f; }
    #pragma unroll
    for (uint i = 0; i < CLFFN_QK / 8; ++i) { tail[t][i] = (float8)0.0f; }
  }
  #pragma unroll
  for (uint p = 0; p < CLFFN_WTOKENS / CLFFN_STRIP_PART; ++p) {
    const uint t0 = p * CLFFN_STRIP_PART;
    if (t0 < tokens) {
      clffn_strip_sums(w + w_off, row_bytes, r0, r1, c0, blocks, n, x + x_off + t0 * ldx, ldx,
                       tokens - t0, acc + t0, tail + t0);
    }
  }
  const int direct = chunk_rows >= rows, scaled = direct && beta != 0.0f;
  #pragma unroll
  for (uint t = 0; t < CLFFN_WTOKENS; ++t) {
    if (t >= tokens) { continue; }
    __global float *out =
        direct ? y + y_off + t * ldy + c0 : part + (k * max_tokens + t) * cols + c0;
    #pragma unroll
    for (uint i = 0; i < CLFFN_STRIP / CLFFN_SV; ++i) {
      if (i < CLFFN_SNV * blocks) {
        const floatSV a = acc[t][i];
        CLFFN_CAT(vstore, CLFFN_SV)
        (scaled ? fma((floatSV)beta, CLFFN_CAT(vload, CLFFN_SV)(i, out), a) : a, i, out);
      }
    }
    #pragma unroll
    for (uint q = 0; q < CLFFN_QK / 8; ++q) {
      const uint j = CLFFN_QK * blocks + 8 * q;
      if (j < n) {
        const float8 a = tail[t][q];
        const float e[8] = {a.s0, a.s1, a.s2, a.s3, a.s4, a.s5, a.s6, a.s7};
        for (uint i = 0; i < 8 && j + i < n; ++i) {
          out[j + i] = scaled ? fma(beta, out[j + i], e[i]) : e[i];
        }
      }
    }
  }
}
#endif

// y[t, c] = Σ_k part[k, t, c] (+ β·y), k in order: NDRange (cols, max_tokens), any work-group;
// count and count_at as clffn_wgemv_cols has them.
__kernel void clffn_wgemv_sum(__global const float *restrict part, const ulong chunks,
                              const uint max_tokens, __global const uint *restrict count,
                              const uint count_at, const ulong cols,
                              __global float *restrict y, const ulong y_off, const ulong ldy,
                              const float beta, __global const uint *restrict ids,
                      const ulong8 grp) {
  CLFFN_GROUP_EXPERT(); // as CLFFN_GROUP_SHIFT: y by grp.s2, part by grp.s3
  part += get_global_id(2) * grp.s3;
  y += group_ * grp.s2;
  count += group_;
  const ulong c = get_global_id(0);
  const uint t = get_global_id(1);
  if (c >= cols || t >= clffn_pass_tokens(max_tokens, count, count_at)) { return; }
  float s = 0.0f;
  for (ulong k = 0; k < chunks; ++k) { s += part[(k * max_tokens + t) * cols + c]; }
  __global float *o = y + y_off + t * ldy + c;
  *o = beta != 0.0f ? fma(beta, *o, s) : s;
}

// ---- dequantization -----------------------------------------------------------------------------

// Eight floats to p: two 16-byte stores where p is 16-byte aligned, as clffn_fload8 loads
// (vstore8 may assume only 4-byte alignment, and NVIDIA's compiler then issues eight stores).
inline void clffn_fstore8(float8 v, __global float *p) {
  if (((size_t)p & 15) == 0) {
    __global float4 *q = (__global float4 *)p;
    q[0] = v.lo;
    q[1] = v.hi;
  } else {
    vstore8(v, 0, p);
  }
}

// out[i·ldo + j] = W[r0 + i, c0 + j] for i < nr, j < nc. NDRange (⌈nc / 8⌉, nr), any work-group:
// each work-item writes eight values of one row (c0 and nc multiples of 32 for the quantized
// types, which is how the host splits them).
__kernel void clffn_wdequant(__global const uchar *restrict w, const ulong w_off,
                             const ulong row_bytes, const ulong r0, const ulong c0,
                             const ulong nr, const ulong nc,
                             __global float *restrict out, const ulong ldo) {
  const ulong j = get_global_id(0) * 8, i = get_global_id(1);
  if (i >= nr || j >= nc) { return; }
  __global const uchar *row = w + w_off + (r0 + i) * row_bytes;
  __global float *o = out + i * ldo + j;
  const ulong c = c0 + j;
  if (j + 8 <= nc && c % 8 == 0) {
    float d;
    const float8 v = clffn_wload8_wide(row, c, &d);
    clffn_fstore8(v * d, o);
    return;
  }
  for (ulong k = 0; k < 8 && j + k < nc; ++k) { o[k] = clffn_wvalue(row, c + k); }
}

// The same block transposed: out[j·ldo + i] = W[r0 + i, c0 + j] for i < nr, j < nc, so that
// SGEMM gets the block as an untransposed operand where the inner dimension runs along W's rows,
// and CLBlast need not transpose it on each call (src/linear.c). NDRange (⌈nc / 8⌉,
// ⌈nr / 8⌉), any work-group: each work-item reads an 8 × 8 tile, eight values of eight rows (the
// neighbours along the first dimension reading on along the same rows), and writes each row's
// eight values down eight output rows (CLFFN_TILE_ROW): scalar stores, not vectors built across
// the rows, whose shuffles Oclgrind's uninitialized-value check (21.10) crashes on.
#define CLFFN_TILE_ROW(r)                                                                      \
  {                                                                                            \
    float d;                                                                                   \
    const float8 v = clffn_wload8_wide(row + r * row_bytes, c, &d);                            \
    const float8 u = v * d;                                                                    \
    o[r] = u.s0, o[ldo + r] = u.s1, o[2 * ldo + r] = u.s2, o[3 * ldo + r] = u.s3;              \
    o[4 * ldo + r] = u.s4, o[5 * ldo + r] = u.s5, o[6 * ldo + r] = u.s6;                       \
    o[7 * ldo + r] = u.s7;                                                                     \
  }
__kernel void clffn_wdequant_t(__global const uchar *restrict w, const ulong w_off,
                               const ulong row_bytes, const ulong r0, const ulong c0,
                               const ulong nr, const ulong nc,
                               __global float *restrict out, const ulong ldo) {
  const ulong j = get_global_id(0) * 8, i = get_global_id(1) * 8;
  if (i >= nr || j >= nc) { return; }
  __global const uchar *row = w + w_off + (r0 + i) * row_bytes;
  const ulong c = c0 + j;
  if (i + 8 <= nr && j + 8 <= nc && c % 8 == 0) {
    __global float *o = out + j * ldo + i;
    CLFFN_TILE_ROW(0) CLFFN_TILE_ROW(1) CLFFN_TILE_ROW(2) CLFFN_TILE_ROW(3)
    CLFFN_TILE_ROW(4) CLFFN_TILE_ROW(5) CLFFN_TILE_ROW(6) CLFFN_TILE_ROW(7)
    return;
  }
  for (ulong r = 0; r < 8 && i + r < nr; ++r) { // a tile at the block's edge, value by value
    for (ulong k = 0; k < 8 && j + k < nc; ++k) {
      out[(j + k) * ldo + i + r] = clffn_wvalue(row + r * row_bytes, c + k);
    }
  }
}
#undef CLFFN_TILE_ROW

// The transposed block again, for GPUs, where clffn_wdequant_t's stores are the bottleneck: its
// neighbouring work-items write eight output rows apart, so each store of a warp touches 32
// lines (on an H100 it cost about 2.5 ms of a few-token f16 forward of 4096 -> 11008 SwiGLU).
// Here a work-group of 8 × 32 work-items takes a tile of 32 of W's rows by 64 of its columns:
// each work-item reads eight values of one row, as clffn_wdequant_t's neighbours do, into local
// memory, and after the barrier the work-group writes the tile's 64 output rows, 32 consecutive
// floats of one row for every 32 work-items. NDRange (⌈nc / 8⌉ rounded up to 8, nr rounded up
// to 32), work-groups of exactly (8, 32): the host takes this form where the device runs such
// work-groups (src/wmatrix.c).
#define CLFFN_TL_ROWS CLFFN_WDEQUANT_TILE_ROWS // W's rows (output columns): the second size
#define CLFFN_TL_COLS CLFFN_WDEQUANT_TILE_COLS // W's columns (output rows): eight values an item
__kernel __attribute__((reqd_work_group_size(CLFFN_TL_COLS / 8, CLFFN_TL_ROWS, 1)))
void clffn_wdequant_tl(__global const uchar *restrict w, const ulong w_off, const ulong row_bytes,
                       const ulong r0, const ulong c0, const ulong nr, const ulong nc,
                       __global float *restrict out, const ulong ldo) {
  // [column][row], a row longer by one so that a column's values fall in different banks
  __local float tile[CLFFN_TL_COLS][CLFFN_TL_ROWS + 1];
  const uint a = get_local_id(0), b = get_local_id(1);
  const ulong j = get_global_id(0) * 8, i = get_global_id(1);
  if (i < nr && j < nc) {
    __global const uchar *row = w + w_off + (r0 + i) * row_bytes;
    const ulong c = c0 + j;
    if (j + 8 <= nc && c % 8 == 0) {
      float d;
      const float8 v = clffn_wload8_wide(row, c, &d) * d;
      tile[a * 8 + 0][b] = v.s0, tile[a * 8 + 1][b] = v.s1;
      tile[a * 8 + 2][b] = v.s2, tile[a * 8 + 3][b] = v.s3;
      tile[a * 8 + 4][b] = v.s4, tile[a * 8 + 5][b] = v.s5;
      tile[a * 8 + 6][b] = v.s6, tile[a * 8 + 7][b] = v.s7;
    } else {
      for (uint k = 0; k < 8 && j + k < nc; ++k) { tile[a * 8 + k][b] = clffn_wvalue(row, c + k); }
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  // the tile's first output row and column; work-item L writes column L % 32 of rows L / 32,
  // L / 32 + 8, ...: the values loaded above and no others, as both test the same bounds
  const ulong J0 = get_group_id(0) * CLFFN_TL_COLS, I0 = get_group_id(1) * CLFFN_TL_ROWS;
  const uint L = b * (CLFFN_TL_COLS / 8) + a, ii = L % CLFFN_TL_ROWS;
  if (I0 + ii >= nr) { return; }
  for (uint jj = L / CLFFN_TL_ROWS; jj < CLFFN_TL_COLS; jj += CLFFN_TL_COLS / 8) {
    if (J0 + jj < nc) { out[(J0 + jj) * ldo + I0 + ii] = tile[jj][ii]; }
  }
}
#undef CLFFN_TL_ROWS
#undef CLFFN_TL_COLS
