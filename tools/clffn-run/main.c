/* clffn-run: runs a position-wise FFN with clffn.
 *
 *   clffn-run                       the demo (demo.c), checked against the CPU reference
 *   clffn-run --weights W.safetensors --input X.npy --output Y.npy [options]
 *                                   the FFN held in a checkpoint (checkpoint.c), on an input of
 *                                   any rank [..., d_model]; the output keeps the leading shape
 *   mpirun -np N clffn-run --tensor-parallel --weights … --input … --output …
 *                                   the same, the layer split over N ranks (tp.c)
 *   mpirun -np N clffn-run --expert-parallel --weights … --input … --output …
 *                                   a mixture-of-experts layer, its experts over N ranks (ep.c)
 *   clffn-run --expert-devices 0:0,0:1 --weights … --input … --output …
 *                                   the same in one process, over the devices listed (moe.c)
 *
 * Exit status: 0 success, 1 device or runtime failure (or --verify beyond tolerance), 2 usage
 * error or bad input file. Every failure prints one line naming the file and what is wrong. */
#include "run.h"
#include "common.h"
#include "options.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifdef CLFFN_HAVE_MPI
#include <mpi.h>
#endif

static int captured;
static char captured_msg[512];

void run_report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (captured) {
        if (!captured_msg[0]) { vsnprintf(captured_msg, sizeof captured_msg, fmt, ap); }
    } else {
        fputs("clffn-run: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
    }
    va_end(ap);
}

void run_capture_reports(void) { captured = 1; }
const char *run_captured_report(void) { return captured_msg; }

int run_fail(const char *what, clffn_status st) {
    run_report("%s: %s", what, clffn_status_string(st));
    return EXIT_RUNTIME;
}

/* ------------------------------------------------------------------------------------------ */
/* The command line */

enum {
    OPT_WEIGHTS = 256,
    OPT_INPUT,
    OPT_OUTPUT,
    OPT_PRESET,
    OPT_LAYER,
    OPT_ACTIVATION,
    OPT_GATED,
    OPT_DROPOUT,
    OPT_TRAIN,
    OPT_SEED,
    OPT_RESIDUAL,
    OPT_DEVICE,
    OPT_VERIFY,
    OPT_GRAD_OUTPUT,
    OPT_GRADS_OUT,
    OPT_TENSOR_PARALLEL,
    OPT_EXPERT_PARALLEL,
    OPT_VERBOSE,
    OPT_WEIGHTS_DTYPE,
    OPT_QUANTIZED_INPUTS,
    OPT_TOP_K,
    OPT_ROUTING,
    OPT_ROUTER_OUT,
    OPT_EXPERT_DEVICES,
    OPT_MOE_COUNTS,
    OPT_MOE_GROUPING,
};

static const tool_option OPTIONS[] = {
    {"weights", OPT_WEIGHTS, TOOL_VALUE, "W.safetensors",
     "the checkpoint: safetensors, or GGUF (llama.cpp's files,\nfound by their magic)"},
    {"weights-dtype", OPT_WEIGHTS_DTYPE, TOOL_VALUE, "TYPE",
     "keep the weights on the device as stored (default: F16, BF16,\nQ8_0, Q4_0 as they are, "
     "others f32), or as f32, f16, bf16,\nq8_0 or q4_0 (converted on the host, GGUF's "
     "rounding)"},
    {"quantized-inputs", OPT_QUANTIZED_INPUTS, TOOL_FLAG, NULL,
     "round the inputs of q8_0 and q4_0 products to q8_0 first (of\nbf16 ones to bf16), as "
     "llama.cpp does: faster for few\ntokens, less exact"},
    {"input", OPT_INPUT, TOOL_VALUE, "X.npy", "the input, [..., d_model]"},
    {"output", OPT_OUTPUT, TOOL_VALUE, "Y.npy", "where the output goes (same shape)"},
    {"preset", OPT_PRESET, TOOL_VALUE, "NAME",
     "tensor names and defaults: annotated (default), labml, gpt2,\nbert, llama; mixtral and "
     "qwen_moe (mixture-of-experts layers)"},
    {"top-k", OPT_TOP_K, TOOL_VALUE, "K",
     "experts per token of a mixture-of-experts layer (default:\nthe GGUF file's "
     "expert_used_count, else 2)"},
    {"routing", OPT_ROUTING, TOOL_VALUE, "MODE",
     "normalized (the k weights sum to 1: mixtral's, GGUF's) or\ntopk (as the softmax gives "
     "them: qwen_moe's)"},
    {"router-out", OPT_ROUTER_OUT, TOOL_VALUE, "R.npy",
     "each token's chosen experts and weights, [..., k, 2]"},
    {"moe-counts", OPT_MOE_COUNTS, TOOL_VALUE, "WHERE",
     "where a mixture-of-experts layer keeps its expert counts:\ndevice "
     "(default), host (only the chosen experts run) or\nauto (host where some expert must go "
     "unchosen)"},
    {"moe-grouping", OPT_MOE_GROUPING, TOOL_VALUE, "on|off",
     "with the counts on the device, run the experts grouped, a launch\na stage for all of them "
     "(on, the default), or one at a time\n(clffn_moe_set_grouping)"},
    {"layer", OPT_LAYER, TOOL_VALUE, "L", "layer index for gpt2, bert and llama (default 0)"},
    {"activation", OPT_ACTIVATION, TOOL_VALUE, "NAME",
     "relu, gelu, gelu_tanh, silu, sigmoid, identity, or a GLU name\n(glu, reglu, geglu, "
     "swiglu, bilinear), overriding the preset"},
    {"gated", OPT_GATED, TOOL_FLAG, NULL, "use the gate (needs the preset's V tensor)"},
    {"dropout", OPT_DROPOUT, TOOL_VALUE, "P",
     "dropout probability on the hidden layer (default 0)"},
    {"train", OPT_TRAIN, TOOL_FLAG, NULL, "training mode: apply dropout"},
    {"seed", OPT_SEED, TOOL_VALUE, "S", "dropout seed (default 0)"},
    {"residual", OPT_RESIDUAL, TOOL_FLAG, NULL, "y = FFN(x) + x"},
    {"device", OPT_DEVICE, TOOL_VALUE, "SPEC",
     "\"platform:device\" or a name substring (default: CLFFN_DEVICE,\nelse the device "
     "clffn-devices marks as the default)"},
    {"verify", OPT_VERIFY, TOOL_FLAG, NULL, "compare with the CPU reference and print the error"},
    {"grad-output", OPT_GRAD_OUTPUT, TOOL_VALUE, "DY.npy",
     "backward pass for dL/dy = DY (the output's shape), with --grads-out"},
    {"grads-out", OPT_GRADS_OUT, TOOL_VALUE, "G.safetensors",
     "the gradient of every weight tensor under its own name, and\n'input' for dL/dx"},
    {"tensor-parallel", OPT_TENSOR_PARALLEL, TOOL_FLAG, NULL,
     "under mpirun: split the layer's hidden units over the ranks,\neach reading only its "
     "slice; rank 0 writes the output (and\ngradients)"},
    {"expert-parallel", OPT_EXPERT_PARALLEL, TOOL_FLAG, NULL,
     "under mpirun: split a mixture-of-experts layer's experts over\nthe ranks, each reading "
     "only its own; rank 0 routes, combines\nand writes the output (and gradients)"},
    {"expert-devices", OPT_EXPERT_DEVICES, TOOL_VALUE, "LIST",
     "split a mixture-of-experts layer's experts over these devices\nin this process (SPECs as "
     "--device takes them, comma-separated;\na device may repeat); the first routes and "
     "combines"},
    {"verbose", OPT_VERBOSE, TOOL_FLAG, NULL,
     "the weights' bytes on the device and their type; with\n--tensor-parallel, "
     "--expert-parallel or --expert-devices each\nrank's or device's part and memory"},
    {0},
};

static const tool_cli CLI = {
    "clffn-run",
    "[--device SPEC]        the demo FFN, checked against the CPU reference\n"
    "--weights W.safetensors --input X.npy --output Y.npy [options]",
    "safetensors weights may be F32, F16, BF16 or F64; GGUF's F32, F16, BF16, Q8_0 or Q4_0 (a\n"
    "GGUF layer is blk.L.ffn_gate/up/down: SwiGLU, or up and down alone: a plain FFN);\n"
    "inputs '<f4', '<f8' or '<f2'.\n"
    "Exit status: 0 success, 1 device or runtime failure, 2 usage error or bad input file.\n",
    OPTIONS,
};

/* A refused value: its line ("clffn-run: " and fmt with the value), then -1. */
static int refuse(const char *fmt, const char *val) __attribute__((format(printf, 1, 0)));
static int refuse(const char *fmt, const char *val) {
    fputs("clffn-run: ", stderr);
    fprintf(stderr, fmt, val);
    fputc('\n', stderr);
    return -1;
}

/* --moe-counts: 0, or -1 with the refusal printed. */
static int take_moe_counts(const char *val, options *o) {
    if (tool_parse_moe_counts(val, &o->counts) != 0) {
        return refuse("--moe-counts takes device, host or auto, not '%s'", val);
    }
    o->counts_given = 1;
    return 0;
}

/* --moe-grouping: 0, or -1 with the refusal printed. */
static int take_moe_grouping(const char *val, options *o) {
    int on;
    if (tool_parse_on_off(val, &on) != 0) {
        return refuse("--moe-grouping takes on or off, not '%s'", val);
    }
    o->grouping_given = 1, o->ungrouped = !on;
    return 0;
}

/* One option's value into o: 0, or -1 with the refusal printed. */
static int take_option(int key, const char *val, options *o) {
    uint64_t v;
    double p;
    switch (key) {
    case OPT_WEIGHTS: o->weights = val; break;
    case OPT_INPUT: o->input = val; break;
    case OPT_OUTPUT: o->output = val; break;
    case OPT_DEVICE: o->device = val; break;
    case OPT_GRAD_OUTPUT: o->grad_output = val; break;
    case OPT_GRADS_OUT: o->grads_out = val; break;
    case OPT_GATED: o->gated_flag = 1; break;
    case OPT_TRAIN: o->train = 1; break;
    case OPT_RESIDUAL: o->residual = 1; break;
    case OPT_VERIFY: o->verify = 1; break;
    case OPT_TENSOR_PARALLEL: o->tensor_parallel = 1; break;
    case OPT_EXPERT_PARALLEL: o->expert_parallel = 1; break;
    case OPT_VERBOSE: o->verbose = 1; break;
    case OPT_QUANTIZED_INPUTS: o->quantized_inputs = 1; break;
    case OPT_PRESET:
        if ((o->moe_preset = run_moe_preset_named(val))) { break; }
        if (!(o->preset = run_preset_named(val))) {
            fprintf(stderr, "clffn-run: unknown preset '%s' (%s, mixtral, qwen_moe)\n", val,
                    run_preset_names());
            return -1;
        }
        o->preset_given = 1;
        break;
    case OPT_TOP_K:
        if (tool_parse_u64(val, 1, 1u << 24, &o->top_k) != 0) {
            return refuse("--top-k needs a positive integer, not '%s'", val);
        }
        break;
    case OPT_ROUTING:
        if (strcmp(val, "normalized") && strcmp(val, "topk")) {
            return refuse("--routing takes normalized or topk, not '%s'", val);
        }
        o->routing_given = 1;
        o->routing = strcmp(val, "topk") ? CLFFN_ROUTING_TOPK_NORMALIZED : CLFFN_ROUTING_TOPK;
        break;
    case OPT_ROUTER_OUT: o->router_out = val; break;
    case OPT_MOE_COUNTS: return take_moe_counts(val, o);
    case OPT_MOE_GROUPING: return take_moe_grouping(val, o);
    case OPT_EXPERT_DEVICES: o->expert_devices = val; break;
    case OPT_WEIGHTS_DTYPE:
        o->dtype_stored = !strcmp(val, "stored");
        if (!o->dtype_stored && clffn_dtype_parse(val, &o->dtype) != CLFFN_SUCCESS) {
            return refuse("--weights-dtype takes stored, f32, f16, bf16, q8_0 or q4_0, not '%s'",
                          val);
        }
        break;
    case OPT_LAYER:
        if (tool_parse_u64(val, 0, 1000000, &v) != 0) {
            return refuse("--layer needs a non-negative integer, not '%s'", val);
        }
        o->layer = (int)v;
        break;
    case OPT_ACTIVATION:
        if (clffn_activation_parse(val, &o->act, &o->act_gated) != CLFFN_SUCCESS) {
            return refuse("unknown activation '%s'", val);
        }
        o->have_act = 1;
        break;
    case OPT_DROPOUT:
        if (tool_parse_double(val, 0.0, 1.0, &p) != 0) {
            return refuse("--dropout needs a probability in [0, 1], not '%s'", val);
        }
        o->dropout = (float)p;
        break;
    case OPT_SEED:
        if (tool_parse_u64(val, 0, UINT64_MAX, &o->seed) != 0) {
            return refuse("--seed needs a non-negative integer, not '%s'", val);
        }
        break;
    default: return -1;
    }
    return 0;
}

/* The options that go together, or only with a checkpoint: 0, or -1 with the refusal printed. */
static int check_options(const options *o) {
    const int ckpt_only = o->have_act || o->gated_flag || o->dropout > 0.0f || o->train ||
                          o->seed || o->residual || o->verify || o->layer || o->grad_output ||
                          o->grads_out || o->preset != run_preset_default() || o->tensor_parallel ||
                          o->expert_parallel || o->verbose || o->moe_preset || o->top_k ||
                          o->routing_given || o->router_out || o->expert_devices ||
                          o->quantized_inputs || o->counts_given || o->grouping_given;
    const char *why = NULL;
    if (!o->weights && ckpt_only) {
        why = "these options apply to --weights runs (the demo takes only --device)";
    } else if (!o->grad_output != !o->grads_out) {
        why = "--grad-output and --grads-out go together";
    } else if ((o->weights || o->input || o->output) && !(o->weights && o->input && o->output)) {
        why = "--weights, --input and --output go together";
    } else if (o->tensor_parallel && (o->moe_preset || o->top_k || o->router_out ||
                                      o->counts_given || o->grouping_given)) {
        why = "--tensor-parallel splits a dense FFN; a mixture-of-experts layer runs on one device";
    } else if ((o->tensor_parallel || o->expert_parallel) && o->verify) {
        why = "--verify needs the whole layer; run it without --tensor-parallel or "
              "--expert-parallel";
    } else if (o->expert_devices && run_device_list(o->expert_devices, NULL) < 1) {
        why = "--expert-devices takes device SPECs separated by commas, none empty, at "
              "most " RUN_MAX_DEVICES_TEXT;
    } else if (o->expert_devices && (o->tensor_parallel || o->expert_parallel)) {
        why = "--expert-devices splits the experts in this process; --tensor-parallel and "
              "--expert-parallel split over MPI ranks: take one";
    } else if (o->expert_devices && o->device) {
        why = "--expert-devices names the layer's devices: leave out --device";
    } else if (o->quantized_inputs && o->verify) {
        why = "--verify compares with the reference on x itself; --quantized-inputs rounds the "
              "inputs first, so it would not pass: take one";
    } else if (o->tensor_parallel && o->expert_parallel) {
        why = "--tensor-parallel and --expert-parallel split a layer two ways: take one";
    }
    if (why) { fprintf(stderr, "clffn-run: %s\n", why); }
    return why ? -1 : 0;
}

/* The options into o: -1 to run, else the exit status (0 after --help, 2 after a refusal). */
static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->preset = run_preset_default();
    o->dtype_stored = 1;
    tool_parser p = tool_parser_start(&CLI, argc, argv);
    for (int key; (key = tool_next(&p)) > 0;) {
        if (take_option(key, p.value, o) != 0) { return tool_usage_error(&CLI); }
    }
    if (p.status >= 0) { return p.status; }
    return check_options(o) == 0 ? -1 : tool_usage_error(&CLI);
}

static int tool_main(int argc, char **argv) {
    options o;
    const int rc = parse_args(argc, argv, &o);
    if (rc >= 0) { return rc; }
    if (!o.weights) { return run_demo(o.device); }
    if (!o.tensor_parallel && !o.expert_parallel) { return run_checkpoint(&o); }
#ifdef CLFFN_HAVE_MPI
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fprintf(stderr, "clffn-run: MPI_Init failed\n");
        return EXIT_RUNTIME;
    }
    const int tp = o.expert_parallel ? run_expert_parallel(&o) : run_tensor_parallel(&o);
    MPI_Finalize();
    return tp;
#else
    fprintf(stderr,
            "clffn-run: --%s-parallel needs MPI, and this clffn-run was built "
            "without it (install libopenmpi-dev and rebuild)\n",
            o.expert_parallel ? "expert" : "tensor");
    return EXIT_USAGE;
#endif
}

int main(int argc, char **argv) { return tool_exit("clffn-run", tool_main(argc, argv)); }
