/* The dropout generator on the host (philox.c): the plain-C twin of cl/philox.cl. */
#ifndef CLFFN_PHILOX_H
#define CLFFN_PHILOX_H

#include "common.h"

/* The dropout threshold and scale shared by the device kernels and the reference:
 * round(p · 2^32), and 1/(1 − p) in float (0 for p = 1). */
uint64_t clffn__drop_threshold(float p);
float clffn__drop_scale(float p);

#endif
