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

__kernel void clffn_epilogue1_backward(__global const float *restrict dh,
                                       __global const float *restrict z, const ulong ldz,
                                       __global float *restrict dz,
                                       __global const float *restrict b1, const ulong b1_off,
                                       __global const float *restrict bv, const ulong bv_off,
                                       const uint flags, const ulong tokens, const ulong d_ff,
                                       const ulong drop_threshold, const float drop_scale,
                                       const uint2 key, const ulong rng_offset) {
  const ulong j0 = (ulong)get_global_id(0) * 4;
  const ulong t = get_global_id(1);
  if (t >= tokens || j0 >= d_ff) { return; }
  __global const float *zrow = z + t * ldz;
  __global float *dzrow = dz + t * ldz;
  for (ulong j = j0; j < j0 + 4 && j < d_ff; ++j) {
    float d = dh[t * d_ff + j];
    #if CLFFN_DROPOUT
      d = CLFFN_DROP(d, clffn_philox_word(rng_offset, t * d_ff + j, key));
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

// out[out_off + j] (+)= Σ_t m[m_off + t·ld + j], j < n: the bias gradients. One work-item per
// column walks the rows, so neighbouring work-items read neighbouring floats.
__kernel void clffn_column_sums(__global const float *restrict m, const ulong m_off, const ulong ld,
                                const ulong rows, const ulong n,
                                __global float *restrict out, const ulong out_off,
                                const uint accumulate) {
  const ulong j = get_global_id(0);
  if (j >= n) { return; }
  float s = 0.0f;
  for (ulong t = 0; t < rows; ++t) { s += m[m_off + t * ld + j]; }
  out[out_off + j] = accumulate ? out[out_off + j] + s : s;
}
