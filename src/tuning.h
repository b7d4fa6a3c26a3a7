/* Tuning profiles: given a device, apply its CLBlast parameters and return clffn's own values.
 * Below the context: it knows devices and files, never a clffn_context. */
#ifndef CLFFN_TUNING_H
#define CLFFN_TUNING_H

#include "common.h"

/* The few-token kernels' crossovers, one a clffn_kernel_class (CLFFN_KERNELS_F32 …
 * CLFFN_KERNELS_BLOCKS). */
#define CLFFN_KERNEL_CLASSES 5

/* CLBlast 1.5's Xgemm kernel takes 16 parameters (GEMMK ... VWN). */
#define CLFFN_XGEMM_PARAMS 16

/* One Xgemm parameter set, values in clffn__xgemm_names' order. */
typedef struct clffn_xgemm_set {
    int have; /* 0: no set (CLBlast's database, or whatever was applied last, decides) */
    size_t values[CLFFN_XGEMM_PARAMS];
} clffn_xgemm_set;

/* What applying a device's profile gave. */
typedef struct clffn_tuning {
    char applied[1300];  /* "profile <path>", "built-in profile" or "none (…)" */
    size_t gemm_k_block; /* the profile's "clffn": {"GEMM_K_BLOCK": n}; 0 without one */
    /* "clffn": {"GEMV_MAX_TOKENS": n}; CLFFN_DEFAULT_GEMV_MAX_TOKENS without one */
    size_t gemv_max_tokens;
    size_t gemm_k_block_min_rows; /* "GEMM_K_BLOCK_MIN_ROWS": n; 0 without one */
    clffn_layout weight_layout;   /* "WEIGHT_LAYOUT": n; CLFFN_DEFAULT_WEIGHT_LAYOUT without */
    clffn_xgemm_set xgemm;        /* "clblast": {"Xgemm": {...}} */
    clffn_xgemm_set xgemm_few;    /* "clblast_few_rows": {"Xgemm": {...}} */
    size_t xgemm_few_rows;        /* "XGEMM_FEW_ROWS": n: products of fewer tokens use xgemm_few */
    /* "KERNEL_MAX_TOKENS_F32", "KERNEL_MAX_TOKENS", "KERNEL_MAX_TOKENS_QX",
     * "KERNEL_MAX_TOKENS_LARGE", "KERNEL_MAX_TOKENS_BLOCKS": the few-token kernels' crossovers
     * for each clffn_kernel_class; the CLFFN_DEFAULT_KERNEL_MAX_TOKENS* without, and the
     * compressed one for quantized inputs, large products and q8_0's and q4_0's blocks where a
     * profile gives that alone */
    size_t kernel_max_tokens[CLFFN_KERNEL_CLASSES];
    size_t kernel_large_weights; /* "KERNEL_LARGE_WEIGHTS"; CLFFN_DEFAULT_KERNEL_LARGE_WEIGHTS */
    /* "WGEMV_ROW_GROUP_COLS": on a CPU, rows go several to a work-item of the row kernels where
     * x has at least this many floats; CLFFN_DEFAULT_ROW_GROUP_COLS without */
    size_t row_group_cols;
    /* "WGEMV_ROW_SPLIT" … "WGEMV_COL_GROUPS" (CLFFN_WGEMV_PARAMS), all or none; 0s without */
    size_t wgemv[CLFFN_WGEMV_PARAMS];
    /* "FUSED_EPILOGUES": 0 or 1 (clffn_context_set_fused_epilogues); -1 without: on but on CPU
     * devices */
    int fused_epilogues;
} clffn_tuning;

/* The largest crossover a profile may give (a count of tokens past any a forward takes). */
#define CLFFN_KERNEL_MAX_TOKENS_MOST 1073741824.0

/* The few-token kernel shapes' names in the profile, in the order of clffn_context_set_wgemv. */
extern const char *const clffn__wgemv_names[CLFFN_WGEMV_PARAMS];

/* Whether params are kernel shapes within their ranges (clffn_context_set_wgemv) whose
 * work-groups fit max_wg work-items (0: not checked). */
bool clffn__wgemv_valid(const size_t params[CLFFN_WGEMV_PARAMS], size_t max_wg);

/* Applies the device's profile file, else its built-in profile, else nothing (CLBlast's own
 * database decides), and says which in *out. CLFFN_NO_TUNING=1 skips it all. A missing or
 * damaged file falls back and says so; OUT_OF_HOST_MEMORY is the only failure. */
clffn_status clffn__tuning_apply(cl_device_id device, clffn_tuning *out);

/* The Xgemm parameter names, in the order clffn_xgemm_set keeps values. */
extern const char *const clffn__xgemm_names[CLFFN_XGEMM_PARAMS];

/* n name/value pairs into *out: every Xgemm parameter exactly once, in any order, else
 * INVALID_ARGUMENT with *out unchanged. */
clffn_status clffn__xgemm_set_from(size_t n, const char *const *names, const size_t *values,
                                   clffn_xgemm_set *out);

/* A device's Xgemm parameters are CLBlast's, process-wide (CLBlastOverrideParameters), and read
 * when an SGEMM is enqueued. A context that runs two sets (one for few token rows, one for the
 * rest) holds the device while it applies the set a product wants and enqueues it, so that no
 * other thread changes the parameters in between; the set is applied only when the device has
 * another, since each change costs about a millisecond on POCL. */
typedef struct clffn_xgemm_hold clffn_xgemm_hold;

/* Makes set (have) the device's Xgemm parameters unless they are already, and holds the device
 * until clffn__xgemm_release(*held). On failure (CLBlast's status) nothing is held and *held is
 * NULL. */
clffn_status clffn__xgemm_hold(cl_device_id device, const clffn_xgemm_set *set,
                               clffn_xgemm_hold **held);

/* Lets other threads change the device's parameters again; NULL does nothing. */
void clffn__xgemm_release(clffn_xgemm_hold *held);

/* How many times clffn has changed a device's Xgemm parameters in this process (for the tests:
 * steady work must not switch). */
unsigned long clffn__xgemm_changes(void);

/* The built-in profile's JSON for the device, or NULL. */
const char *clffn__builtin_profile(cl_device_id device);

/* The same for a device of that platform and name (the first entry whose substrings both
 * hold). */
const char *clffn__builtin_profile_for(const char *platform, const char *name);

/* The i-th entry of the built-in table (one text may serve several entries), or NULL past the
 * end: for the tests, which check every profile on whatever device they have. */
const char *clffn__builtin_profile_at(size_t i);

#endif
