/* Weight types on the host (dtype.c): the public conversions' helpers, for the layers above. */
#ifndef CLFFN_DTYPE_H
#define CLFFN_DTYPE_H

#include "common.h"

/* Bytes of one unit of t: one value (f32, f16, bf16) or one block of CLFFN_QK values
 * (q8_0, q4_0); 0 for an unknown type. */
size_t clffn__dtype_block_bytes(clffn_dtype t);

/* q8_0 or q4_0: values come in blocks of CLFFN_QK along the input dimension. */
bool clffn__dtype_quantized(clffn_dtype t);

/* Round to nearest even, as F16C's vcvtps2ph and OpenCL's vstore_half_rte do. */
uint16_t clffn__f32_to_f16(float f);
float clffn__f16_to_f32(uint16_t h);
uint16_t clffn__f32_to_bf16(float f);
float clffn__bf16_to_f32(uint16_t b);

/* Value j (< CLFFN_QK) of one q8_0 or q4_0 block. */
float clffn__block_value(clffn_dtype t, const uint8_t *blk, size_t j);

#endif
