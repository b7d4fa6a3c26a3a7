// =================================================================================================
// philox.cl — the counter-based generator behind dropout.
//
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC11),
// the same function as Random123's philox4x32_10 and clffn_philox4x32_10() on the host. A word of
// the dropout mask is a pure function of (key, counter), so the mask does not depend on the
// device, the work-group size or the order in which work-items run.
//
//   counter (c0 c1 c2 c3) ──► 10 × [ two 32×32→64 multiplies, xor with the key ] ──► 4 words
//   key     (k0 k1)       ──► bumped by the Weyl constants between rounds
// =================================================================================================

// The round multipliers and key bumps, CLFFN_PHILOX_*, are in clffn_defs.h (shared with the host).

inline uint4 clffn_philox(uint4 c, uint2 k) {
  #pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) { k.x += CLFFN_PHILOX_W0; k.y += CLFFN_PHILOX_W1; }
    const uint hi0 = mul_hi(CLFFN_PHILOX_M0, c.x);
    const uint lo0 = CLFFN_PHILOX_M0 * c.x;
    const uint hi1 = mul_hi(CLFFN_PHILOX_M1, c.z);
    const uint lo1 = CLFFN_PHILOX_M1 * c.z;
    c = (uint4)(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
  }
  return c;
}

// The counter of hidden element e under a stream offset: (offset + e/4) as 64 bits, then 0, 0.
inline uint4 clffn_philox_counter(const ulong offset, const ulong e) {
  const ulong c = offset + (e >> 2);
  return (uint4)((uint)c, (uint)(c >> 32), 0u, 0u);
}

// The dropout words of hidden elements e0 .. e0+3, whatever e0's alignment: word i of them is
// w[(e0 & 3) + i]. They lie in e0's Philox block and, unless e0 starts one, the next block, so a
// work-item pays for two blocks at most instead of one per element. (Selecting a lane with
// `e & 3 == 0 ? r.x : …` is what LLVM turns into a switch on an i2, which Oclgrind 21.10
// evaluates wrongly for e >= 4; an indexed array is the same words by a route it gets right.)
inline void clffn_philox_span(const ulong offset, const ulong e0, const uint2 key, uint w[8]) {
  vstore4(clffn_philox(clffn_philox_counter(offset, e0), key), 0, w);
  if (e0 & 3) { vstore4(clffn_philox(clffn_philox_counter(offset, e0 + 4), key), 1, w); }
}

// Raw generator output for the known-answer tests: out[0..3] = philox(counter, key).
__kernel void clffn_philox_raw(__global uint *out, const uint4 counter, const uint2 key) {
  const uint4 r = clffn_philox(counter, key);
  vstore4(r, 0, out);
}
