/* clffn-tune's rooms: main.c (the command line and the search's order), search.c (CLBlast's
 * parameter sets: sampled, mutated, checked against its constraints), eval.c (one candidate
 * measured in a child process), phases.c (each phase of the search) and profile.c (the device's
 * facts, progress saved and resumed, the profile written). */
#ifndef CLFFN_TUNE_H
#define CLFFN_TUNE_H

#define CLFFN_HOOKS /* clffn_sgemm and clffn_gemm_k_split: time what the library runs */
#include "clffn.h"
#include "common.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* Set by SIGINT and SIGTERM: the search stops after the candidate in flight, progress kept. */
extern volatile sig_atomic_t interrupted;

/* ------------------------------------------------------------------------------------------ */
/* Parameter sets (search.c) */

#define MAX_PARAMS 16

/* One kernel's parameters as CLBlastOverrideParameters takes them. */
typedef struct pset {
    const char *kernel;
    int n;
    const char *names[MAX_PARAMS];
    size_t values[MAX_PARAMS];
} pset;

/* Xgemm's parameters, in XGEMM_NAMES' order, and XgemmDirect's */
enum { GEMMK, KREG, KWG, KWI, MDIMA, MDIMC, MWG, NDIMB, NDIMC, NWG, SA, SB, STRM, STRN, VWM, VWN };
enum { KWID, MDIMAD, MDIMCD, NDIMBD, NDIMCD, PADA, PADB, VWMD, VWND, WGD };
extern const char *const XGEMM_NAMES[16];

/* What the device allows a candidate. */
typedef struct limits {
    size_t max_wg;
    cl_ulong local_mem;
    int cpu; /* a CPU device: local memory is ordinary memory, so SA/SB only add copies */
} limits;

/* Named sets with every value 0, to be filled. */
pset xgemm_set(void);
pset direct_set(void);
/* GemmRoutine's XGEMM_MIN_INDIRECT_SIZE */
pset routine_set(size_t min_indirect);
/* XgemvFast's and XgemvFastRot's (WGS, WPT, VW each) */
void gemv_sets(pset *fast, pset *rot);

/* CLBlast's Xgemm constraints (kernel 0) and the device's limits. */
int xgemm_valid(const size_t *v, const limits *lim);
/* One random Xgemm (XgemmDirect) set that satisfies CLBlast's constraints and the limits. */
pset xgemm_sample(uint64_t *s, const limits *lim);
pset direct_sample(uint64_t *s, const limits *lim);
/* A neighbour of best: one or two parameters changed, constraints kept; -1 if none found. */
int xgemm_mutate(uint64_t *s, const pset *best, const limits *lim, pset *out);

/* CLBlastOverrideParameters for the device: 0 or -1. */
int pset_apply(cl_device_id d, const pset *p);
/* The values as "v1,v2,…" and back (p's names and count kept): 0 or -1. */
void pset_format(const pset *p, char *buf, size_t size);
int pset_parse(const char *text, pset *p);
cJSON *pset_json(const pset *p);
int pset_from_json(const cJSON *o, pset *p);

/* ------------------------------------------------------------------------------------------ */
/* One candidate, measured in a child process (eval.c) */

typedef struct opts {
    const char *device;
    size_t T, D, F;
    int gated;
    /* the small-batch side of a candidate: gemv is NULL (every product an SGEMM, as phases 1-4
     * measure), or "N" or "N:WGS2,WPT2,VW2,WGS3,WPT3,VW3": crossover N and, given, those
     * XgemvFast and XgemvFastRot parameters; the backward's input products are timed too */
    const char *gemv;
    /* the layout the weights are kept in (clffn_context_set_weight_layout), from the weight
     * layout phase on; -1 before it: [out, in] */
    int kept;
    int forward_only; /* the weight layout phase: the backward's input products are not timed */
    /* a few-tokens Xgemm set beside the candidate's (clffn_context_set_xgemm): NULL, or
     * "ROWS:v1,...,v16", the threshold and the set's values in XGEMM_NAMES' order */
    const char *few;
    /* with a K-block: the fewest token rows a product needs to be blocked, as the profile's
     * GEMM_K_BLOCK_MIN_ROWS (phase 9, whose counts run from 1 to 1024); 0: every product */
    size_t k_min_rows;
    /* phase 9's measurement instead of the GEMMs' (kernels.c): NULL, or "TYPE:shapes:S;S;…"
     * (the forward at one token through clffn's kernels with each shape S = "p1,…,p5") or
     * "TYPE:cross:S" (1, 2, 4 ... 1024 tokens through the kernels and without them up to the
     * first count the kernels lose, then three quarters of that count) or "TYPE:groups:S;B,…"
     * (the forward at 1, 2, 4, 8 and 16 tokens with shape S and rows grouped from each B) */
    const char *kernels;
    /* phase 9's row-grouping boundary once measured (clffn_context_set_row_group_cols): NULL,
     * the profile's, or "N" */
    const char *row_group;
} opts;

/* The K-block of a candidate that should keep the one the applied profile has. */
#define KB_APPLIED ((size_t)-1)
/* XGEMM_MIN_INDIRECT_SIZE so large that every product takes the direct kernel */
#define DIRECT_PATH ((size_t)1 << 20)

/* One candidate as the child process has it on its command line: the Xgemm and XgemmDirect
 * values ("v1,…"; NULL: the profile's), XGEMM_MIN_INDIRECT_SIZE (0: the profile's) and the
 * K-block (NULL: the profile's). */
typedef struct candidate {
    const char *xgemm, *direct, *k_block;
    size_t routine;
} candidate;

/* Child: applies the candidate, checks the SGEMM against a double-precision product, and prints
 * the device seconds of the FFN's GEMMs at o->T tokens. Exit 0 with the time, 3 for a wrong
 * result, 1 otherwise. */
int eval_main(const opts *o, const candidate *c);

/* Parent: runs one evaluation in a child (this program, without a shell); 0 with *sec, -1 for a
 * failed or faulting candidate. xg, dir NULL: the profile's; kb KB_APPLIED: the profile's. */
int eval_child(const opts *o, size_t T, const pset *xg, const pset *dir, size_t routine, size_t kb,
               double *sec);
/* The same, with the child's first line of output in line: 0 when it exited 0. */
int eval_child_line(const opts *o, size_t T, const pset *xg, const pset *dir, size_t routine,
                    size_t kb, char *line, size_t size);
/* Child: the candidate applied to cctx (its K-block, small-batch side and sets): 0, or -1. */
int eval_apply(clffn_context *cctx, const opts *o, const candidate *c);

/* ------------------------------------------------------------------------------------------ */
/* The search (phases.c, profile.c) */

/* Where phases 1 and 2 stand (saved after every candidate, so an interrupted run resumes). */
typedef struct state {
    int phase;          /* 1, 2, 3 (done) */
    int index;          /* next candidate of the phase */
    pset xgemm, direct; /* the best so far */
    double xgemm_s, direct_s;
    int have_xgemm, have_direct;
    double spent_s;
} state;

/* What the parent knows of the device and the search. */
typedef struct search {
    opts o;
    double budget, t0; /* t0: the clock at the start, earlier runs' time subtracted */
    limits lim;
    int tty;
    double flops;    /* of the FFN's two GEMMs */
    size_t kb_guess; /* the K-block phases 1-3 run with */
    /* --large-shape: phase 9's large products' crossover is measured on large_D -> large_F,
     * gated (0: not measured) */
    size_t large_D, large_F;
    size_t row_group_cols; /* the row-grouping boundary the device has before the search */
    char path[1200], progress[1300], dir[1024];
    char name[256], platform[256], driver[256];
    const char *builtin; /* the device's built-in profile (static text), or NULL */
    state s;
} search;

/* Seconds of the budget spent, earlier runs of an interrupted search included. */
static inline double spent(const search *r) { return tool_now_s() - r->t0; }

/* What phases 5 and 7 found: the GEMV kernels' parameters and the crossover. */
typedef struct gemv_result {
    pset fast, rot;
    int have;
    size_t max_tokens;
} gemv_result;

/* A few-tokens Xgemm set found by phase 8: rows 0 when there is none. */
typedef struct few_result {
    pset set;
    size_t rows;    /* XGEMM_FEW_ROWS: products of fewer tokens use set */
    char spec[300]; /* as opts.few gives it to a child */
} few_result;

void phase_xgemm(search *r);
void phase_direct(search *r, size_t small_t);
size_t phase_crossover(search *r);
size_t phase_k_block(search *r, size_t min_indirect);
size_t phase_k_block_rows(search *r, size_t min_indirect, size_t k_block);
void phase_gemv(search *r, size_t min_indirect, size_t k_block, gemv_result *g);
clffn_layout phase_weight_layout(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                                 const gemv_result *g);
size_t phase_gemv_crossover(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                            const gemv_result *g, clffn_layout kept);
void phase_few_rows(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                    const gemv_result *g, clffn_layout kept, few_result *f);
/* The block a product of T token rows gets from the library under that threshold. */
size_t k_block_at(size_t T, size_t k_block, size_t k_min_rows);

/* What phase 9 found (kernels.c): the few-token kernels' shapes and where they stop paying,
 * for f16 and bf16 weights, for q8_0's and q4_0's blocks, for their quantized inputs and for
 * f32 (clffn_context_set_kernel_max_tokens). */
typedef struct kernel_result {
    int have;
    size_t shape[CLFFN_WGEMV_PARAMS];
    size_t max_tokens, max_tokens_blocks, max_tokens_qx, max_tokens_f32;
    /* WEIGHT_LAYOUT, chosen with KERNEL_MAX_TOKENS_F32 (phase 6's where the other loses) */
    clffn_layout layout;
    /* KERNEL_MAX_TOKENS_LARGE from KERNEL_LARGE_WEIGHTS: large_weights 0 where not measured */
    size_t max_tokens_large, large_weights;
    /* WGEMV_ROW_GROUP_COLS, where have_row_group (CPU devices, a work-item a row) */
    int have_row_group;
    size_t row_group_cols;
} kernel_result;

/* Phase 9's token counts, shared by its parent (kernels.c) and its child (kernels_child.c): the
 * crossovers' (1 ... MOST_TOKENS, in passes of 16 past 16) and the row-grouping boundary's (one
 * pass of the kernels, rows in fours up to 4 tokens and in twos above where they go several to
 * a work-item). */
enum {
    N_TOKEN_COUNTS = 11,
    MOST_TOKENS = 1024,
    N_GROUP_COUNTS = 5,
    MAX_GROUP_BOUNDS = 2 * N_GROUP_COUNTS + 1
};
extern const size_t TOKEN_COUNTS[N_TOKEN_COUNTS];
extern const size_t GROUP_COUNTS[N_GROUP_COUNTS];
void phase_kernels(search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                   const gemv_result *g, clffn_layout kept, const few_result *few,
                   kernel_result *k);
/* Child: phase 9's measurement (opts.kernels); prints one line of seconds. Exit 0, 3 for the
 * kernels disagreeing with the path they replace, 1 otherwise. */
int kernels_main(const opts *o, const candidate *c);
/* The phase's findings into a profile's "clffn" object (nothing when it found none),
 * WEIGHT_LAYOUT included. */
void kernels_json(cJSON *own, const kernel_result *k);
/* The small-batch spec of phase 5's winners up to max_tokens (phases.c). */
const char *gemv_spec(char *buf, size_t size, size_t max_tokens, const gemv_result *g);

/* profile.c */
/* "[out, in]" or "[in, out]", for the lines that report a layout */
const char *layout_text(clffn_layout l);
/* Opens the device once to learn its names, limits and profile path; the parent only plans,
 * children measure. With print_only, prints the profile instead. Returns -1 to go on, else the
 * exit status. */
int device_facts(search *r, int print_only);
/* mkdir -p */
int make_dirs(const char *dir);
void state_init(state *s, const char *progress_path, int fresh);
void save_state(const char *path, const state *s);
/* A progress bar on stderr when it is a terminal. */
void show_progress(int tty, double spent_s, double budget, const char *phase, int tried,
                   double best_gflops);
/* Where the GEMM search found nothing faster than what is applied: clffn's kernels' findings
 * (kr->have) written into the profile that the library would apply (the device's file, else its
 * built-in one), the rest of it kept. 0 when written or when it already holds them, else 1. */
int write_kernels_only(const search *r, const kernel_result *kr);
/* The winners as a profile, written atomically; the exit status. */
int write_profile(const search *r, size_t min_indirect, size_t k_block, size_t k_min_rows,
                  const gemv_result *g, const few_result *few, clffn_layout kept,
                  const kernel_result *kr, double after_s, int have_before, double before_s);

#endif
