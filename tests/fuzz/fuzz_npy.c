/* libFuzzer harness for the .npy parser: any bytes must parse or be refused with a message,
 * never crash, and a parsed array's element count must match its shape. */
#include "clffn_io.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    clffn_npy a;
    char err[CLFFN_IO_ERR];
    if (clffn_npy_parse(data, size, &a, err) != 0) {
        if (memchr(err, '\0', sizeof err) == NULL || err[0] == '\0') { abort(); }
        return 0;
    }
    uint64_t n = 1;
    for (size_t k = 0; k < a.rank; ++k) { n *= a.shape[k]; }
    if (n != a.numel || (a.numel && !a.data)) { abort(); }
    volatile float sink = 0.0f;
    for (uint64_t i = 0; i < a.numel; ++i) { sink += a.data[i]; } /* every element readable */
    (void)sink;
    clffn_npy_free(&a);
    return 0;
}
