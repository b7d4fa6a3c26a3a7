/* Every internal header of the host library at once, for the tests that reach inside it. The
 * library's own files include only the headers of the layers they call. Not installed. */
#ifndef CLFFN_INTERNAL_H
#define CLFFN_INTERNAL_H

#include "common.h"
#include "context.h"
#include "devices.h"
#include "ffn.h"
#include "gemm.h"
#include "launch.h"
#include "linear.h"
#include "philox.h"
#include "program.h"
#include "reference.h"
#include "transfer.h"
#include "tuning.h"

#endif
