/* Tuning profiles: given a device, apply its CLBlast parameters and return clffn's own values.
 * Below the context: it knows devices and files, never a clffn_context. */
#ifndef CLFFN_TUNING_H
#define CLFFN_TUNING_H

#include "common.h"

/* What applying a device's profile gave. */
typedef struct clffn_tuning {
    char applied[1300];  /* "profile <path>", "built-in profile" or "none (…)" */
    size_t gemm_k_block; /* the profile's "clffn": {"GEMM_K_BLOCK": n}; 0 without one */
    /* "clffn": {"GEMV_MAX_TOKENS": n}; CLFFN_DEFAULT_GEMV_MAX_TOKENS without one */
    size_t gemv_max_tokens;
    size_t gemm_k_block_min_rows; /* "GEMM_K_BLOCK_MIN_ROWS": n; 0 without one */
    clffn_layout weight_layout;   /* "WEIGHT_LAYOUT": n; CLFFN_DEFAULT_WEIGHT_LAYOUT without */
} clffn_tuning;

/* Applies the device's profile file, else its built-in profile, else nothing (CLBlast's own
 * database decides), and says which in *out. CLFFN_NO_TUNING=1 skips it all. A missing or
 * damaged file falls back and says so; OUT_OF_HOST_MEMORY is the only failure. */
clffn_status clffn__tuning_apply(cl_device_id device, clffn_tuning *out);

/* The built-in profile's JSON for the device, or NULL. */
const char *clffn__builtin_profile(cl_device_id device);

/* The i-th entry of the built-in table (one text may serve several entries), or NULL past the
 * end: for the tests, which check every profile on whatever device they have. */
const char *clffn__builtin_profile_at(size_t i);

#endif
