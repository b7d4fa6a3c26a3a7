/* What the last forward leaves to look at: its hidden tensors and its stage times. */
#include "ffn.h"

#include "transfer.h"

#include <stdlib.h>

clffn_status clffn_ffn_read_hidden(clffn_ffn *ffn, clffn_hidden which, float *out, size_t out_len,
                                   size_t *tokens) {
    if (!ffn || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    const clffn_config *c = &ffn->cfg;
    if (which != CLFFN_HIDDEN_PRE && which != CLFFN_HIDDEN_GATE && which != CLFFN_HIDDEN_OUT) {
        return CLFFN_ERROR_INVALID_ARGUMENT;
    }
    if (which == CLFFN_HIDDEN_GATE && !c->gated) { return CLFFN_ERROR_INVALID_ARGUMENT; }
    if (ffn->last_tokens == 0 || !ffn->last_event) { return CLFFN_ERROR_NO_FORWARD; }
    const size_t T = ffn->last_tokens, F = c->d_ff, n = T * F; /* fitted the workspace */
    if (out_len < n) { return CLFFN_ERROR_BUFFER_TOO_SMALL; }
    clffn_context *ctx = ffn->ctx;
    /* the forward may still sit unflushed in the caller's queue, which we are about to wait on */
    cl_int err = clFlush(ffn->last_queue);
    if (err != CL_SUCCESS) { return (clffn_status)err; }

    if (which == CLFFN_HIDDEN_OUT) {
        err = clffn__read(ctx->queue, ffn->ws.h, 0, n * sizeof(float), out, 1, &ffn->last_event);
        if (err == CL_SUCCESS && tokens) { *tokens = T; }
        return (clffn_status)err;
    }
    /* PRE and GATE are z's halves plus their bias, added here in float as the kernel does */
    const bool pre = which == CLFFN_HIDDEN_PRE;
    const bool has_bias = pre ? c->bias1 != 0 : c->bias_gate != 0;
    const clffn_buffer *bias = pre ? &ffn->b1 : &ffn->bv;
    float *tmp = malloc(n * sizeof *tmp);
    float *b = has_bias ? malloc(F * sizeof *b) : NULL;
    if (!tmp || (has_bias && !b)) {
        free(tmp);
        free(b);
        return CLFFN_ERROR_OUT_OF_HOST_MEMORY;
    }
    const size_t ldz = clffn__n1(c), col0 = pre ? 0 : F;
    const size_t buffer_origin[3] = {col0 * sizeof(float), 0, 0};
    const size_t host_origin[3] = {0, 0, 0};
    const size_t region[3] = {F * sizeof(float), T, 1};
    err = clEnqueueReadBufferRect(ctx->queue, ffn->ws.z, CL_FALSE, buffer_origin, host_origin,
                                  region, ldz * sizeof(float), 0, F * sizeof(float), 0, tmp, 1,
                                  &ffn->last_event, NULL);
    if (err == CL_SUCCESS && has_bias) {
        err = clEnqueueReadBuffer(ctx->queue, bias->mem, CL_FALSE, bias->offset * sizeof(float),
                                  F * sizeof(float), b, 0, NULL, NULL);
    }
    cl_int fin = clffn__finish(ctx->queue);
    if (err == CL_SUCCESS) { err = fin; }
    if (err == CL_SUCCESS) {
        for (size_t t = 0; t < T; ++t) {
            for (size_t j = 0; j < F; ++j) { out[t * F + j] = tmp[t * F + j] + (b ? b[j] : 0.0f); }
        }
        if (tokens) { *tokens = T; }
    }
    free(tmp);
    free(b);
    return (clffn_status)err;
}

clffn_status clffn_ffn_set_profiling(clffn_ffn *ffn, int on) {
    if (!ffn) { return CLFFN_ERROR_NULL_ARGUMENT; }
    ffn->profiling = on != 0;
    return CLFFN_SUCCESS;
}

static cl_int event_time(cl_event e, cl_profiling_info what, cl_ulong *ns) {
    return clGetEventProfilingInfo(e, what, sizeof *ns, ns, NULL);
}

clffn_status clffn_ffn_stage_times(clffn_ffn *ffn, clffn_stage_times *out) {
    if (!ffn || !out) { return CLFFN_ERROR_NULL_ARGUMENT; }
    if (!ffn->prof_start || !ffn->prof_end || !ffn->last_event || ffn->last_tokens == 0) {
        return CLFFN_ERROR_NO_FORWARD;
    }
    cl_int err = clFlush(ffn->last_queue);
    if (err == CL_SUCCESS) { err = clWaitForEvents(1, &ffn->prof_end); }
    /* in-order queue: GEMM 1 runs from the marker to epilogue 1, GEMM 2 between the epilogues
     * (each GEMM may be several CLBlast kernels, so it is timed by what surrounds it) */
    cl_ulong t0 = 0, e1s = 0, e1e = 0, e2s = 0, e2e = 0;
    if (err == CL_SUCCESS) { err = event_time(ffn->prof_start, CL_PROFILING_COMMAND_END, &t0); }
    if (err == CL_SUCCESS) { err = event_time(ffn->last_event, CL_PROFILING_COMMAND_START, &e1s); }
    if (err == CL_SUCCESS) { err = event_time(ffn->last_event, CL_PROFILING_COMMAND_END, &e1e); }
    if (err == CL_SUCCESS) { err = event_time(ffn->prof_end, CL_PROFILING_COMMAND_START, &e2s); }
    if (err == CL_SUCCESS) { err = event_time(ffn->prof_end, CL_PROFILING_COMMAND_END, &e2e); }
    if (err != CL_SUCCESS) { return (clffn_status)err; }
    /* forwards refuse out-of-order queues, so stages out of order mean a timer that is not one */
    if (!(t0 <= e1s && e1s <= e1e && e1e <= e2s && e2s <= e2e)) {
        return CLFFN_ERROR_PROFILING_TIMES;
    }
    /* a fused epilogue's event is its product's (clffn_context_set_fused_epilogues) */
    const clffn_fused f = ffn->last_fused;
    out->gemm1_s = (double)((f.first ? e1e : e1s) - t0) * 1e-9;
    out->epilogue1_s = f.first ? 0.0 : (double)(e1e - e1s) * 1e-9;
    out->gemm2_s = (double)((f.second ? e2e : e2s) - e1e) * 1e-9;
    out->epilogue2_s = f.second ? 0.0 : (double)(e2e - e2s) * 1e-9;
    out->total_s = (double)(e2e - t0) * 1e-9;
    return CLFFN_SUCCESS;
}
