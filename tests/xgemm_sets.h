/* Shared by the Criterion suites and the ThreadSanitizer program. */
#ifndef CLFFN_TEST_XGEMM_SETS_H
#define CLFFN_TEST_XGEMM_SETS_H

#include <stddef.h>

/* Two Xgemm parameter sets with different tiles (POCL's 128 × 32 and 128 × 8, CLBlast 1.5's
 * parameter names), for the tests of clffn_context_set_xgemm: valid on any device (16 and 4
 * work-items a group, no local memory). */
static const char *const test_xgemm_names[16] = {"GEMMK", "KREG",  "KWG",   "KWI", "MDIMA", "MDIMC",
                                                 "MWG",   "NDIMB", "NDIMC", "NWG", "SA",    "SB",
                                                 "STRM",  "STRN",  "VWM",   "VWN"};
static const size_t test_xgemm_wide[16] = {0, 1, 32, 8, 8, 4, 128, 4, 4, 32, 0, 0, 0, 1, 16, 8};
static const size_t test_xgemm_narrow[16] = {0, 1, 64, 8, 4, 4, 128, 1, 1, 8, 0, 0, 0, 1, 16, 8};

#endif
