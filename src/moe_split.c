/* Where a mixture-of-experts layer's work happens. clffn_moe_create_split: a layer whose routed
 * experts live on the contexts of an in-process group (moe.c runs them, moe_remote.c moves their
 * rows); clffn_moe_create_partial: one that holds some experts and hands the others' rows to an
 * exchange of the program's (another process holds them); clffn_moe_set_counts: whether the
 * expert counts of a forward through clffn's kernels stay on the device; clffn_moe_set_grouping:
 * whether the
 * experts' weights go to the layer's pools, to run grouped. Above the layer's own files: each
 * makes or takes a layer, then says where its experts and counts are. */
#include "moe.h"

clffn_status clffn_moe_set_counts(clffn_moe *moe, clffn_moe_counts where) {
    if (!moe) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (where != CLFFN_MOE_COUNTS_DEVICE && where != CLFFN_MOE_COUNTS_HOST &&
        where != CLFFN_MOE_COUNTS_AUTO) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    moe->counts_where = where;
    return CLFFN_SUCCESS;
}

clffn_moe_counts clffn_moe_counts_where(const clffn_moe *moe) {
    return moe ? moe->counts_where : CLFFN_MOE_COUNTS_DEVICE;
}

clffn_status clffn_moe_set_grouping(clffn_moe *moe, int on) {
    if (!moe) { return CLFFN_ERROR_NULL_ARGUMENT; }
    moe->group.pools.off = !on || clffn__moe_split(moe); /* see below */
    return CLFFN_SUCCESS;
}

int clffn_moe_experts_grouped(const clffn_moe *moe) { return moe && moe->last_grouped ? 1 : 0; }

int clffn_moe_counts_kept(const clffn_moe *moe) { return moe && moe->last_counted ? 1 : 0; }

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
    /* its counts are read back, so it never runs grouped, and pools of E slots on the first
     * context would hold room for every other context's experts too */
    moe->group.pools.off = count > 1;
    *out = moe;
    return CLFFN_SUCCESS;
}

clffn_status clffn_moe_create_partial(clffn_context *ctx, const clffn_moe_config *config,
                                      size_t first, size_t count, clffn_moe_exchange_fn exchange,
                                      void *user, clffn_moe **out) {
    if (!ctx || !config || !exchange || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (count == 0 || first > config->experts || count > config->experts - first) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    clffn_moe *moe = NULL;
    const clffn_status st = clffn_moe_create(ctx, config, &moe);
    if (st != CLFFN_SUCCESS) { return st; }
    /* the experts held elsewhere keep their idle stand-ins: FFNs without weights, whose kernels
     * are the held ones' (one program), so every loop over the experts stays as it is */
    moe->exchange = exchange, moe->exchange_user = user;
    moe->held0 = first, moe->held1 = first + count;
    moe->group.pools.off = true; /* as a split layer's: no room for the experts held elsewhere */
    *out = moe;
    return CLFFN_SUCCESS;
}
