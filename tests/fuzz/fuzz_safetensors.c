/* libFuzzer harness for the safetensors parser: any bytes must parse or be refused with a
 * message, never crash, and a parsed file's tensors must lie inside the buffer. */
#include "clffn_io.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    clffn_st_file f;
    char err[CLFFN_IO_ERR];
    if (clffn_st_parse(data, size, &f, err) != 0) {
        if (memchr(err, '\0', sizeof err) == NULL || err[0] == '\0') { abort(); }
        return 0;
    }
    for (size_t i = 0; i < f.count; ++i) {
        const clffn_st_tensor *t = &f.tensors[i];
        if (t->end > f.data_len || t->begin > t->end || clffn_st_find(&f, t->name) == NULL) {
            abort();
        }
        /* reading a small convertible tensor touches exactly its bytes */
        if (clffn_io_dtype_is_convertible(t->dtype) && t->numel <= 4096) {
            float *out = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *out);
            if (out && clffn_st_read_f32(&f, t, out, err) != 0) { abort(); }
            free(out);
        }
    }
    clffn_st_close(&f);
    return 0;
}
