// =================================================================================================
// moe.cl — a mixture-of-experts layer's routing, on the device (src/moe.c).
//
//   x[T,D] ─logits, route─► experts[T,k], weights[T,k], probs[T,E], gate[T] (the shared
//                            expert's scale)
//          ─count, place─► counts[E], slot[T,k] (row of the gathered matrix)
//          (route, count and place in one launch for up to CLFFN_MOE_LANES choices: route_few)
//          ─gather─► xg  (each expert's tokens contiguous, in token order: packed, [T·k, D], or
//                         where the host never reads the counts, from row e·T for expert e,
//                         [E·T, D], or past one pass of the kernels in tiles of CLFFN_MOE_TILE
//                         rows, [TILE·S, D], S the tiles' bound, clffn_moe_tiles)
//          … each expert's FFN on its rows of xg, into yg …
//          ─combine─► y[T,D] = gate[t]·shared[T,D] + Σ_j weights[t,j]·yg[slot[t,j]]
//
// Every step is deterministic and independent of the device's scheduling: each output element is
// computed by one work-item (a logit by one work-group of a fixed size, in a fixed tree), in a
// fixed order, so a layer gives the same bits however it is scheduled.
// =================================================================================================

// The router's logits: logit[t, r] = b[r] + Σ_d x[t,d]·wr[r,d] (wr [R, D]; has_bias 0 ignores
// b), one work-group of CLFFN_MOE_LANES (clffn_defs.h) work-items per (r, t), NDRange (LANES, R,
// T): lane l takes d = l, l + LANES, …, and the lanes' sums meet in a fixed tree, so the bits
// depend on nothing but LANES. One work-item per token walking all R·D products was
// latency-bound on a GPU (Mixtral's router, 8 × 4096, one token: over a millisecond). Rows r < E
// go to probs[t, r] (logits until clffn_moe_route makes them probabilities); row E, a gated
// shared expert's, to gate[t].
__kernel __attribute__((reqd_work_group_size(CLFFN_MOE_LANES, 1, 1)))
void clffn_moe_logits(__global const float *x, const ulong x_off, __global const float *wr,
                      __global const float *br, const int has_bias, const uint E, const uint D,
                      __global float *probs, __global float *gate) {
  const uint l = get_local_id(0), r = get_global_id(1), t = get_global_id(2);
  __global const float *xt = x + x_off + (ulong)t * D, *w = wr + (ulong)r * D;
  float acc = 0.0f;
  for (uint d = l; d < D; d += CLFFN_MOE_LANES) { acc = fma(xt[d], w[d], acc); }
  __local float part[CLFFN_MOE_LANES];
  part[l] = acc;
  for (uint h = CLFFN_MOE_LANES / 2; h > 0; h /= 2) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (l < h) { part[l] += part[l + h]; }
  }
  if (l == 0) { // lane 0 wrote part[0] last itself
    const float logit = part[0] + (has_bias ? br[r] : 0.0f);
    if (r < E) {
      probs[(ulong)t * E + r] = logit;
    } else {
      gate[t] = logit;
    }
  }
}

// The same logits with one work-item per (r, t), NDRange (R rounded up, T), any work-group: for
// a CPU device, where POCL runs a work-group's 64 lanes and its barriers in turn, which made a
// 128-row router (Qwen3's) a sixth of the one-token layer. The 64 lanes' sums are kept in four
// float16 vectors and added in clffn_moe_logits' tree, each lane's products in its order, so
// the bits are that kernel's.
#if CLFFN_MOE_LANES != 64
#error "clffn_moe_logits_rows keeps the lanes in four float16 vectors"
#endif
__kernel void clffn_moe_logits_rows(__global const float *x, const ulong x_off,
                                    __global const float *wr, __global const float *br,
                                    const int has_bias, const uint E, const uint D,
                                    __global float *probs, __global float *gate, const uint R) {
  const uint r = get_global_id(0), t = get_global_id(1);
  if (r >= R) { return; }
  __global const float *xt = x + x_off + (ulong)t * D, *w = wr + (ulong)r * D;
  float16 a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f; // lanes 0-15, 16-31, 32-47, 48-63
  const uint whole = D / CLFFN_MOE_LANES * CLFFN_MOE_LANES;
  for (uint d = 0; d < whole; d += CLFFN_MOE_LANES) {
    a0 = fma(vload16(0, xt + d), vload16(0, w + d), a0);
    a1 = fma(vload16(0, xt + d + 16), vload16(0, w + d + 16), a1);
    a2 = fma(vload16(0, xt + d + 32), vload16(0, w + d + 32), a2);
    a3 = fma(vload16(0, xt + d + 48), vload16(0, w + d + 48), a3);
  }
  float part[CLFFN_MOE_LANES];
  vstore16(a0, 0, part), vstore16(a1, 1, part), vstore16(a2, 2, part), vstore16(a3, 3, part);
  for (uint d = whole; d < D; ++d) { part[d - whole] = fma(xt[d], w[d], part[d - whole]); }
  for (uint h = CLFFN_MOE_LANES / 2; h > 0; h /= 2) {
    for (uint l = 0; l < h; ++l) { part[l] += part[l + h]; }
  }
  const float logit = part[0] + (has_bias ? br[r] : 0.0f);
  if (r < E) {
    probs[(ulong)t * E + r] = logit;
  } else {
    gate[t] = logit;
  }
}

// Token t's choice (clffn_moe_route: a work-item per token, NDRange T, any work-group), from
// clffn_moe_logits' logits: softmax probabilities over the E logits (max subtracted), then the k
// largest in order, a tie going to the lower expert index: pass j takes the largest logit below
// pass j-1's in the order (logit descending, index ascending), so no chosen-set is kept and E has
// no bound.
// normalize = 1 rescales the k probabilities to sum 1 (Mixtral); 0 keeps them (Switch, Qwen2-MoE
// with norm_topk_prob false). R = E + 1 (a gated shared expert, Qwen2-MoE's): gate[t] becomes
// sigmoid(its logit), outside the softmax.
void clffn_moe_route_token(const uint t, const uint E, const uint k, const int normalize,
                           __global float *probs, __global int *experts, __global float *weights,
                           const uint R, __global float *gate) {
  __global float *p = probs + (ulong)t * E;
  float mx = -INFINITY;
  for (uint e = 0; e < E; ++e) { mx = fmax(mx, p[e]); }
  // the choice is made on the logits, which order the experts as the probabilities do; a NaN
  // logit (from a NaN or infinite input) ranks as -inf, so k experts are always chosen and every
  // index stays in bounds (the token's outputs are then NaN, as its input was)
  float prev = INFINITY;
  int prev_e = -1;
  for (uint j = 0; j < k; ++j) {
    int best = -1;
    float bl = -INFINITY;
    for (uint e = 0; e < E; ++e) {
      const float l = isnan(p[e]) ? -INFINITY : p[e];
      const int after_prev = l < prev || (l == prev && (int)e > prev_e);
      if (after_prev && (best < 0 || l > bl)) { best = (int)e, bl = l; }
    }
    experts[(ulong)t * k + j] = best;
    prev = bl, prev_e = best;
  }
  float sum = 0.0f;
  for (uint e = 0; e < E; ++e) {
    p[e] = exp(p[e] - mx);
    sum += p[e];
  }
  for (uint e = 0; e < E; ++e) { p[e] /= sum; }
  float chosen = 0.0f;
  for (uint j = 0; j < k; ++j) { chosen += p[experts[(ulong)t * k + j]]; }
  for (uint j = 0; j < k; ++j) {
    const float pj = p[experts[(ulong)t * k + j]];
    weights[(ulong)t * k + j] = normalize ? pj / chosen : pj;
  }
  if (R > E) { gate[t] = 1.0f / (1.0f + exp(-gate[t])); }
}

__kernel void clffn_moe_route(const uint E, const uint k, const int normalize, const uint T,
                              __global float *probs, __global int *experts,
                              __global float *weights, const uint R, __global float *gate) {
  const uint t = get_global_id(0);
  if (t < T) { clffn_moe_route_token(t, E, k, normalize, probs, experts, weights, R, gate); }
}

// Lane l of a work-group of CLFFN_MOE_LANES takes the choices [*i0, *i1), a contiguous run, so
// that its matches come after every lower lane's in token order; returns how many name e.
uint clffn_moe_run_count(__global const int *experts, const uint n, const uint e, const uint l,
                         uint *i0, uint *i1) {
  const uint run = (n + CLFFN_MOE_LANES - 1) / CLFFN_MOE_LANES;
  *i0 = min(n, l * run), *i1 = min(n, *i0 + run);
  uint c = 0;
  for (uint i = *i0; i < *i1; ++i) { c += experts[i] == (int)e; }
  return c;
}

// counts[e] = how many of the n = T·k choices name expert e; a work-group of CLFFN_MOE_LANES
// per expert, NDRange (LANES, E): each lane counts its run of choices, and lane 0 adds the
// lanes' counts, so an expert's count takes n / LANES steps, not n (integers: any order gives
// the same count). counts[E] = 0: the count of the expert numbered E in the list below, whose
// E entries (counts[E + 1 + e]) start as E here, one for each work-group.
__kernel __attribute__((reqd_work_group_size(CLFFN_MOE_LANES, 1, 1)))
void clffn_moe_count(__global const int *experts, const uint n, __global uint *counts) {
  const uint l = get_local_id(0), e = get_global_id(1);
  uint i0, i1;
  __local uint part[CLFFN_MOE_LANES];
  part[l] = clffn_moe_run_count(experts, n, e, l, &i0, &i1);
  barrier(CLK_LOCAL_MEM_FENCE);
  if (l == 0) {
    uint sum = 0;
    for (uint j = 0; j < CLFFN_MOE_LANES; ++j) { sum += part[j]; }
    counts[e] = sum;
    counts[get_global_size(1) + 1 + e] = get_global_size(1);
    if (e == 0) { counts[get_global_size(1)] = 0; }
  }
}

// Lists expert e for the grouped launches (moe_grouped.c), after the E + 1 counts, where it has
// rows. Those launches run G = min(E, n) steps, step j taking expert counts[E + 1 + j]; the W
// experts with rows, in index order, go to steps ⌊i·G / W⌋ (i their rank, distinct as W ≤ G),
// the others' steps keep clffn_moe_count's E, whose count is 0. Spread so, the steps with work
// are not all at the front of the launch, which a CPU device's threads take in runs: 128
// experts, top-8, 16 tokens, 70 of the 128 steps have rows.
void clffn_moe_list(__global uint *counts, const uint E, const uint n, const uint e) {
  uint below = 0, with_rows = 0; // experts with rows below e, and in all
  for (uint f = 0; f < E; ++f) {
    const uint has = counts[f] > 0;
    below += f < e ? has : 0;
    with_rows += has;
  }
  const uint G = min(E, n);
  if (counts[e]) { counts[E + 1 + (uint)((ulong)below * G / with_rows)] = e; }
}

// Expert e's first row of the gathered matrix: after every lower expert's (stride 0), e·stride,
// or (stride CLFFN_MOE_TILED) after every lower expert's tiles, CLFFN_MOE_TILE rows each.
uint clffn_moe_first_row(__global const uint *counts, const uint e, const uint stride) {
  const int tiled = stride == CLFFN_MOE_TILED;
  uint s = tiled ? 0 : e * stride;
  for (uint f = 0; (stride == 0 || tiled) && f < e; ++f) {
    s += tiled ? (counts[f] + CLFFN_MOE_TILE - 1) / CLFFN_MOE_TILE * CLFFN_MOE_TILE : counts[f];
  }
  return s;
}

// Expert e's tiles, for the tiled layout (clffn_moe_first_row), after the counts and the list:
// S = CLFFN_MOE_TILE_STEPS(n, E) tiles' row counts from counts[2E + 1], then their experts from
// counts[2E + 1 + S]. Tile j of the experts' in index order holds rows j·CLFFN_MOE_TILE on of
// the gathered matrix: expert e's ⌈n_e / TILE⌉ tiles follow the lower experts', full but for
// the last. The tiles past the last expert's, up to S, get no rows and expert E, and are spread
// over the experts' calls (e, e + E, …). The grouped launches run S steps, step g tile g
// (cl/weights.cl, CLFFN_GROUP_EXPERT).
void clffn_moe_tiles(__global uint *counts, const uint E, const uint n, const uint e) {
  const uint S = CLFFN_MOE_TILE_STEPS(n, E);
  __global uint *rows = counts + 2 * E + 1, *owner = rows + S;
  uint first = 0, used = 0; // e's first tile, and the tiles of all
  for (uint f = 0; f < E; ++f) {
    const uint t = (counts[f] + CLFFN_MOE_TILE - 1) / CLFFN_MOE_TILE;
    first += f < e ? t : 0;
    used += t;
  }
  const uint c = counts[e];
  for (uint j = 0; j * CLFFN_MOE_TILE < c; ++j) {
    rows[first + j] = min(CLFFN_MOE_TILE, c - j * CLFFN_MOE_TILE);
    owner[first + j] = e;
  }
  for (uint g = used + e; g < S; g += E) {
    rows[g] = 0;
    owner[g] = E;
  }
}

// Expert e's rows of the gathered matrix (clffn_moe_first_row on) go to its choices in token
// order: slot[i] is choice i's row. A work-group of CLFFN_MOE_LANES per expert, NDRange (LANES,
// E): each lane counts its run's matches, lane 0 turns the counts into each lane's first row (a
// prefix sum), and every lane numbers its own matches from there, so the slots are those of one
// walk in token order, in n / LANES steps. Lane 0 also lists the expert (clffn_moe_list).
__kernel __attribute__((reqd_work_group_size(CLFFN_MOE_LANES, 1, 1)))
void clffn_moe_place(__global const int *experts, const uint n, __global uint *counts,
                     const uint stride, __global uint *slot) {
  const uint l = get_local_id(0), e = get_global_id(1), E = get_global_size(1);
  uint i0, i1;
  __local uint first[CLFFN_MOE_LANES];
  first[l] = clffn_moe_run_count(experts, n, e, l, &i0, &i1);
  barrier(CLK_LOCAL_MEM_FENCE);
  if (l == 0) {
    clffn_moe_list(counts, E, n, e);
    if (stride == CLFFN_MOE_TILED) { clffn_moe_tiles(counts, E, n, e); }
    uint s = clffn_moe_first_row(counts, e, stride);
    for (uint j = 0; j < CLFFN_MOE_LANES; ++j) {
      const uint cj = first[j];
      first[j] = s;
      s += cj;
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  uint s = first[l];
  for (uint i = i0; i < i1; ++i) {
    if (experts[i] == (int)e) { slot[i] = s++; }
  }
}

// clffn_moe_route, clffn_moe_count and clffn_moe_place in one work-group of CLFFN_MOE_LANES
// (NDRange LANES), for few choices: the host takes it where n = T·k ≤ LANES, a choice a lane at
// most, and saves two launches of the few-token forward, whose time on a GPU (and on POCL, about
// 25 µs a command) is mostly launches. The same buffers and bits as those three: each token's
// choice by clffn_moe_route_token, each count a sum of integers, each slot its expert's first
// row plus the choices of that expert before it, which is its number in a walk in token order.
// A barrier on global memory orders the steps: the choices before the counts, the counts before
// the list and the slots (the list writes past the counts that the slots read).
__kernel __attribute__((reqd_work_group_size(CLFFN_MOE_LANES, 1, 1)))
void clffn_moe_route_few(const uint E, const uint k, const int normalize, const uint T,
                         __global float *probs, __global int *experts, __global float *weights,
                         const uint R, __global float *gate, __global uint *counts,
                         const uint stride, __global uint *slot) {
  const uint l = get_local_id(0), n = T * k;
  for (uint t = l; t < T; t += CLFFN_MOE_LANES) {
    clffn_moe_route_token(t, E, k, normalize, probs, experts, weights, R, gate);
  }
  barrier(CLK_GLOBAL_MEM_FENCE);
  for (uint e = l; e < E; e += CLFFN_MOE_LANES) {
    uint c = 0;
    for (uint i = 0; i < n; ++i) { c += experts[i] == (int)e; }
    counts[e] = c;
    counts[E + 1 + e] = E;
  }
  if (l == 0) { counts[E] = 0; }
  barrier(CLK_GLOBAL_MEM_FENCE);
  for (uint e = l; e < E; e += CLFFN_MOE_LANES) {
    clffn_moe_list(counts, E, n, e);
    if (stride == CLFFN_MOE_TILED) { clffn_moe_tiles(counts, E, n, e); }
  }
  for (uint i = l; i < n; i += CLFFN_MOE_LANES) {
    const int e = experts[i];
    uint s = clffn_moe_first_row(counts, (uint)e, stride);
    for (uint j = 0; j < i; ++j) { s += experts[j] == e; }
    slot[i] = s;
  }
}

// xg[slot[i], d] = x[i / k, d]: choice i's token on its row; NDRange (D, T·k), any work-group.
__kernel void clffn_moe_gather(__global const float *x, const ulong x_off,
                               __global const uint *slot, const uint D, const uint n,
                               const uint k, __global float *xg) {
  const uint d = get_global_id(0), i = get_global_id(1);
  if (d >= D || i >= n) { return; }
  xg[(ulong)slot[i] * D + d] = x[x_off + (ulong)(i / k) * D + d];
}

// y[t, d] = (shared ? g·ys[t, d] : 0) + Σ_{j<k} weights[t, j]·yg[slot[t, j], d], in that
// order, g = gate[t] when gated, else 1; NDRange (D, T), any work-group.
__kernel void clffn_moe_combine(__global const float *yg, __global const uint *slot,
                                __global const float *weights, __global const float *ys,
                                const int shared, const uint D, const uint T, const uint k,
                                __global float *y, const ulong y_off,
                                __global const float *gate, const int gated) {
  const uint d = get_global_id(0), t = get_global_id(1);
  if (d >= D || t >= T) { return; }
  float acc = shared ? ys[(ulong)t * D + d] : 0.0f;
  if (shared && gated) { acc *= gate[t]; }
  for (uint j = 0; j < k; ++j) {
    const ulong i = (ulong)t * k + j;
    acc = fma(weights[i], yg[(ulong)slot[i] * D + d], acc);
  }
  y[y_off + (ulong)t * D + d] = acc;
}

// ---- backward ---------------------------------------------------------------------------------
// With g[t, j] = dy[t]·yg[slot[t, j]] (∂L/∂weights[t, j]) and p the token's probabilities:
//   expert rows:  dyg[slot[t, j]] = weights[t, j]·dy[t]
//   normalised:   ∂L/∂p[e_j] = (g_j − Σ_i g_i·weights_i) / Σ_i p[e_i];   as they are: g_j
//   softmax:      dlogit[e] = p[e]·(∂L/∂p[e] − Σ_j p[e_j]·∂L/∂p[e_j])   (0 for unchosen e's own
//                 term, which the choice, piecewise constant, does not differentiate)
//   gated shared expert (g = gate[t]): its rows' dy is g·dy, dlogit[t, E] = g·(1 − g)·dy·ys[t]
//   dx[t] = dxs[t] + Σ_j dxg[slot[t, j]] + Σ_e dlogit[t, e]·wr[e];  dwr = dlogitᵀ·x; dbr = Σ_t
// (e over the router's R rows: dlogit is [T, R])

// dyg[slot[i], d] = weights[i]·dy[i / k, d]; NDRange (D, T·k), any work-group.
__kernel void clffn_moe_scatter_dy(__global const float *dy, const ulong dy_off,
                                   __global const uint *slot, __global const float *weights,
                                   const uint D, const uint n, const uint k,
                                   __global float *dyg) {
  const uint d = get_global_id(0), i = get_global_id(1);
  if (d >= D || i >= n) { return; }
  dyg[(ulong)slot[i] * D + d] = weights[i] * dy[dy_off + (ulong)(i / k) * D + d];
}

// dlogit[t, ·] for token t; NDRange T, any work-group. aux_scale = α·E/T² adds the
// load-balancing loss's ∂/∂p[t, e] = α·E·(counts[e]/T)/T to every expert's (0: none). R = E + 1:
// the shared expert's gate's too, at column E, from ys and gate.
__kernel void clffn_moe_router_backward(__global const float *dy, const ulong dy_off,
                                        __global const float *yg, __global const uint *slot,
                                        __global const float *probs,
                                        __global const int *experts,
                                        __global const float *weights, const uint D,
                                        const uint E, const uint k, const int normalize,
                                        const uint T, __global const uint *counts,
                                        const float aux_scale, __global float *dlogit,
                                        const uint R, __global const float *ys,
                                        __global const float *gate) {
  const uint t = get_global_id(0);
  if (t >= T) { return; }
  __global const float *p = probs + (ulong)t * E;
  __global const float *dyt = dy + dy_off + (ulong)t * D;
  __global float *dl = dlogit + (ulong)t * R;
  if (R > E) {
    __global const float *yst = ys + (ulong)t * D;
    float g = 0.0f;
    for (uint d = 0; d < D; ++d) { g = fma(dyt[d], yst[d], g); }
    const float s = gate[t];
    dl[E] = s * (1.0f - s) * g;
  }
  for (uint e = 0; e < E; ++e) { dl[e] = 0.0f; }
  // pass 1: g_j into dl[e_j] (distinct experts), and Σ g·w, Σ p of the chosen
  float gw = 0.0f, psum = 0.0f;
  for (uint j = 0; j < k; ++j) {
    const ulong i = (ulong)t * k + j;
    __global const float *yj = yg + (ulong)slot[i] * D;
    float g = 0.0f;
    for (uint d = 0; d < D; ++d) { g = fma(dyt[d], yj[d], g); }
    dl[experts[i]] = g;
    gw = fma(g, weights[i], gw);
    psum += p[experts[i]];
  }
  // pass 2: ∂L/∂p of the chosen, then the auxiliary loss's of all, and Σ p·∂L/∂p
  for (uint j = 0; j < k; ++j) {
    const int e = experts[(ulong)t * k + j];
    dl[e] = normalize ? (dl[e] - gw) / psum : dl[e];
  }
  float pdp = 0.0f;
  for (uint e = 0; e < E; ++e) {
    dl[e] = fma(aux_scale, (float)counts[e], dl[e]);
    pdp = fma(p[e], dl[e], pdp);
  }
  for (uint e = 0; e < E; ++e) { dl[e] = p[e] * (dl[e] - pdp); }
}

// dx[t, d] = (shared ? dxs[t, d] : 0) + Σ_j dxg[slot[t, j], d] + Σ_e dlogit[t, e]·wr[e, d],
// in that order, e over the router's E rows (R, with the shared expert's gate); NDRange (D, T),
// any work-group.
__kernel void clffn_moe_dx(__global const float *dxg, __global const uint *slot,
                           __global const float *dxs, const int shared,
                           __global const float *dlogit, __global const float *wr, const uint D,
                           const uint E, const uint k, const uint T, __global float *dx,
                           const ulong dx_off) {
  const uint d = get_global_id(0), t = get_global_id(1);
  if (d >= D || t >= T) { return; }
  float acc = shared ? dxs[(ulong)t * D + d] : 0.0f;
  for (uint j = 0; j < k; ++j) { acc += dxg[(ulong)slot[(ulong)t * k + j] * D + d]; }
  for (uint e = 0; e < E; ++e) { acc = fma(dlogit[(ulong)t * E + e], wr[(ulong)e * D + d], acc); }
  dx[dx_off + (ulong)t * D + d] = acc;
}

// dwr[e, d] (+)= Σ_t dlogit[t, e]·x[t, d], and at d = D (the bias column) dbr[e] (+)= Σ_t
// dlogit[t, e], in token order, e over the router's E rows (R, with the shared expert's gate);
// NDRange (D + 1, E), any work-group.
__kernel void clffn_moe_router_grads(__global const float *dlogit, __global const float *x,
                                     const ulong x_off, const uint D, const uint E, const uint T,
                                     const int accumulate, __global float *dwr,
                                     const ulong dwr_off, __global float *dbr,
                                     const ulong dbr_off, const int has_bias) {
  const uint d = get_global_id(0), e = get_global_id(1);
  if (d > D || e >= E || (d == D && !has_bias)) { return; }
  float acc = 0.0f;
  for (uint t = 0; t < T; ++t) {
    const float xv = d < D ? x[x_off + (ulong)t * D + d] : 1.0f;
    acc = fma(dlogit[(ulong)t * E + e], xv, acc);
  }
  __global float *out = d < D ? dwr + dwr_off + (ulong)e * D + d : dbr + dbr_off + e;
  *out = accumulate ? *out + acc : acc;
}

// dys[t, d] = gate[t]·dy[t, d]: the gated shared expert's dy; NDRange (D, T), any work-group.
__kernel void clffn_moe_scale_dy(__global const float *dy, const ulong dy_off,
                                 __global const float *gate, const uint D, const uint T,
                                 __global float *dys) {
  const uint d = get_global_id(0), t = get_global_id(1);
  if (d >= D || t >= T) { return; }
  dys[(ulong)t * D + d] = gate[t] * dy[dy_off + (ulong)t * D + d];
}
