// =================================================================================================
// fill.cl — zeroing a range of floats, for outputs a CLBlast routine reads even when told not to.
//
// CLBlast's GEMV computes y = α·A·x + β·y as written, so with β = 0 a NaN already in y survives
// (0·NaN). The small-batch path zeroes y with this kernel first. It is its own tiny program
// (src/program.c), built on first use, so a context that never runs a GEMV never builds it.
// clEnqueueFillBuffer would do the same, but a strict simulator (Oclgrind 21.10) does not track
// what it writes and reports every later read of it as uninitialized.
// =================================================================================================

// p[off + i] = 0 for i < n; NDRange: n, any local size.
__kernel void clffn_zero(__global float *p, const ulong off, const ulong n) {
  const ulong i = get_global_id(0);
  if (i < n) { p[off + i] = 0.0f; }
}
