/* Every bad input gets its status, before anything is enqueued, and the caller's output stays as
 * it was (checked with a sentinel-filled y after each failing call). */
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define D 12
#define F 20
#define T 5
#define SENTINEL 777.25f

typedef struct fixture {
    clffn_context *ctx;
    clffn_ffn *ffn;
    clffn_config c;
    test_weights w;
    float x[T * D], y[T * D];
    guarded gx, gy;
} fixture;

static void fx_make(fixture *f) {
    memset(f, 0, sizeof *f);
    f->ctx = test_context();
    f->c = clffn_config_default(D, F);
    test_weights_make(&f->w, &f->c, CLFFN_LAYOUT_OUT_IN, 1);
    ASSERT_OK(clffn_ffn_create(f->ctx, &f->c, &f->ffn));
    ASSERT_OK(clffn_ffn_upload_weights(f->ffn, CLFFN_LAYOUT_OUT_IN, &f->w.host));
    fill_uniform(f->x, T * D, -1, 1, 2);
    for (size_t i = 0; i < T * D; ++i) { f->y[i] = SENTINEL; }
    f->gx = guarded_make(f->ctx, CANARY, T * D, f->x);
    f->gy = guarded_make(f->ctx, CANARY, T * D, f->y);
}

/* y (host array and device buffer) still holds the sentinel everywhere, canaries intact */
static void fx_assert_untouched(fixture *f, const char *what) {
    for (size_t i = 0; i < T * D; ++i) {
        cr_assert(f->y[i] == SENTINEL, "%s: host y[%zu] was written", what, i);
    }
    float dev[T * D];
    ASSERT_OK(clFinish(clffn_context_queue(f->ctx)));
    guarded_read(f->ctx, &f->gy, dev);
    for (size_t i = 0; i < T * D; ++i) {
        cr_assert(dev[i] == SENTINEL, "%s: device y[%zu] was written", what, i);
    }
    guarded_assert_canaries(f->ctx, &f->gy, what);
}

static void fx_free(fixture *f) {
    guarded_free(&f->gx);
    guarded_free(&f->gy);
    clffn_ffn_destroy(f->ffn);
    clffn_context_destroy(f->ctx);
    test_weights_free(&f->w);
}

#define Q(f) clffn_context_queue((f)->ctx)

Test(errors, null_pointers) {
    fixture f;
    fx_make(&f);
    clffn_ffn *ffn = NULL;
    clffn_context *ctx = NULL;
    ASSERT_STATUS(clffn_context_create(NULL, NULL, &ctx), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_context_create_for_device(NULL, NULL), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_create(NULL, &f.c, &ffn), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_create(f.ctx, NULL, &ffn), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_create(f.ctx, &f.c, NULL), CLFFN_ERROR_NULL_ARGUMENT);
    cr_assert_null(ffn);
    ASSERT_STATUS(clffn_config_validate(NULL), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_upload_weights(f.ffn, CLFFN_LAYOUT_OUT_IN, NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    clffn_host_weights hw = f.w.host;
    hw.w2 = NULL;
    ASSERT_STATUS(clffn_ffn_upload_weights(f.ffn, CLFFN_LAYOUT_OUT_IN, &hw),
                  CLFFN_ERROR_NULL_ARGUMENT);
    hw = f.w.host;
    hw.b1 = NULL; /* bias1 is on */
    ASSERT_STATUS(clffn_ffn_upload_weights(f.ffn, CLFFN_LAYOUT_OUT_IN, &hw),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_bind_weights(f.ffn, CLFFN_LAYOUT_OUT_IN, NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_forward(NULL, T, f.gx.mem, f.gx.offset, f.gy.mem, f.gy.offset, Q(&f), NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_forward(f.ffn, T, NULL, 0, f.gy.mem, f.gy.offset, Q(&f), NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_forward(f.ffn, T, f.gx.mem, f.gx.offset, NULL, 0, Q(&f), NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_forward(f.ffn, T, f.gx.mem, f.gx.offset, f.gy.mem, f.gy.offset, NULL, NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_forward_host(NULL, T, f.x, T * D, f.y, T * D), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_forward_host(f.ffn, T, NULL, T * D, f.y, T * D), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_forward_host(f.ffn, T, f.x, T * D, NULL, T * D), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_read_hidden(f.ffn, CLFFN_HIDDEN_OUT, NULL, 100, NULL),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_set_training(NULL, 1), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_set_dropout(NULL, 0.1f), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_set_rng(NULL, 1, 1), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_get_rng(NULL, NULL, NULL), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_init_weights(NULL, CLFFN_INIT_TORCH_LINEAR, 1),
                  CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(
        clffn_init_weights_host(&f.c, CLFFN_INIT_TORCH_LINEAR, 1, CLFFN_LAYOUT_OUT_IN, NULL),
        CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(
        clffn_reference_forward(&f.c, CLFFN_LAYOUT_OUT_IN, &f.w.host, T, NULL, 0, 0, 0, NULL, NULL),
        CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_activation_parse(NULL, NULL, NULL), CLFFN_ERROR_NULL_ARGUMENT);
    char name[8];
    ASSERT_STATUS(clffn_context_device_name(NULL, name, sizeof name), CLFFN_ERROR_NULL_ARGUMENT);
    ASSERT_STATUS(clffn_context_device_name(f.ctx, name, 0), CLFFN_ERROR_INVALID_SIZE);
    /* destroy accepts NULL */
    clffn_ffn_destroy(NULL);
    clffn_context_destroy(NULL);
    fx_assert_untouched(&f, "null pointers");
    fx_free(&f);
}

Test(errors, bad_configs) {
    clffn_context *ctx = test_context();
    clffn_ffn *ffn = NULL;
    clffn_config c = clffn_config_default(0, 8);
    ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CLFFN_ERROR_INVALID_SIZE);
    c = clffn_config_default(8, 0);
    ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CLFFN_ERROR_INVALID_SIZE);
    c = clffn_config_default(SIZE_MAX / 4, 8); /* D·F·8 bytes overflows size_t */
    ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CLFFN_ERROR_SIZE_OVERFLOW);
    const float bad_p[] = {-0.01f, 1.01f, NAN, INFINITY};
    for (size_t i = 0; i < 4; ++i) {
        c = clffn_config_default(8, 8);
        c.dropout = bad_p[i];
        ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CLFFN_ERROR_INVALID_DROPOUT);
    }
    c = clffn_config_default(8, 8);
    c.activation = (clffn_activation)99;
    ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CLFFN_ERROR_INVALID_ACTIVATION);
    c.activation = (clffn_activation)-1;
    ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CLFFN_ERROR_INVALID_ACTIVATION);
    clffn_activation a;
    ASSERT_STATUS(clffn_activation_parse("relu6", &a, NULL), CLFFN_ERROR_INVALID_ACTIVATION);
    cr_assert_null(clffn_activation_name((clffn_activation)42));
    /* weights larger than the device's max allocation, without size_t overflow */
    cl_ulong max_alloc = 0;
    ASSERT_OK(clGetDeviceInfo(clffn_context_cl_device(ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                              sizeof max_alloc, &max_alloc, NULL));
    c = clffn_config_default(1024, (size_t)(max_alloc / 4 / 1024) + 1);
    ASSERT_STATUS(clffn_ffn_create(ctx, &c, &ffn), CLFFN_ERROR_SIZE_OVERFLOW);
    cr_assert_null(ffn);
    clffn_context_destroy(ctx);
}

Test(errors, dropout_setters) {
    fixture f;
    fx_make(&f);
    ASSERT_STATUS(clffn_ffn_set_dropout(f.ffn, -1.0f), CLFFN_ERROR_INVALID_DROPOUT);
    ASSERT_STATUS(clffn_ffn_set_dropout(f.ffn, 2.0f), CLFFN_ERROR_INVALID_DROPOUT);
    ASSERT_STATUS(clffn_ffn_set_dropout(f.ffn, NAN), CLFFN_ERROR_INVALID_DROPOUT);
    cr_assert(clffn_ffn_get_config(f.ffn).dropout == 0.1f, "a refused p must not stick");
    fx_free(&f);
}

Test(errors, sizes_and_short_buffers) {
    fixture f;
    fx_make(&f);
    /* tokens·D or tokens·F beyond size_t */
    ASSERT_STATUS(clffn_forward(f.ffn, SIZE_MAX / 8, f.gx.mem, f.gx.offset, f.gy.mem, f.gy.offset,
                                Q(&f), NULL),
                  CLFFN_ERROR_SIZE_OVERFLOW);
    ASSERT_STATUS(clffn_forward_host(f.ffn, SIZE_MAX / 8, f.x, SIZE_MAX, f.y, SIZE_MAX),
                  CLFFN_ERROR_SIZE_OVERFLOW);
    /* tokens·F·4 beyond the device's max allocation */
    cl_ulong max_alloc = 0;
    ASSERT_OK(clGetDeviceInfo(clffn_context_cl_device(f.ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                              sizeof max_alloc, &max_alloc, NULL));
    const size_t huge_t = (size_t)(max_alloc / (F * 4)) + 1;
    ASSERT_STATUS(
        clffn_forward(f.ffn, huge_t, f.gx.mem, f.gx.offset, f.gy.mem, f.gy.offset, Q(&f), NULL),
        CLFFN_ERROR_SIZE_OVERFLOW);
    /* device buffers shorter than the shape */
    ASSERT_STATUS(clffn_forward(f.ffn, T + 1, f.gx.mem, f.gx.offset + CANARY, f.gy.mem, f.gy.offset,
                                Q(&f), NULL),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    ASSERT_STATUS(clffn_forward(f.ffn, T, f.gx.mem, f.gx.offset, f.gy.mem, f.gy.offset + CANARY + 1,
                                Q(&f), NULL),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    ASSERT_STATUS(
        clffn_forward(f.ffn, T, f.gx.mem, SIZE_MAX - 2, f.gy.mem, f.gy.offset, Q(&f), NULL),
        CLFFN_ERROR_SIZE_OVERFLOW);
    /* host arrays shorter than the shape */
    ASSERT_STATUS(clffn_forward_host(f.ffn, T, f.x, T * D - 1, f.y, T * D),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    ASSERT_STATUS(clffn_forward_host(f.ffn, T, f.x, T * D, f.y, T * D - 1),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    fx_assert_untouched(&f, "sizes");
    fx_free(&f);
}

Test(errors, overlap_queue_and_foreign_buffers) {
    fixture f;
    fx_make(&f);
    /* y partly overlapping x */
    ASSERT_STATUS(
        clffn_forward(f.ffn, T, f.gy.mem, f.gy.offset, f.gy.mem, f.gy.offset + 1, Q(&f), NULL),
        CLFFN_ERROR_BUFFER_OVERLAP);
    /* an out-of-order queue, where the device has them (they are optional in OpenCL; a
     * warning would fail the run, as Criterion counts warnings) */
    cl_int err;
    cl_command_queue_properties props = 0;
    cr_assert_eq(clGetDeviceInfo(clffn_context_cl_device(f.ctx), CL_DEVICE_QUEUE_PROPERTIES,
                                 sizeof props, &props, NULL),
                 CL_SUCCESS);
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) {
        cl_command_queue ooo =
            clCreateCommandQueue(clffn_context_cl_context(f.ctx), clffn_context_cl_device(f.ctx),
                                 CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
        cr_assert_eq(err, CL_SUCCESS);
        ASSERT_STATUS(
            clffn_forward(f.ffn, T, f.gx.mem, f.gx.offset, f.gy.mem, f.gy.offset, ooo, NULL),
            CLFFN_ERROR_INVALID_QUEUE);
        clReleaseCommandQueue(ooo);
    } else {
        cr_log_info("the device has no out-of-order queues (optional): that case is not run");
    }
    /* a queue and a buffer of another context */
    cl_device_id dev = clffn_context_cl_device(f.ctx);
    cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_command_queue oq = clCreateCommandQueue(other, dev, 0, &err);
    cr_assert_eq(err, CL_SUCCESS);
    cl_mem ox = clCreateBuffer(other, CL_MEM_READ_WRITE, T * D * sizeof(float), NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    ASSERT_STATUS(clffn_forward(f.ffn, T, f.gx.mem, f.gx.offset, f.gy.mem, f.gy.offset, oq, NULL),
                  CLFFN_ERROR_INVALID_QUEUE);
    ASSERT_STATUS(clffn_forward(f.ffn, T, ox, 0, f.gy.mem, f.gy.offset, Q(&f), NULL),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    clffn_device_weights dw;
    memset(&dw, 0, sizeof dw);
    dw.w1.mem = dw.w2.mem = dw.b1.mem = dw.b2.mem = ox;
    ASSERT_STATUS(clffn_ffn_bind_weights(f.ffn, CLFFN_LAYOUT_OUT_IN, &dw),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    clReleaseMemObject(ox);
    clReleaseCommandQueue(oq);
    clReleaseContext(other);
    fx_assert_untouched(&f, "queues");
    /* the FFN still works after all of that */
    ASSERT_OK(clffn_forward_host(f.ffn, T, f.x, T * D, f.y, T * D));
    fx_free(&f);
}

Test(errors, weights_and_state) {
    clffn_context *ctx = test_context();
    clffn_config c = clffn_config_default(D, F);
    clffn_ffn *ffn = NULL;
    ASSERT_OK(clffn_ffn_create(ctx, &c, &ffn));
    float x[T * D], y[T * D], h[T * F];
    fill_uniform(x, T * D, -1, 1, 1);
    for (size_t i = 0; i < T * D; ++i) { y[i] = SENTINEL; }
    ASSERT_STATUS(clffn_forward_host(ffn, T, x, T * D, y, T * D), CLFFN_ERROR_NO_WEIGHTS);
    ASSERT_STATUS(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F, NULL),
                  CLFFN_ERROR_NO_FORWARD);
    test_weights w;
    test_weights_make(&w, &c, CLFFN_LAYOUT_OUT_IN, 3);
    ASSERT_STATUS(clffn_ffn_upload_weights(ffn, (clffn_layout)7, &w.host),
                  CLFFN_ERROR_INVALID_LAYOUT);
    ASSERT_STATUS(
        clffn_init_weights_host(&c, (clffn_init)9, 1, CLFFN_LAYOUT_OUT_IN,
                                &(clffn_weight_arrays){w.w1, w.b1, NULL, NULL, w.w2, w.b2}),
        CLFFN_ERROR_INVALID_ARGUMENT);
    /* bound device weights shorter than the shape */
    cl_int err;
    cl_mem small = clCreateBuffer(clffn_context_cl_context(ctx), CL_MEM_READ_WRITE,
                                  D * F * sizeof(float) - 4, NULL, &err);
    cr_assert_eq(err, CL_SUCCESS);
    const clffn_device_weights dw = {{small, 0}, {small, 0}, {NULL, 0},
                                     {NULL, 0},  {small, 0}, {small, 0}};
    ASSERT_STATUS(clffn_ffn_bind_weights(ffn, CLFFN_LAYOUT_OUT_IN, &dw),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    ASSERT_STATUS(clffn_ffn_bind_weights(ffn, (clffn_layout)3, &dw), CLFFN_ERROR_INVALID_LAYOUT);
    clReleaseMemObject(small);
    ASSERT_STATUS(clffn_forward_host(ffn, T, x, T * D, y, T * D), CLFFN_ERROR_NO_WEIGHTS);
    for (size_t i = 0; i < T * D; ++i) { cr_assert(y[i] == SENTINEL); }
    /* hidden-tensor requests that cannot be met */
    ASSERT_OK(clffn_ffn_upload_weights(ffn, CLFFN_LAYOUT_OUT_IN, &w.host));
    ASSERT_OK(clffn_forward_host(ffn, T, x, T * D, y, T * D));
    ASSERT_STATUS(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_GATE, h, T * F, NULL),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_read_hidden(ffn, (clffn_hidden)5, h, T * F, NULL),
                  CLFFN_ERROR_INVALID_ARGUMENT);
    ASSERT_STATUS(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F - 1, NULL),
                  CLFFN_ERROR_BUFFER_TOO_SMALL);
    /* tokens = 0 forgets the last forward */
    ASSERT_OK(clffn_forward_host(ffn, 0, x, 0, y, 0));
    ASSERT_STATUS(clffn_ffn_read_hidden(ffn, CLFFN_HIDDEN_OUT, h, T * F, NULL),
                  CLFFN_ERROR_NO_FORWARD);
    clffn_ffn_destroy(ffn);
    clffn_context_destroy(ctx);
    test_weights_free(&w);
}

/* tokens = 0 succeeds without CLBlast (which rejects empty matrices) and still hands back an
 * event that completes; nothing is written. */
Test(errors, zero_tokens) {
    fixture f;
    fx_make(&f);
    cl_event ev = NULL;
    ASSERT_OK(clffn_forward(f.ffn, 0, f.gx.mem, f.gx.offset, f.gy.mem, f.gy.offset, Q(&f), &ev));
    cr_assert_not_null(ev);
    ASSERT_OK(clWaitForEvents(1, &ev));
    clReleaseEvent(ev);
    ASSERT_OK(clffn_forward_host(f.ffn, 0, f.x, 0, f.y, 0));
    fx_assert_untouched(&f, "zero tokens");
    fx_free(&f);
}

Test(errors, device_capabilities) {
    clffn_device_caps caps = {1, 2, 1, 1};
    ASSERT_OK(clffn__device_caps_check(&caps));
    caps = (clffn_device_caps){3, 0, 1, 1};
    ASSERT_OK(clffn__device_caps_check(&caps));
    caps = (clffn_device_caps){1, 1, 1, 1}; /* OpenCL 1.1 */
    ASSERT_STATUS(clffn__device_caps_check(&caps), CLFFN_ERROR_DEVICE_UNSUPPORTED);
    caps = (clffn_device_caps){2, 0, 0, 1}; /* no online compiler */
    ASSERT_STATUS(clffn__device_caps_check(&caps), CLFFN_ERROR_DEVICE_UNSUPPORTED);
    caps = (clffn_device_caps){2, 0, 1, 0}; /* not available */
    ASSERT_STATUS(clffn__device_caps_check(&caps), CLFFN_ERROR_DEVICE_UNSUPPORTED);
    int ma = 0, mi = 0;
    cr_assert(clffn__parse_cl_version("OpenCL 3.0 PoCL HSTR", &ma, &mi) && ma == 3 && mi == 0);
    cr_assert(!clffn__parse_cl_version("garbage", &ma, &mi));
    /* the real device passes */
    clffn_context *ctx = test_context();
    ASSERT_OK(clffn__device_caps_query(clffn_context_cl_device(ctx), &caps));
    ASSERT_OK(clffn__device_caps_check(&caps));
    clffn_context_destroy(ctx);
}

Test(errors, device_selection) {
    clffn_context *ctx = NULL;
    ASSERT_STATUS(clffn_context_create_for_device("no-such-device-anywhere", &ctx),
                  CLFFN_ERROR_DEVICE_NOT_FOUND);
    ASSERT_STATUS(clffn_context_create_for_device("7:9", &ctx), CLFFN_ERROR_DEVICE_NOT_FOUND);
    cr_assert_null(ctx);
    ASSERT_OK(clffn_context_create_for_device("0:0", &ctx));
    clffn_context_destroy(ctx);
    ctx = NULL;
    setenv("CLFFN_DEVICE", "no-such-device-anywhere", 1);
    ASSERT_STATUS(clffn_context_create_default(&ctx), CLFFN_ERROR_DEVICE_NOT_FOUND);
    setenv("CLFFN_DEVICE", "0:0", 1);
    ASSERT_OK(clffn_context_create_default(&ctx));
    clffn_context_destroy(ctx);
}

/* No OpenCL platform at all: the ICD loader finds no vendor files and says -1001. This must run
 * before anything in the process touches OpenCL, which Criterion's process per test gives. */
Test(errors, no_platform) {
    setenv("OCL_ICD_VENDORS", "/nonexistent-clffn-test-dir", 1);
    clffn_context *ctx = NULL;
    ASSERT_STATUS(clffn_context_create_default(&ctx), CLFFN_PLATFORM_NOT_FOUND);
    cr_assert_null(ctx);
    cr_assert(strstr(clffn_status_string(CLFFN_PLATFORM_NOT_FOUND), "pocl") != NULL);
}
