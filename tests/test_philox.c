/* Philox4x32-10 known answers (Random123's kat_vectors) on the host and on the device, and the
 * device generator against the host one on many counters. */
#include "common.h"

static const uint32_t kat_zero_out[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
static const uint32_t kat_ones_out[4] = {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu};

static void assert_words(const uint32_t got[4], const uint32_t want[4], const char *what) {
    for (int i = 0; i < 4; ++i) {
        cr_assert_eq(got[i], want[i], "%s word %d: got %08x, want %08x", what, i, got[i], want[i]);
    }
}

Test(philox, host_known_answers) {
    const uint32_t zero_c[4] = {0, 0, 0, 0}, zero_k[2] = {0, 0};
    const uint32_t ones_c[4] = {~0u, ~0u, ~0u, ~0u}, ones_k[2] = {~0u, ~0u};
    uint32_t out[4];
    clffn_philox4x32_10(zero_c, zero_k, out);
    assert_words(out, kat_zero_out, "host zero");
    clffn_philox4x32_10(ones_c, ones_k, out);
    assert_words(out, kat_ones_out, "host ones");
}

Test(philox, device_known_answers) {
    clffn_context *ctx = test_context();
    const uint32_t zero_c[4] = {0, 0, 0, 0}, zero_k[2] = {0, 0};
    const uint32_t ones_c[4] = {~0u, ~0u, ~0u, ~0u}, ones_k[2] = {~0u, ~0u};
    uint32_t out[4];
    ASSERT_OK(clffn__device_philox(&ctx->programs, ctx->queue, zero_c, zero_k, out));
    assert_words(out, kat_zero_out, "device zero");
    ASSERT_OK(clffn__device_philox(&ctx->programs, ctx->queue, ones_c, ones_k, out));
    assert_words(out, kat_ones_out, "device ones");
    clffn_context_destroy(ctx);
}

static uint32_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 32);
}

Test(philox, device_matches_host) {
    clffn_context *ctx = test_context();
    uint64_t s = 12345;
    for (int i = 0; i < 64; ++i) {
        uint32_t c[4], k[2], dev[4], host[4];
        for (int j = 0; j < 4; ++j) { c[j] = lcg(&s); }
        for (int j = 0; j < 2; ++j) { k[j] = lcg(&s); }
        clffn_philox4x32_10(c, k, host);
        ASSERT_OK(clffn__device_philox(&ctx->programs, ctx->queue, c, k, dev));
        assert_words(dev, host, "random counter");
    }
    clffn_context_destroy(ctx);
}
