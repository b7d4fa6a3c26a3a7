/* Built against an installed clffn: checks header/library versions agree and runs a tiny FFN. */
#include <clffn.h>
#include <stdio.h>

int main(void) {
    if (clffn_version_number() != CLFFN_VERSION_NUMBER) {
        fprintf(stderr, "header %d, library %u\n", CLFFN_VERSION_NUMBER, clffn_version_number());
        return 1;
    }
    clffn_context *ctx = NULL;
    clffn_ffn *ffn = NULL;
    clffn_config c = clffn_config_default(4, 8);
    float x[8] = {1, 2, 3, 4, -1, -2, -3, -4}, y[8];
    int st = clffn_context_create_default(&ctx);
    if (!st) st = clffn_ffn_create(ctx, &c, &ffn);
    if (!st) st = clffn_ffn_init_weights(ffn, CLFFN_INIT_TORCH_LINEAR, 1);
    if (!st) st = clffn_forward_host(ffn, 2, x, 8, y, 8);
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    printf("consumer: %s\n", clffn_status_string(st));
    return st != 0;
}
