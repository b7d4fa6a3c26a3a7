/* clffn-tune: searches CLBlast's GEMM parameters for a device and the FFN's GEMM shapes, checks
 * the winner against the CPU reference, and stores it as the device's tuning profile, which the
 * library applies whenever it opens that device.
 *
 *   clffn-tune [--device SPEC] [--budget SECONDS] [--tokens T] [--d-model D] [--d-ff F]
 *              [--gated] [--fresh] [--print]
 *
 * The phases (phases.c) share the time budget (default 180 s):
 *   1. Xgemm (CLBlast's tiled kernel, used for large products): random samples of its parameter
 *      space under CLBlast's constraints (src/tuning/kernels/xgemm.hpp), scored by the time of the
 *      FFN's two GEMMs together;
 *   2. XgemmDirect (the kernel for small products): the same, scored at a few tokens;
 *   3. GemmRoutine's XGEMM_MIN_INDIRECT_SIZE: where the direct kernel stops being faster;
 *   4. clffn's own GEMM_K_BLOCK (clffn_context_set_gemm_k_block): the inner-dimension block,
 *      then GEMM_K_BLOCK_MIN_ROWS, the fewest token rows worth blocking;
 *   5. the GEMV kernels of the small-batch path (XgemvFastRot for y = W·x with W [out, in],
 *      XgemvFast for W [in, out]), scored at one token over the FFN's forward products and the
 *      backward's input products, which between them run both;
 *   6. clffn's WEIGHT_LAYOUT (clffn_context_set_weight_layout): the forward's products with
 *      the weights kept either way at 1 and 16 tokens and the tuned shape;
 *   7. clffn's GEMV_MAX_TOKENS (clffn_context_set_gemv_max_tokens): the forward's and the
 *      backward's input products at 1, 2, 4, … 64 tokens as GEMVs and as SGEMMs, the weights
 *      kept as phase 6 chose; the crossover is the largest count up to which the GEMVs win at
 *      every count measured;
 *   8. a second Xgemm set for few tokens and XGEMM_FEW_ROWS, the count below which it runs
 *      (clffn_context_set_xgemm): the winner narrowed along the tokens, scored by the forward at
 *      16 tokens, and the threshold where the winner alone catches up;
 *   9. clffn's own kernels over weights in their stored type (kernels.c): their shapes
 *      (WGEMV_*), scored by the one-token forward with q4_0 and f16 weights; on a CPU device,
 *      WGEMV_ROW_GROUP_COLS, the input size from which rows go several to a work-item, scored
 *      by the forward at 1 to 16 tokens with each boundary the tuned shape tells apart; then
 *      KERNEL_MAX_TOKENS, KERNEL_MAX_TOKENS_BLOCKS, KERNEL_MAX_TOKENS_QX and
 *      KERNEL_MAX_TOKENS_F32, the most tokens (up to 1024, in passes of 16 past 16) up to which
 *      they beat dequantized blocks through SGEMM (f16 weights for f16 and bf16, q4_0 ones for
 *      q8_0 and q4_0, with f32 inputs, and q8_0 ones with quantized inputs) and CLBlast's path
 *      (f32);
 *      then f32's crossover in the other layout too, and the layout and crossover whose forward
 *      is faster at the counts up to the tuned shape's, which may overrule phase 6 (the row
 *      kernels read [out, in] weights along their rows); then KERNEL_MAX_TOKENS_LARGE, the
 *      compressed crossover in f16 on --large-shape (4096 -> 11008 gated), for products of at
 *      least its W2's weights (KERNEL_LARGE_WEIGHTS), where that outgrows the tuned shape's
 *      products.
 * Phases 1-3 run the GEMMs split along K as the library would with a first guess of the block
 * (256 on CPUs, where it pays, none on GPUs); phase 4 then tries every block with the winners.
 * Times come from OpenCL profiling events around each GEMM. Progress is saved after every
 * candidate next to the profile, so an interrupted run resumes where it stopped.
 *
 * Exit status: 0 success, 1 device or runtime failure (or a winner failing the check), 2 usage. */
#include "tune.h"
#include "options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile sig_atomic_t interrupted = 0;
static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

/* ------------------------------------------------------------------------------------------ */
/* The command line */

enum {
    OPT_DEVICE = 256,
    OPT_BUDGET,
    OPT_TOKENS,
    OPT_D_MODEL,
    OPT_D_FF,
    OPT_GATED,
    OPT_FRESH,
    OPT_PRINT,
    /* a candidate's evaluation, run by the search in a child process (eval.c) */
    OPT_EVAL,
    OPT_XGEMM,
    OPT_DIRECT,
    OPT_ROUTINE,
    OPT_K_BLOCK,
    OPT_GEMV,
    OPT_KEPT,
    OPT_FEW,
    OPT_FORWARD_ONLY,
    OPT_KERNELS,
    OPT_LARGE_SHAPE,
    OPT_K_MIN_ROWS,
    OPT_ROW_GROUP,
};

static const tool_option OPTIONS[] = {
    {"device", OPT_DEVICE, TOOL_VALUE, "SPEC", "\"platform:device\" or a name substring"},
    {"budget", OPT_BUDGET, TOOL_VALUE, "SECONDS", "time for the search (default 180 s)"},
    {"tokens", OPT_TOKENS, TOOL_VALUE, "T", "the tuned FFN's token rows (default 640)"},
    {"d-model", OPT_D_MODEL, TOOL_VALUE, "D", "its d_model (default 512)"},
    {"d-ff", OPT_D_FF, TOOL_VALUE, "F", "its d_ff (default 2048)"},
    {"gated", OPT_GATED, TOOL_FLAG, NULL, "its gated (GLU) form"},
    {"fresh", OPT_FRESH, TOOL_FLAG, NULL, "ignore an interrupted run's progress"},
    {"large-shape", OPT_LARGE_SHAPE, TOOL_VALUE, "D,F",
     "the gated FFN on which clffn's kernels' crossover for large products is measured "
     "(default 4096,11008; none: not measured)"},
    {"print", OPT_PRINT, TOOL_FLAG, NULL,
     "print the profile's path and text (or the built-in's), and exit"},
    {"eval", OPT_EVAL, TOOL_FLAG, NULL, NULL},
    {"xgemm", OPT_XGEMM, TOOL_VALUE, "V,…", NULL},
    {"direct", OPT_DIRECT, TOOL_VALUE, "V,…", NULL},
    {"routine", OPT_ROUTINE, TOOL_VALUE, "N", NULL},
    {"k-block", OPT_K_BLOCK, TOOL_VALUE, "N", NULL},
    {"gemv", OPT_GEMV, TOOL_VALUE, "SPEC", NULL},
    {"kept", OPT_KEPT, TOOL_VALUE, "0|1", NULL},
    {"few", OPT_FEW, TOOL_VALUE, "ROWS:V,…", NULL},
    {"forward-only", OPT_FORWARD_ONLY, TOOL_FLAG, NULL, NULL},
    {"kernels", OPT_KERNELS, TOOL_VALUE, "SPEC", NULL},
    {"k-block-min-rows", OPT_K_MIN_ROWS, TOOL_VALUE, "N", NULL},
    {"row-group", OPT_ROW_GROUP, TOOL_VALUE, "N", NULL},
    {0},
};

static const tool_cli CLI = {
    "clffn-tune",
    "[options]",
    "The profile goes to $CLFFN_TUNE_DIR, else $XDG_CACHE_HOME/clffn, else ~/.cache/clffn.\n"
    "Exit status: 0 success, 1 device or runtime failure, 2 usage.\n",
    OPTIONS,
};

/* What the command line asks for beyond the search's own options. */
typedef struct request {
    int fresh, print_only, eval;
    candidate cand; /* with eval */
} request;

/* --large-shape D,F (each 32 to 2^20, multiples of 32 so that the quantized types fit) or
 * none. */
static int large_shape(const char *v, search *r) {
    if (!strcmp(v, "none")) {
        r->large_D = r->large_F = 0;
        return 0;
    }
    char d[32];
    const char *comma = strchr(v, ',');
    size_t D = 0, F = 0;
    if (comma && (size_t)(comma - v) < sizeof d) {
        memcpy(d, v, (size_t)(comma - v));
        d[comma - v] = '\0';
        if (tool_parse_size(d, 32, (size_t)1 << 20, &D) == 0 &&
            tool_parse_size(comma + 1, 32, (size_t)1 << 20, &F) == 0 && D % 32 == 0 &&
            F % 32 == 0) {
            r->large_D = D, r->large_F = F;
            return 0;
        }
    }
    fprintf(stderr, "clffn-tune: --large-shape needs D,F (multiples of 32) or none, not '%s'\n", v);
    return -1;
}

static int take_option(int key, const char *name, const char *v, search *r, request *q) {
    const size_t big = (size_t)1 << 30;
    size_t *dims[3] = {&r->o.T, &r->o.D, &r->o.F};
    switch (key) {
    case OPT_DEVICE: r->o.device = v; return 0;
    case OPT_BUDGET:
        if (tool_parse_double(v, 1e-3, 1e9, &r->budget) == 0) { return 0; }
        fprintf(stderr, "clffn-tune: --budget needs a number of seconds, not '%s'\n", v);
        return -1;
    case OPT_TOKENS:
    case OPT_D_MODEL:
    case OPT_D_FF:
        if (tool_parse_size(v, 1, big, dims[key - OPT_TOKENS]) == 0) { return 0; }
        fprintf(stderr, "clffn-tune: --%s needs a positive integer, not '%s'\n", name, v);
        return -1;
    case OPT_GATED: r->o.gated = 1; return 0;
    case OPT_FRESH: q->fresh = 1; return 0;
    case OPT_PRINT: q->print_only = 1; return 0;
    case OPT_EVAL: q->eval = 1; return 0;
    case OPT_XGEMM: q->cand.xgemm = v; return 0;
    case OPT_DIRECT: q->cand.direct = v; return 0;
    case OPT_K_BLOCK: q->cand.k_block = v; return 0;
    case OPT_ROUTINE:
        if (tool_parse_size(v, 0, SIZE_MAX, &q->cand.routine) == 0) { return 0; }
        fprintf(stderr, "clffn-tune: --routine needs a whole number, not '%s'\n", v);
        return -1;
    case OPT_GEMV: r->o.gemv = v; return 0;
    case OPT_KEPT: r->o.kept = strcmp(v, "1") ? CLFFN_LAYOUT_OUT_IN : CLFFN_LAYOUT_IN_OUT; return 0;
    case OPT_FEW: r->o.few = v; return 0;
    case OPT_FORWARD_ONLY: r->o.forward_only = 1; return 0;
    case OPT_KERNELS: r->o.kernels = v; return 0;
    case OPT_ROW_GROUP: r->o.row_group = v; return 0;
    case OPT_LARGE_SHAPE: return large_shape(v, r);
    case OPT_K_MIN_ROWS:
        if (tool_parse_size(v, 0, CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS, &r->o.k_min_rows) == 0) {
            return 0;
        }
        fprintf(stderr, "clffn-tune: --k-block-min-rows needs a whole number, not '%s'\n", v);
        return -1;
    default: return -1;
    }
}

/* -1 to go on, else the exit status (0 after --help, 2 after a refusal). */
static int parse_options(int argc, char **argv, search *r, request *q) {
    tool_parser p = tool_parser_start(&CLI, argc, argv);
    for (int key; (key = tool_next(&p)) > 0;) {
        if (take_option(key, p.name, p.value, r, q) != 0) { return tool_usage_error(&CLI); }
    }
    return p.status;
}

/* ------------------------------------------------------------------------------------------ */
/* The search */

/* Phases 3 to 9, then the winners together, checked (each child verifies its path), timed
 * against what was applied before, and written only if they are faster; else phase 9's
 * findings alone, into the profile that stays (write_kernels_only). */
static int finish(search *r, size_t small_t, int have_before, double before_s) {
    const size_t min_indirect = phase_crossover(r);
    const size_t k_block = phase_k_block(r, min_indirect);
    const size_t k_min_rows = phase_k_block_rows(r, min_indirect, k_block);
    gemv_result g;
    phase_gemv(r, min_indirect, k_block, &g);
    const clffn_layout kept = phase_weight_layout(r, min_indirect, k_block, k_min_rows, &g);
    g.max_tokens = phase_gemv_crossover(r, min_indirect, k_block, k_min_rows, &g, kept);
    few_result few;
    phase_few_rows(r, min_indirect, k_block, k_min_rows, &g, kept, &few);
    kernel_result kr;
    phase_kernels(r, min_indirect, k_block, k_min_rows, &g, kept, &few, &kr);
    double after_s = 0, small_s = 0;
    const state *s = &r->s;
    opts o = r->o; /* with a few-tokens set, each child checks both sets */
    o.few = few.rows ? few.spec : NULL;
    if (eval_child(&o, r->o.T, &s->xgemm, &s->direct, min_indirect, k_block, &after_s) ||
        eval_child(&o, small_t, &s->xgemm, &s->direct, min_indirect,
                   k_block_at(small_t, k_block, k_min_rows), &small_s)) {
        fprintf(stderr, "clffn-tune: the winning parameters fail the check against the CPU; "
                        "no profile written\n");
        return 1;
    }
    if (have_before && after_s >= before_s) { /* a profile must never make things slower */
        printf("clffn-tune: nothing found beats the GEMMs' parameters applied now (%.1f vs %.1f "
               "GFLOP/s); they stay. A larger --budget searches further.\n",
               r->flops / after_s * 1e-9, r->flops / before_s * 1e-9);
        /* the kernels' crossovers hold whatever the GEMMs' parameters: kept where found */
        const int rc = kr.have ? write_kernels_only(r, &kr) : 0;
        if (rc == 0) { remove(r->progress); }
        return rc;
    }
    return write_profile(r, min_indirect, k_block, k_min_rows, &g, &few, kept, &kr, after_s,
                         have_before, before_s);
}

/* The search from the device's facts on: the exit status. */
static int run_search(search *r, int fresh) {
    if (make_dirs(r->dir) != 0) {
        fprintf(stderr, "clffn-tune: cannot create %s: %s\n", r->dir, strerror(errno));
        return 1;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    r->tty = isatty(2);
    const size_t N1 = r->o.gated ? 2 * r->o.F : r->o.F;
    r->flops = 2.0 * (double)r->o.T * (double)r->o.D * (double)(N1 + r->o.F);
    /* K-blocking pays on CPUs, whose caches the operand panels outgrow (docs/PERFORMANCE.md) */
    r->kb_guess = r->lim.cpu ? 256 : 0;
    state_init(&r->s, r->progress, fresh);
    printf("clffn-tune: %s, FFN %zu tokens, %zu -> %zu%s, budget %.0f s\n", r->name, r->o.T, r->o.D,
           r->o.F, r->o.gated ? " gated" : "", r->budget);
    fflush(stdout);
    /* the budget covers everything from here, the earlier runs of an interrupted search too */
    r->t0 = tool_now_s() - r->s.spent_s;

    /* before: what the library applies today (a profile, the built-in one, or CLBlast's) */
    double before_s = 0;
    const int have_before = eval_child(&r->o, r->o.T, NULL, NULL, 0, KB_APPLIED, &before_s) == 0;
    const size_t small_t = r->o.T < 16 ? r->o.T : 16;
    phase_xgemm(r);
    phase_direct(r, small_t);
    if (r->tty) { fputc('\n', stderr); }
    if (interrupted) {
        fprintf(stderr, "clffn-tune: interrupted; run again to resume from %s\n", r->progress);
        return 1;
    }
    if (!r->s.have_xgemm || !r->s.have_direct) {
        fprintf(stderr, "clffn-tune: no working candidate for %s\n",
                r->s.have_xgemm ? "XgemmDirect" : "Xgemm");
        return 1;
    }
    return finish(r, small_t, have_before, before_s);
}

static int tool_main(int argc, char **argv) {
    static search r; /* large: path buffers */
    r.o = (opts){.T = 640, .D = 512, .F = 2048, .kept = -1};
    r.budget = 180;
    r.large_D = 4096, r.large_F = 11008;
    request q;
    memset(&q, 0, sizeof q);
    int rc = parse_options(argc, argv, &r, &q);
    if (rc >= 0) { return rc; }
    if (q.eval) { return eval_main(&r.o, &q.cand); }
    if ((rc = device_facts(&r, q.print_only)) >= 0) { return rc; }
    return run_search(&r, q.fresh);
}

int main(int argc, char **argv) { return tool_exit("clffn-tune", tool_main(argc, argv)); }
