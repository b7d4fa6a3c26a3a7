/* clffn_moe_create_split: a mixture-of-experts layer whose routed experts live on the contexts
 * of an in-process group (moe.c runs them, moe_remote.c moves their rows). Above the layer's own
 * files: it makes a layer, then moves experts to their owners. */
#include "moe.h"

int clffn_moe_expert_owner(size_t e, size_t experts, int count) {
    if (count < 1 || experts == 0 || e >= experts) { return -1; }
    return (int)(e * (size_t)count / experts);
}

clffn_status clffn_moe_create_split(clffn_context *const *contexts, int count,
                                    const clffn_moe_config *config, clffn_moe **out) {
    if (!contexts || !config || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (count < 1 || (size_t)count > config->experts) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    for (int i = 0; i < count; ++i) {
        if (!contexts[i]) { return CLFFN_ERROR_NULL_ARGUMENT; }
    }
    clffn_moe *moe = NULL;
    clffn_status st = clffn_moe_create(contexts[0], config, &moe);
    for (size_t e = 0; e < config->experts && st == CLFFN_SUCCESS; ++e) {
        const int owner = clffn_moe_expert_owner(e, config->experts, count);
        if (owner == 0) { continue; }
        clffn_ffn *f = NULL;
        st = clffn_ffn_create(contexts[owner], &config->expert, &f);
        if (st == CLFFN_SUCCESS) {
            clffn_ffn_destroy(moe->ffn[e]);
            moe->ffn[e] = f;
        }
    }
    if (st != CLFFN_SUCCESS) {
        clffn_moe_destroy(moe);
        return st;
    }
    *out = moe;
    return CLFFN_SUCCESS;
}
