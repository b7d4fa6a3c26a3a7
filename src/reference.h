/* The reference's double core (reference.c), for the finite-difference tests. */
#ifndef CLFFN_REFERENCE_H
#define CLFFN_REFERENCE_H

#include "common.h"

typedef struct clffn_ref_params {
    const double *w1, *b1, *v, *bv, *w2, *b2;
} clffn_ref_params;

clffn_status clffn__ref_forward_d(const clffn_config *c, clffn_layout layout,
                                  const clffn_ref_params *p, size_t tokens, const double *x,
                                  int training, uint64_t seed, uint64_t offset, double *y,
                                  double *hidden);
clffn_status clffn__ref_backward_d(const clffn_config *c, clffn_layout layout,
                                   const clffn_ref_params *p, size_t tokens, const double *x,
                                   const double *dy, int training, uint64_t seed, uint64_t offset,
                                   double *dx, const clffn_ref_grads *gr);

#endif
