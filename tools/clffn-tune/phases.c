/* clffn-tune: the search, phase by phase (main.c gives their order; each reads what the ones
 * before it found). Phases 1 and 2 save their progress after every candidate; the rest are
 * short and start over when interrupted. */
#include "tune.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Where the search starts: sets that did well on the device class before, so a short budget
 * begins from a good point and spends the rest improving it. */
static const size_t XGEMM_SEEDS_CPU[][16] = {
    {0, 1, 32, 8, 8, 4, 64, 4, 4, 64, 0, 0, 0, 0, 16, 16},
    {0, 1, 16, 8, 8, 8, 128, 8, 8, 64, 0, 0, 0, 0, 16, 8},
    {0, 1, 32, 8, 8, 4, 128, 4, 4, 32, 0, 0, 0, 0, 16, 8},
};

static const size_t XGEMM_SEEDS_GPU[][16] = {
    {0, 1, 16, 2, 16, 16, 64, 16, 8, 128, 1, 1, 1, 1, 4, 4}, /* the H100's, 2026-11-22 */
    {0, 1, 32, 2, 8, 8, 32, 32, 32, 64, 1, 1, 0, 0, 4, 2},   /* CLBlast's generic NVIDIA set */
    {0, 1, 32, 2, 16, 16, 64, 16, 16, 64, 1, 1, 0, 0, 4, 4},
    {0, 1, 16, 2, 8, 8, 64, 8, 8, 64, 1, 1, 0, 0, 4, 4},
};

/* Phase 1: Xgemm on the full shape, through the tiled path: the seeds, then alternately a
 * random set (to explore) and a neighbour of the best so far (to climb). Past its share of the
 * budget the phase stops once it has a winner, or after 32 failures. */
void phase_xgemm(search *r) {
    state *s = &r->s;
    int tried = 0;
    const size_t n_seeds = r->lim.cpu ? sizeof XGEMM_SEEDS_CPU / sizeof XGEMM_SEEDS_CPU[0]
                                      : sizeof XGEMM_SEEDS_GPU / sizeof XGEMM_SEEDS_GPU[0];
    for (int i = s->index; s->phase == 1 && !interrupted; ++i) {
        if ((s->have_xgemm && spent(r) > 0.6 * r->budget) || (!s->have_xgemm && tried >= 32)) {
            s->phase = 2, s->index = 0;
            break;
        }
        uint64_t seed = 0x5eed0001ull + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        pset cand = xgemm_set();
        if ((size_t)i < n_seeds) {
            memcpy(cand.values, r->lim.cpu ? XGEMM_SEEDS_CPU[i] : XGEMM_SEEDS_GPU[i],
                   sizeof cand.values);
            if (!xgemm_valid(cand.values, &r->lim)) { cand = xgemm_sample(&seed, &r->lim); }
        } else if (i % 2 == 1 && s->have_xgemm) {
            if (xgemm_mutate(&seed, &s->xgemm, &r->lim, &cand) != 0) {
                cand = xgemm_sample(&seed, &r->lim);
            }
        } else {
            cand = xgemm_sample(&seed, &r->lim);
        }
        double t;
        if (eval_child(&r->o, r->o.T, &cand, NULL, 1, r->kb_guess, &t) == 0 &&
            (!s->have_xgemm || t < s->xgemm_s)) {
            s->xgemm = cand, s->xgemm_s = t, s->have_xgemm = 1;
        }
        ++tried;
        s->index = i + 1;
        s->spent_s = spent(r);
        save_state(r->progress, s);
        show_progress(r->tty, s->spent_s, r->budget, "Xgemm", tried,
                      s->have_xgemm ? r->flops / s->xgemm_s * 1e-9 : 0);
    }
}

/* Phase 2: XgemmDirect at a few tokens, through the direct path. */
void phase_direct(search *r, size_t small_t) {
    state *s = &r->s;
    int tried = 0;
    for (int i = s->index; s->phase == 2 && !interrupted; ++i) {
        uint64_t seed = 0x5eed0002ull + 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
        const pset cand = direct_sample(&seed, &r->lim);
        if ((s->have_direct && spent(r) > 0.8 * r->budget) || (!s->have_direct && tried >= 32)) {
            s->phase = 3, s->index = 0;
            break;
        }
        double t;
        if (eval_child(&r->o, small_t, NULL, &cand, DIRECT_PATH, r->kb_guess, &t) == 0 &&
            (!s->have_direct || t < s->direct_s)) {
            s->direct = cand, s->direct_s = t, s->have_direct = 1;
        }
        ++tried;
        s->index = i + 1;
        s->spent_s = spent(r);
        save_state(r->progress, s);
        show_progress(
            r->tty, s->spent_s, r->budget, "XgemmDirect", tried,
            s->have_direct ? r->flops * (double)small_t / (double)r->o.T / s->direct_s * 1e-9 : 0);
    }
}

/* Phase 3: the crossover; CLBlast goes direct when m·n·k < XGEMM_MIN_INDIRECT_SIZE³. Each new
 * size may make the device build another kernel variant, so this phase stops at the budget too
 * and keeps what it learnt. Returns XGEMM_MIN_INDIRECT_SIZE. */
size_t phase_crossover(search *r) {
    const size_t N1 = r->o.gated ? 2 * r->o.F : r->o.F;
    size_t crossover_mnk = 0, direct_wins_mnk = 0;
    const size_t ts[] = {1, 16, 64, 256, 1024};
    size_t k1; /* CLBlast sees m·n·k of one K-block: GEMM 1's block */
    clffn_gemm_k_split(r->o.D, r->kb_guess, &k1);
    for (size_t i = 0; i < sizeof ts / sizeof ts[0] && ts[i] <= r->o.T && !interrupted; ++i) {
        if (spent(r) > r->budget) { break; }
        double td, ti;
        if (eval_child(&r->o, ts[i], &r->s.xgemm, &r->s.direct, DIRECT_PATH, r->kb_guess, &td) ||
            eval_child(&r->o, ts[i], &r->s.xgemm, &r->s.direct, 1, r->kb_guess, &ti)) {
            break;
        }
        printf("%4zu tokens: direct kernel %.3f ms, tiled %.3f ms\n", ts[i], td * 1e3, ti * 1e3);
        fflush(stdout);
        if (ti < td) { /* the first token count where the tiled kernel wins */
            crossover_mnk = ts[i] * k1 * N1;
            break;
        }
        direct_wins_mnk = ts[i] * k1 * N1;
    }
    if (!crossover_mnk) { crossover_mnk = direct_wins_mnk ? 2 * direct_wins_mnk : k1 * N1; }
    return (size_t)ceil(cbrt((double)crossover_mnk));
}

/* Phase 4: the K-block, with the winners at the full shape; blocks from 64 up to the longest
 * inner dimension (beyond it nothing is split), and none. Each block only changes K of the same
 * kernels, so no candidate builds anything: this phase is short, and it ends at the budget too
 * once "none" and the guess are measured. A block must beat none by more than run-to-run noise
 * (K_BLOCK_MARGIN): only the forward's products are timed here, and a block also splits the
 * backward's, whose inner dimension is the tokens (on an H100 a 2048-block that won the forward
 * by 2% made the BERT-shape backward 1.5x slower). */
#define K_BLOCK_MARGIN 0.97
size_t phase_k_block(search *r, size_t min_indirect) {
    size_t k_block = r->kb_guess;
    double kb_best = INFINITY, none_s = INFINITY;
    const size_t kb_cands[] = {r->kb_guess, 0, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048};
    const size_t k_max = r->o.D > r->o.F ? r->o.D : r->o.F;
    for (size_t i = 0; i < sizeof kb_cands / sizeof kb_cands[0] && !interrupted; ++i) {
        const size_t kb = kb_cands[i];
        if (i > 0 && (kb == r->kb_guess || kb > k_max || (i >= 2 && spent(r) > r->budget))) {
            continue;
        }
        double t;
        if (eval_child(&r->o, r->o.T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &t) != 0) {
            continue;
        }
        printf("K-block %4zu: %.1f GFLOP/s\n", kb, r->flops / t * 1e-9);
        fflush(stdout);
        if (kb == 0) { none_s = t; }
        if (t < kb_best) { kb_best = t, k_block = kb; }
    }
    return k_block != 0 && kb_best > K_BLOCK_MARGIN * none_s ? 0 : k_block;
}

/* Phase 4b: the fewest token rows a product needs to be K-blocked (GEMM_K_BLOCK_MIN_ROWS). The
 * block is chosen at the full shape; for few rows a blocked product re-reads the weights once per
 * block for little work each time (on POCL 20-35% slower at 4-8 tokens), so blocked and whole
 * are compared at growing token counts, and the threshold is the first count where the block
 * wins (the full shape's own count if it never does below it). */
size_t phase_k_block_rows(search *r, size_t min_indirect, size_t k_block) {
    if (k_block == 0) { return 0; }
    const size_t ts[] = {16, 64, 256, 1024};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0] && ts[i] < r->o.T && !interrupted; ++i) {
        if (i > 0 && spent(r) > r->budget) { break; }
        double tb, tw;
        if (eval_child(&r->o, ts[i], &r->s.xgemm, &r->s.direct, min_indirect, k_block, &tb) ||
            eval_child(&r->o, ts[i], &r->s.xgemm, &r->s.direct, min_indirect, 0, &tw)) {
            break;
        }
        printf("%4zu tokens: K-blocked %.3f ms, whole %.3f ms\n", ts[i], tb * 1e3, tw * 1e3);
        fflush(stdout);
        if (tb < tw) { return ts[i]; }
    }
    return r->o.T < CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS ? r->o.T : CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS;
}

/* The block a product of T token rows gets from the library under that threshold (clffn__sgemm:
 * m >= GEMM_K_BLOCK_MIN_ROWS), for the children, which run every product blocked. */
size_t k_block_at(size_t T, size_t k_block, size_t k_min_rows) {
    return T >= k_min_rows ? k_block : 0;
}

/* A candidate's small-batch spec (opts.gemv) into buf. */
const char *gemv_spec(char *buf, size_t size, size_t tokens, const gemv_result *g) {
    char f[128] = "", rt[128] = "";
    pset_format(&g->fast, f, sizeof f);
    pset_format(&g->rot, rt, sizeof rt);
    snprintf(buf, size, "%zu:%s,%s", tokens, f, rt);
    return buf;
}

/* Phase 5: XgemvFastRot, then XgemvFast, each over a short list of work-group size, work per
 * item and vector width (the kernels have few parameters, and the list spans what the full
 * sweeps, clffn-bench-gemms --gemv-sweep, and CLBlast's GPU database pick: 32/32/8 is its
 * NVIDIA default, 32/1/1 the H100's XgemvFast; the first two are POCL's, tried first when the
 * budget is short), scored at one token. Not resumable: it is short. */
void phase_gemv(search *r, size_t min_indirect, size_t k_block, gemv_result *g) {
    static const size_t cands[][3] = {
        {16, 16, 16}, {8, 2, 2},   {64, 4, 4},  {16, 16, 8}, {4, 4, 4},    {4, 8, 4},   {16, 8, 8},
        {64, 8, 4},   {32, 8, 4},  {64, 1, 1},  {128, 1, 1}, {256, 1, 1},  {64, 2, 2},  {64, 16, 4},
        {32, 16, 8},  {128, 4, 4}, {32, 32, 8}, {64, 32, 8}, {128, 16, 8}, {256, 2, 2}, {32, 1, 1}};
    const size_t nc = sizeof cands / sizeof cands[0];
    gemv_sets(&g->fast, &g->rot);
    memcpy(g->fast.values, cands[0], sizeof cands[0]);
    memcpy(g->rot.values, cands[0], sizeof cands[0]);
    double best = INFINITY;
    for (int which = 0; which < 2; ++which) { /* 0: the rotated kernel (forward), 1: the other */
        pset *p = which ? &g->fast : &g->rot;
        size_t keep[3];
        memcpy(keep, p->values, sizeof keep);
        for (size_t i = 0; i < nc && !interrupted; ++i) {
            if (i >= 2 && spent(r) > r->budget) { break; }
            /* CLBlast's own tuner constraint for the rotated kernel: a tile no longer than
             * its work-group loads the whole vector */
            if (cands[i][0] > r->lim.max_wg || (!which && cands[i][1] > cands[i][0])) { continue; }
            memcpy(p->values, cands[i], sizeof cands[i]);
            char spec[300];
            opts o = r->o;
            o.gemv = gemv_spec(spec, sizeof spec, CLFFN_MAX_GEMV_TOKENS, g);
            double t;
            if (eval_child(&o, 1, &r->s.xgemm, &r->s.direct, min_indirect, k_block, &t) == 0 &&
                t < best) {
                best = t, g->have = 1;
                memcpy(keep, cands[i], sizeof keep);
            }
        }
        memcpy(p->values, keep, sizeof keep);
    }
    if (g->have) {
        printf("GEMV at 1 token (forward and backward-input products): %.3f ms\n", best * 1e3);
    }
}

/* Phase 6: WEIGHT_LAYOUT, the layout uploads keep the weights in (clffn_context_set_weight_
 * layout). The forward's products with the weights kept [out, in] and [in, out], at one token
 * (each layout has its own GEMV kernel), at 16 and at the tuned shape. Only the forward is
 * scored: the backward's input products pay whatever transposition the forward saves, so
 * training breaks even either way and inference takes the faster forward. [in, out] wins when
 * its times are shorter on average, as ratios, so that no one count decides. */
clffn_layout phase_weight_layout(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                                 const gemv_result *g) {
    /* none beyond the tuned shape, none twice */
    const size_t ts[] = {1, r->o.T < 16 ? r->o.T : 16, r->o.T};
    char spec[300];
    opts o = r->o;
    o.gemv = g->have ? gemv_spec(spec, sizeof spec, 1, g) : "1";
    o.forward_only = 1;
    double ratio_sum = 0;
    int counted = 0;
    for (size_t i = 0; i < sizeof ts / sizeof ts[0] && !interrupted; ++i) {
        if ((i > 0 && ts[i] == ts[i - 1]) || (i > 1 && spent(r) > r->budget)) { continue; }
        const size_t kb = k_block_at(ts[i], k_block, k_min_rows);
        double t[2]; /* indexed by clffn_layout */
        int ok = 1;
        for (int l = 0; l < 2 && ok; ++l) {
            o.kept = l;
            ok = eval_child(&o, ts[i], &r->s.xgemm, &r->s.direct, min_indirect, kb, &t[l]) == 0;
        }
        if (!ok) { continue; }
        printf("%4zu tokens, forward: weights kept [out, in] %.3f ms, [in, out] %.3f ms\n", ts[i],
               t[CLFFN_LAYOUT_OUT_IN] * 1e3, t[CLFFN_LAYOUT_IN_OUT] * 1e3);
        fflush(stdout);
        ratio_sum += t[CLFFN_LAYOUT_IN_OUT] / t[CLFFN_LAYOUT_OUT_IN];
        ++counted;
    }
    return counted && ratio_sum < counted ? CLFFN_LAYOUT_IN_OUT : CLFFN_LAYOUT_OUT_IN;
}

/* Phase 7: GEMV_MAX_TOKENS. The GEMVs read the weights once per token and pad nothing; the
 * SGEMM reads them once and pads the tokens to a tile: the GEMVs win up to some count. */
size_t phase_gemv_crossover(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                            const gemv_result *g, clffn_layout kept) {
    size_t max_tokens = 0;
    for (size_t T = 1; T <= 64 && T <= r->o.T && !interrupted; T *= 2) {
        if (T > 1 && spent(r) > r->budget) { break; } /* keeps what it learnt */
        char spec[300], zero[8] = "0";
        opts ov = r->o, om = r->o;
        ov.gemv = g->have ? gemv_spec(spec, sizeof spec, CLFFN_MAX_GEMV_TOKENS, g) : "65536";
        om.gemv = zero;
        ov.kept = om.kept = (int)kept; /* every product as it will run */
        double tv, tm;
        const size_t kb = k_block_at(T, k_block, k_min_rows);
        if (eval_child(&ov, T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &tv) != 0 ||
            eval_child(&om, T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &tm) != 0) {
            break;
        }
        printf("%3zu tokens: GEMV %.3f ms, SGEMM %.3f ms\n", T, tv * 1e3, tm * 1e3);
        fflush(stdout);
        if (tv >= tm) { break; }
        max_tokens = T;
    }
    return max_tokens;
}

static const char *few_spec(few_result *f, size_t rows) {
    char v[256];
    pset_format(&f->set, v, sizeof v);
    snprintf(f->spec, sizeof f->spec, "%zu:%s", rows, v);
    return f->spec;
}

/* Phase 8: a second Xgemm set for few tokens (clffn_context_set_xgemm). The tokens are padded
 * to the tile's width along them (NWG), so a tile that is best for many tokens wastes most of
 * its work on a few; one that is narrow there is slow on many (docs/PERFORMANCE.md). Candidates:
 * the winner narrowed to 8 and 16 tokens (vectors and work-items along them cut to fit), with
 * its own KWG and with 64, and POCL's few-tokens set; each scored by the forward at 16 tokens
 * (or the tuned count, if fewer) against the winner alone, kept only if it beats it by more than
 * 3%. The threshold is then the first doubling of that count at which the winner alone is at
 * least as fast. Not resumable: it is short. */
void phase_few_rows(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                    const gemv_result *g, clffn_layout kept, few_result *f) {
    static const size_t pocl_few[16] = {0, 1, 64, 8, 4, 4, 128, 1, 1, 8, 0, 0, 0, 1, 16, 8};
    f->rows = 0;
    f->set = r->s.xgemm;
    const size_t tf = r->o.T < 16 ? r->o.T : 16;
    if (tf <= g->max_tokens || interrupted) { return; } /* GEMVs run those */
    char gspec[300];
    opts o = r->o;
    o.gemv = g->have ? gemv_spec(gspec, sizeof gspec, g->max_tokens, g) : NULL;
    o.kept = (int)kept;
    o.forward_only = 1;
    double t_large, best = INFINITY;
    if (eval_child(&o, tf, &r->s.xgemm, &r->s.direct, min_indirect,
                   k_block_at(tf, k_block, k_min_rows), &t_large) != 0) {
        return;
    }
    pset cands[5];
    size_t nc = 0;
    for (int i = 0; i < 4; ++i) {
        pset c = r->s.xgemm;
        size_t *v = c.values;
        v[NWG] = i % 2 ? 16 : 8;
        if (v[VWN] > v[NWG]) { v[VWN] = v[NWG]; }
        while (v[NDIMC] > 1 && v[NWG] % (v[NDIMC] * v[VWN])) { v[NDIMC] /= 2; }
        while (v[NDIMB] > 1 && v[NWG] % (v[NDIMB] * v[VWN])) { v[NDIMB] /= 2; }
        if (i >= 2) { v[KWG] = 64; }
        if (xgemm_valid(v, &r->lim)) { cands[nc++] = c; }
    }
    cands[nc] = r->s.xgemm;
    memcpy(cands[nc].values, pocl_few, sizeof pocl_few);
    if (xgemm_valid(cands[nc].values, &r->lim)) { ++nc; }
    for (size_t i = 0; i < nc && !interrupted; ++i) {
        if (i >= 1 && spent(r) > r->budget) { break; }
        few_result c = {cands[i], 0, ""};
        o.few = few_spec(&c, tf + 1);
        double t;
        if (eval_child(&o, tf, &r->s.xgemm, &r->s.direct, min_indirect,
                       k_block_at(tf, k_block, k_min_rows), &t) == 0 &&
            t < best) {
            best = t, f->set = cands[i];
        }
    }
    printf("%3zu tokens, forward: one Xgemm set %.3f ms, with a few-tokens set %.3f ms\n", tf,
           t_large * 1e3, best * 1e3);
    if (!(best < 0.97 * t_large)) { return; }
    size_t rows = tf + 1; /* the set won there */
    for (size_t T = 2 * tf; T <= r->o.T && T <= 1024 && !interrupted; T *= 2) {
        double tl, tw;
        const size_t kb = k_block_at(T, k_block, k_min_rows);
        opts ol = o;
        ol.few = NULL;
        o.few = few_spec(f, T + 1);
        if (eval_child(&ol, T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &tl) != 0 ||
            eval_child(&o, T, &r->s.xgemm, &r->s.direct, min_indirect, kb, &tw) != 0) {
            break;
        }
        printf("%3zu tokens, forward: one Xgemm set %.3f ms, the few-tokens set %.3f ms\n", T,
               tl * 1e3, tw * 1e3);
        fflush(stdout);
        if (tl <= tw) {
            rows = T;
            break;
        }
        rows = T + 1;
        if (spent(r) > r->budget) { break; }
    }
    f->rows = rows;
    few_spec(f, rows);
}
