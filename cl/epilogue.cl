// =================================================================================================
// epilogue.cl — everything between and after the two SGEMMs, fused so that each tensor is read
// once and written once.
//
//   x[T,D] ──SGEMM──► z[T,ldz] ──epilogue1──► h[T,F] ──SGEMM──► u[T,D] ──epilogue2──► y[T,D]
//                     (W1 part in columns 0..F-1, V part in F..2F-1 when gated)
//
//   epilogue1:  h = dropout(act(z1 + b1) ⊙ (z2 + bv))        (gate and biases optional)
//   epilogue2:  y = u + b2 (+ x)                               (bias and residual optional)
//
// NDRange of both: (ceil(columns / 4), T). A work-item handles four consecutive columns of one
// row: as float4 when the row length is a multiple of 4 (vec = 1), else one column at a time.
// Dropout draws by the element's place in the whole hidden layer (rng_ld columns, this FFN's
// from rng_col0 on), so a tensor-parallel shard drops what the unsplit layer drops; vec also
// needs that place to start Philox blocks.
// count (NULL but for a mixture-of-experts layer's expert, whose row count stays on the device)
// holds the rows at count[count_at], at most tokens; the rows past it are left alone.
// grp: a grouped launch, several such experts at once, one a step g of the third dimension:
// expert e = ids[grp.s4 + g] where grp.s4 is set, else g (as cl/weights.cl's grouped launches
// have it, ids read either way); expert e's tensors lie e times grp's strides (in floats) after
// the first's, and its count at count_at + e; all zero (one expert, or none) for a single FFN.
// A tiled launch (grp.s7 set) takes the biases by step g's expert ids[grp.s7 + g] and the
// rest by g, a tile of rows (as cl/weights.cl's CLFFN_GROUP_EXPERT).
// vload4/vstore4 need only float alignment, so the buffers' offsets do not matter.
// Nothing here depends on the work-group size; the host passes NULL or a test's override.
// =================================================================================================

// Compile-time parameters, set by the host per FFN (defaults shown):
#ifndef CLFFN_GATED
  #define CLFFN_GATED 0   // 1: multiply by the gate's linear part (GLU family)
#endif
#ifndef CLFFN_DROPOUT
  #define CLFFN_DROPOUT 0 // 1: training-mode dropout with p > 0
#endif

// Runtime flags: CLFFN_F_* in clffn_defs.h.

// Dropout of one element: kept values are scaled by 1/(1-p), dropped ones multiplied by 0, as
// PyTorch does (input * mask): a finite value becomes 0, while NaN and Inf stay NaN, so dropout
// never hides a non-finite hidden value. drop_threshold = round(p * 2^32): p = 0 keeps all and
// p = 1 drops all.
#define CLFFN_DROP(v, word) ((v) * (((ulong)(word) < drop_threshold) ? 0.0f : drop_scale))

__kernel void clffn_epilogue1(__global const float *restrict z, const ulong ldz,
                              __global float *restrict h,
                              __global const float *restrict b1, const ulong b1_off,
                              __global const float *restrict bv, const ulong bv_off,
                              const uint flags, const ulong tokens, const ulong d_ff,
                              const ulong drop_threshold, const float drop_scale,
                              const uint2 key, const ulong rng_offset,
                              const ulong rng_ld, const ulong rng_col0, const uint vec,
                              __global const uint *count, const uint count_at,
                              __global const uint *restrict ids, const ulong8 grp) {
  const uint listed = ids[grp.s4 + get_global_id(2)];
  const ulong g = grp.s4 ? listed : get_global_id(2);
  const uint tiled = ids[grp.s7 + g];
  const ulong e = grp.s7 ? tiled : g;
  // z, h and the biases (b1 and bv alike) by grp.s0, s1, s2
  z += g * grp.s0;
  h += g * grp.s1;
  b1 += e * grp.s2;
  bv += e * grp.s2;
  count += g;
  const ulong j0 = (ulong)get_global_id(0) * CLFFN_COLUMNS_PER_ITEM;
  const ulong t = get_global_id(1);
  if (t >= tokens || (count && t >= count[count_at]) || j0 >= d_ff) { return; }
  #if CLFFN_DROPOUT
    // The element's index in the whole hidden layer [T, rng_ld]: a shard holding the columns
    // [rng_col0, rng_col0 + d_ff) draws the unsplit layer's mask.
    const ulong e0 = t * rng_ld + rng_col0 + j0;
  #endif
  __global const float *zrow = z + t * ldz;
  __global float *hrow = h + t * d_ff;

  if (vec) { // d_ff, rng_ld and rng_col0 % 4 == 0: four columns at once, one Philox block
    float4 a = vload4(0, zrow + j0);
    if (flags & CLFFN_F_BIAS1) { a += vload4(0, b1 + b1_off + j0); }
    float4 v = CLFFN_ACTIVATE4(a);
    #if CLFFN_GATED
      float4 g = vload4(0, zrow + d_ff + j0);
      if (flags & CLFFN_F_BIAS_GATE) { g += vload4(0, bv + bv_off + j0); }
      v *= g;
    #endif
    #if CLFFN_DROPOUT
      const uint4 r = clffn_philox(clffn_philox_counter(rng_offset, e0), key);
      v = (float4)(CLFFN_DROP(v.x, r.x), CLFFN_DROP(v.y, r.y),
                   CLFFN_DROP(v.z, r.z), CLFFN_DROP(v.w, r.w));
    #endif
    vstore4(v, 0, hrow + j0);
    return;
  }

  #if CLFFN_DROPOUT
    // Rows need not start on a Philox block here: the four elements may span two.
    uint w[8];
    clffn_philox_span(rng_offset, e0, key, w);
    const uint lane0 = (uint)(e0 & 3);
  #endif
  for (ulong j = j0; j < j0 + 4 && j < d_ff; ++j) {
    float a = zrow[j];
    if (flags & CLFFN_F_BIAS1) { a += b1[b1_off + j]; }
    float v = CLFFN_ACTIVATE(a);
    #if CLFFN_GATED
      float g = zrow[d_ff + j];
      if (flags & CLFFN_F_BIAS_GATE) { g += bv[bv_off + j]; }
      v *= g;
    #endif
    #if CLFFN_DROPOUT
      v = CLFFN_DROP(v, w[lane0 + (uint)(j - j0)]);
    #endif
    hrow[j] = v;
  }
}

// y[T, D] (at y_off) = u[T, D] + b2 (+ x at x_off). y may be x itself: each element is read
// before it is written by the same work-item, so x and y are deliberately not restrict.
__kernel void clffn_epilogue2(__global const float *restrict u,
                              __global float *y, const ulong y_off,
                              __global const float *x, const ulong x_off,
                              __global const float *restrict b2, const ulong b2_off,
                              const uint flags, const uint vec,
                              const ulong tokens, const ulong d_model,
                              __global const uint *count, const uint count_at,
                              __global const uint *restrict ids, const ulong8 grp) {
  const uint listed = ids[grp.s4 + get_global_id(2)];
  const ulong g = grp.s4 ? listed : get_global_id(2);
  const uint tiled = ids[grp.s7 + g];
  const ulong e = grp.s7 ? tiled : g;
  // u, y, b2 and x by grp.s0, s1, s2, s3
  u += g * grp.s0;
  y += g * grp.s1;
  b2 += e * grp.s2;
  x += g * grp.s3;
  count += g;
  const ulong i0 = (ulong)get_global_id(0) * CLFFN_COLUMNS_PER_ITEM;
  const ulong t = get_global_id(1);
  if (t >= tokens || (count && t >= count[count_at]) || i0 >= d_model) { return; }
  const ulong row = t * d_model;

  if (vec) {
    float4 v = vload4(0, u + row + i0);
    if (flags & CLFFN_F_BIAS2) { v += vload4(0, b2 + b2_off + i0); }
    if (flags & CLFFN_F_RESIDUAL) { v += vload4(0, x + x_off + row + i0); }
    vstore4(v, 0, y + y_off + row + i0);
    return;
  }
  for (ulong i = i0; i < i0 + 4 && i < d_model; ++i) {
    float v = u[row + i];
    if (flags & CLFFN_F_BIAS2) { v += b2[b2_off + i]; }
    if (flags & CLFFN_F_RESIDUAL) { v += x[x_off + row + i]; }
    y[y_off + row + i] = v;
  }
}
