// =================================================================================================
// backward.cl — the backward pass's own kernels; the products around them are CLBlast SGEMMs.
//
//   dy[T,D] ──SGEMM(W2)──► dh[T,F] ──epilogue1_backward──► dz[T,ldz] ──SGEMM([W1|V])──► dx[T,D]
//      │                              (z and the mask recomputed        │
//      ├─ column sums ─► db2          from the forward's Philox counter) ├─ column sums ─► db1, dbv
//      └─ SGEMM with h ─► dW2                                            └─ SGEMM with x ─► dW1, dV
//
//   epilogue1_backward: with a = z1 + b1, g = z2 + bv, and dropout's mask m and scale s,
//     dh' = dh · m · s,  da = dh' · act'(a) [· g],  dg = dh' · act(a)
// Nothing here depends on the work-group size; elements are indexed as in the forward.
// =================================================================================================

// vec = 1 when d_ff, rng_ld and rng_col0 are multiples of 4: then a work-item's four columns are
// one float4 of each row and one Philox block, as in the forward's epilogue1 (the scalar path
// ran 3-5x slower per byte there).
__kernel void clffn_epilogue1_backward(__global const float *restrict dh,
                                       __global const float *restrict z, const ulong ldz,
                                       __global float *restrict dz,
                                       __global const float *restrict b1, const ulong b1_off,
                                       __global const float *restrict bv, const ulong bv_off,
                                       const uint flags, const ulong tokens, const ulong d_ff,
                                       const ulong drop_threshold, const float drop_scale,
                                       const uint2 key, const ulong rng_offset,
                                       const ulong rng_ld, const ulong rng_col0,
                                       const uint vec) {
  const ulong j0 = (ulong)get_global_id(0) * CLFFN_COLUMNS_PER_ITEM;
  const ulong t = get_global_id(1);
  if (t >= tokens || j0 >= d_ff) { return; }
  #if CLFFN_DROPOUT
    // The element's index in the whole hidden layer [T, rng_ld]: a shard holding the columns
    // [rng_col0, rng_col0 + d_ff) draws the unsplit layer's mask.
    const ulong e0 = t * rng_ld + rng_col0 + j0;
  #endif
  __global const float *zrow = z + t * ldz;
  __global float *dzrow = dz + t * ldz;
  if (vec) {
    float4 d = vload4(0, dh + t * d_ff + j0);
    #if CLFFN_DROPOUT
      const uint4 r = clffn_philox(clffn_philox_counter(rng_offset, e0), key);
      d = (float4)(CLFFN_DROP(d.x, r.x), CLFFN_DROP(d.y, r.y),
                   CLFFN_DROP(d.z, r.z), CLFFN_DROP(d.w, r.w));
    #endif
    float4 a = vload4(0, zrow + j0);
    if (flags & CLFFN_F_BIAS1) { a += vload4(0, b1 + b1_off + j0); }
    #if CLFFN_GATED
      float4 g = vload4(0, zrow + d_ff + j0);
      if (flags & CLFFN_F_BIAS_GATE) { g += vload4(0, bv + bv_off + j0); }
      vstore4(d * CLFFN_ACTIVATE_GRAD4(a) * g, 0, dzrow + j0);
      vstore4(d * CLFFN_ACTIVATE4(a), 0, dzrow + d_ff + j0);
    #else
      vstore4(d * CLFFN_ACTIVATE_GRAD4(a), 0, dzrow + j0);
    #endif
    return;
  }
  #if CLFFN_DROPOUT
    uint w[8]; // the forward's words (see clffn_philox_span)
    clffn_philox_span(rng_offset, e0, key, w);
    const uint lane0 = (uint)(e0 & 3);
  #endif
  for (ulong j = j0; j < j0 + 4 && j < d_ff; ++j) {
    float d = dh[t * d_ff + j];
    #if CLFFN_DROPOUT
      d = CLFFN_DROP(d, w[lane0 + (uint)(j - j0)]);
    #endif
    float a = zrow[j];
    if (flags & CLFFN_F_BIAS1) { a += b1[b1_off + j]; }
    #if CLFFN_GATED
      float g = zrow[d_ff + j];
      if (flags & CLFFN_F_BIAS_GATE) { g += bv[bv_off + j]; }
      dzrow[j] = d * CLFFN_ACTIVATE_GRAD(a) * g;
      dzrow[d_ff + j] = d * CLFFN_ACTIVATE(a);
    #else
      dzrow[j] = d * CLFFN_ACTIVATE_GRAD(a);
    #endif
  }
}

// The bias gradients, out[out_off + j] (+)= Σ_t m[m_off + t·ld + j] for j < n, in two passes:
// clffn_column_partials sums chunks of chunk_rows rows for 4 columns per work-item into
// partial[c·n + j], and clffn_column_sums adds a column's chunks. One work-item walking all the
// rows of one column (the first version) ran at 1 GB/s on POCL: each work-item touched a new
// cache line per row, and its neighbours, which share those lines, came too late to find them
// cached. A chunk of rows × 4 columns stays in L1 until the neighbours have read it, and on a GPU
// neighbouring work-items still read neighbouring floats. The order of the additions is fixed
// by the chunking alone, so the sums do not depend on the work-group size.
__kernel void clffn_column_partials(__global const float *restrict m, const ulong m_off,
                                    const ulong ld, const ulong rows, const ulong n,
                                    const ulong chunk_rows, __global float *restrict partial) {
  const ulong j0 = (ulong)get_global_id(0) * CLFFN_COLUMNS_PER_ITEM;
  const ulong c = get_global_id(1);
  const ulong t0 = c * chunk_rows;
  if (j0 >= n || t0 >= rows) { return; }
  const ulong t1 = min(rows, t0 + chunk_rows);
  __global const float *col = m + m_off + j0;
  if (j0 + 4 <= n) {
    float4 s = (float4)(0.0f);
    for (ulong t = t0; t < t1; ++t) { s += vload4(0, col + t * ld); }
    vstore4(s, 0, partial + c * n + j0);
  } else {
    for (ulong j = 0; j < n - j0; ++j) {
      float s = 0.0f;
      for (ulong t = t0; t < t1; ++t) { s += col[t * ld + j]; }
      partial[c * n + j0 + j] = s;
    }
  }
}

__kernel void clffn_column_sums(__global const float *restrict partial, const ulong chunks,
                                const ulong n, __global float *restrict out, const ulong out_off,
                                const uint accumulate) {
  const ulong j = get_global_id(0);
  if (j >= n) { return; }
  float s = 0.0f;
  for (ulong c = 0; c < chunks; ++c) { s += partial[c * n + j]; }
  out[out_off + j] = accumulate ? out[out_off + j] + s : s;
}
