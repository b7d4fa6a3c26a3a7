/* clffn-run's rooms: main.c (the command line, the one-line reports), ckpt.c (a checkpoint of
 * either format), presets.c (where a checkpoint keeps an FFN layer's tensors), load.c (a layer's
 * weights in the type they go to the device in), checkpoint.c (one layer on one device), demo.c
 * (the demo FFN), moe.c and moe_grads.c (a mixture-of-experts layer), and, built with MPI, tp.c
 * (the layer split over MPI ranks) and ep.c (a mixture-of-experts layer's experts split over
 * them; ranks.h is what the two share). */
#ifndef CLFFN_RUN_H
#define CLFFN_RUN_H

#define CLFFN_HOOKS /* the CPU reference, for --verify and the demo's check */
#include "clffn.h"
#include "clffn_io.h"

#include <stdint.h>

enum { EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

/* ------------------------------------------------------------------------------------------ */
/* Checkpoints (ckpt.c) */

/* A tensor of a safetensors or GGUF file, its shape row-major (outermost first: a matrix is
 * [rows, cols]; GGUF's ne[] reversed). */
typedef struct ckpt_tensor {
    const char *name;
    size_t rank;
    uint64_t shape[CLFFN_IO_MAX_RANK];
    uint64_t numel;
    int keep;           /* its type is one clffn keeps on a device as it is: dtype */
    int readable;       /* its values can be read as f32 */
    clffn_dtype dtype;  /* with keep */
    char type_name[16]; /* the file's name for its type ("F16", "Q4_K") */
    const clffn_st_tensor *st;
    const clffn_gguf_tensor *gg;
} ckpt_tensor;

typedef struct ckpt {
    int gguf;
    clffn_st_file st;
    clffn_gguf_file gg;
    ckpt_tensor *tensors;
    size_t count;
} ckpt;

/* Opens a checkpoint, mapped (GGUF when it starts with GGUF's magic, else safetensors).
 * 0, or -1 with a message in err. */
int ckpt_open(const char *path, ckpt *c, char *err);
void ckpt_close(ckpt *c);
const ckpt_tensor *ckpt_find(const ckpt *c, const char *name);
/* Rows [row0, +rows) × columns [col0, +cols) of a tensor seen as a matrix (a vector is one
 * row), as f32 values or (keep only) as stored bytes; 0, or -1 with a message. */
int ckpt_read_f32(const ckpt *c, const ckpt_tensor *t, uint64_t row0, uint64_t rows, uint64_t col0,
                  uint64_t cols, float *dst, char *err);
int ckpt_read_stored(const ckpt *c, const ckpt_tensor *t, uint64_t row0, uint64_t rows,
                     uint64_t col0, uint64_t cols, void *dst, size_t dst_size, char *err);
int ckpt_read_all_f32(const ckpt *c, const ckpt_tensor *t, float *dst, char *err);

/* ------------------------------------------------------------------------------------------ */
/* Presets and options */

/* Where each tensor of an FFN layer lives in a checkpoint, and the FFN it describes. */
typedef struct preset {
    const char *name;
    const char *w1, *b1, *v, *bv, *w2, *b2; /* printf patterns taking the layer; NULL: none */
    const char *prefixes[3];                /* tried in order before each name */
    clffn_layout layout;
    clffn_activation act;
    int gated; /* 1: always, 0: never, -1: when the V tensor is present */
} preset;

/* The presets, the default first; NULL for an unknown name. */
const preset *run_preset_named(const char *name);
const preset *run_preset_default(void);
/* "annotated, labml, …" for messages */
const char *run_preset_names(void);

/* A mixture-of-experts layout (moe.c): Mixtral's and Qwen-MoE's names. */
typedef struct moe_preset moe_preset;

typedef struct options {
    const char *weights, *input, *output, *device;
    const char *grad_output, *grads_out; /* dy in, gradients out */
    const preset *preset;
    int preset_given;
    int layer;
    int have_act, act_gated, gated_flag;
    clffn_activation act;
    float dropout;
    int train, residual, verify;
    int tensor_parallel, expert_parallel, verbose;
    uint64_t seed;
    int dtype_stored;     /* --weights-dtype stored (the default) */
    clffn_dtype dtype;    /* else the type asked for */
    int quantized_inputs; /* --quantized-inputs (clffn_context_set_quantized_inputs) */
    /* mixture of experts (moe.c) */
    const moe_preset *moe_preset; /* --preset mixtral or qwen_moe */
    uint64_t top_k;               /* --top-k; 0: the file's, else 2 */
    int routing_given;            /* --routing */
    clffn_routing routing;
    const char *router_out;     /* --router-out R.npy */
    const char *expert_devices; /* --expert-devices SPEC,SPEC,…: the experts split in-process */
    int counts_given;           /* --moe-counts */
    clffn_moe_counts counts;    /* where the layer keeps its expert counts (clffn_moe_set_counts) */
    int grouping_given;         /* --moe-grouping */
    int ungrouped;              /* --moe-grouping off: clffn_moe_set_grouping(moe, 0) */
} options;

/* The checkpoint's tensors of one FFN layer, as the preset names them, shapes checked. */
typedef struct layer {
    const preset *preset; /* the options' preset, or GGUF's for a GGUF file */
    const ckpt_tensor *w1, *b1, *v, *bv, *w2, *b2;
    uint64_t F, D;
    int gated;
} layer;

/* ------------------------------------------------------------------------------------------ */
/* Weights (load.c) */

/* A layer's weights (or one rank's slice of them) as they go to the device: the matrices in
 * dtype (f32 values or stored bytes), in layout, the biases f32 (NULL where absent); and the
 * matrices' exact f32 values (the same arrays for f32) for the CPU reference. */
typedef struct loaded {
    clffn_dtype dtype;
    clffn_layout layout;
    void *w1, *v, *w2;
    float *b1, *bv, *b2;
    float *r1, *rv, *r2;
} loaded;

/* The part of each matrix a rank holds: hidden units [f0, f0 + S) (S = F: the whole layer), and
 * b2 or not (only rank 0 adds it). */
typedef struct slice {
    uint64_t f0, S;
    int with_b2;
} slice;

/* The type the matrices go to the device in: the options' choice, or (stored) the file's own
 * when all three are of one type clffn keeps, else f32. */
clffn_dtype run_weights_dtype(const options *o, const layer *L);
/* Reads the slice of the layer in that type (transposing to [out, in] on the host for a
 * quantized type, whose blocks run along the input dimension); with refs, the f32 values too.
 * 0, or -1 (reported). */
int run_load_weights(const options *o, const ckpt *c, const layer *L, const slice *s, int refs,
                     loaded *w);
void run_loaded_free(loaded *w);
/* The host weights for clffn_ffn_upload_weights_typed, and the reference's. */
clffn_typed_weights run_typed(const loaded *w);
clffn_host_weights run_refs(const loaded *w);

/* ------------------------------------------------------------------------------------------ */
/* Reports, presets, the runs */

/* Every failure is one line, "clffn-run: …". A single process prints it at once; a
 * tensor-parallel rank keeps it (run_capture_reports) until the ranks agree on who failed first,
 * and rank 0 prints that one (run_captured_report). */
void run_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void run_capture_reports(void);
const char *run_captured_report(void);
/* Reports "what: status" and returns EXIT_RUNTIME. */
int run_fail(const char *what, clffn_status st);

/* presets.c */
int run_resolve_layer(const options *o, const ckpt *c, layer *L);
clffn_config run_layer_config(const options *o, const layer *L);

/* checkpoint.c */
int run_checkpoint(const options *o);
/* Loads the input (and dy for a backward): x's last dimension must be d_model, dy's shape x's.
 * Returns 0 or -1 (reported). run_load_dy: dy alone, for an x already loaded. */
int run_load_dy(const options *o, const clffn_npy *x, clffn_npy *dy);
int run_load_inputs(const options *o, const layer *L, clffn_npy *x, clffn_npy *dy);
/* Writes the gradients under the checkpoint's own names and dx as 'input': arr[i] holds tensor
 * t[i]'s gradient in its shape, NULL where t[i] is absent or has none (weights kept compressed:
 * named as skipped). 0 or -1 (reported). */
int run_write_grads(const options *o, const ckpt_tensor *const t[6], float *const arr[6],
                    const clffn_npy *x, const float *dx);
/* Opens the device spec names (NULL: the default one); 0 or -1 (reported, a missing platform
 * with what to install). */
int run_open_device(const options *o, const char *spec, clffn_context **ctx);
/* --quantized-inputs on weights of another type than q8_0 and q4_0: a note on stderr that it
 * changes nothing; with --verbose on those types, a line saying it applies. */
void run_note_quantized_inputs(const options *o, clffn_dtype dtype);
/* --expert-devices' list (comma-separated SPECs as --device takes them): the count, 1 to
 * RUN_MAX_DEVICES, or -1 for an empty SPEC or too many. With specs (room for RUN_MAX_DEVICES),
 * each SPEC is copied into specs[i], malloc'd (the caller frees them; -1 when out of memory). */
#define RUN_MAX_DEVICES 64
#define RUN_MAX_DEVICES_TEXT "64"
int run_device_list(const char *list, char **specs);

/* The run's device, shapes, time and GFLOP/s; split is appended to the FFN line. */
void run_print(clffn_context *ctx, const layer *L, const clffn_config *c, size_t T, double dt,
               const char *split);

/* The layer's tensors: the router [E, D]; per expert (or stacked, GGUF) gate and up [F, D] and
 * down [D, F]; the shared expert's (gate and up [Fs, D], down [D, Fs]) and its sigmoid gate
 * ([1, D] or [D]: the router's row E on the device). */
typedef struct moe_layer {
    const moe_preset *p;
    int stacked;
    const ckpt_tensor *router, *shared[3], *shared_gate;
    const ckpt_tensor **m; /* [3·E]: gate, up, down of expert e at 3e …; stacked: [3] */
    size_t E, k, D, F, Fs;
    clffn_routing routing; /* the file's (the preset's, or GGUF's for its architecture) */
} moe_layer;

/* The router's rows on the device: E, + 1 for the shared expert's gate. */
static inline size_t moe_router_rows(const moe_layer *L) { return L->E + (L->shared_gate ? 1 : 0); }

/* A layer whose other experts are in other processes (ep.c): how many ranks, and how their
 * experts' gradients reach this one (into all[e] for each expert held elsewhere; 0, or -1
 * reported). */
typedef struct moe_away {
    int ranks;
    int (*collect)(void *user, int matrices, const clffn_weight_arrays *all);
    void *user;
} moe_away;

/* moe_grads.c: --grad-output for a layer that has run forward on x: dy in, the gradients of the
 * router and of every expert matrix kept in f32 (the experts' tensors' own names; a GGUF file's
 * stacked tensors restacked; away's from their ranks) and 'input' written to --grads-out. 0 or
 * -1 (reported). */
int run_moe_backward(const options *o, const moe_layer *L, clffn_moe *moe, const clffn_npy *x,
                     const clffn_npy *dy, const moe_away *away);

/* moe.c: the MoE preset of that name, or NULL; the checkpoint's MoE layout for the options
 * (their preset, or a GGUF layer with a router), or NULL for a dense FFN; the layer's run (the
 * exit status). */
const moe_preset *run_moe_preset_named(const char *name);
const moe_preset *run_moe_of(const options *o, const ckpt *c);
int run_moe(const options *o, const ckpt *c);

/* moe.c's steps, for ep.c: the layer's tensors found and checked; the input [..., d_model]
 * (and dy, the output's shape, for --grad-output); the layer's config; the type the experts go
 * to the device in (the options' choice, or the file's own where every expert matrix is of one
 * type clffn keeps, else f32); the experts onto their FFNs (the layer's, or with moe NULL the
 * holder's; those held elsewhere are not read; refs: their f32 values, kept for --verify);
 * and the layer's run on the device (forward printed, verified, routing, gradients and output
 * written; away: NULL, or where the other experts are). Each 0 or -1 (reported). */
int run_moe_resolve(const options *o, const ckpt *c, moe_layer *L);
int run_moe_load_input(const options *o, const moe_layer *L, clffn_npy *x, clffn_npy *dy);
clffn_moe_config run_moe_config(const options *o, const moe_layer *L);
clffn_dtype run_moe_dtype(const options *o, const moe_layer *L);
int run_moe_upload(const options *o, const ckpt *c, const moe_layer *L, clffn_moe *moe,
                   clffn_moe_holder *h, clffn_dtype dtype, float **refs);
/* moe_devices.c: the layer's contexts into ctx (room for RUN_MAX_DEVICES; the caller destroys
 * them): --device's, or one for each --expert-devices SPEC; their count, or -1 (reported). With
 * --verbose, each context's experts and weight bytes (the router on the first). */
int run_moe_open_devices(const options *o, clffn_context **ctx);
void run_moe_print_weights(const moe_layer *L, clffn_moe *moe, clffn_context *const *ctx, int n);
int run_moe_layer(const options *o, const moe_layer *L, clffn_moe *moe, const clffn_moe_config *mc,
                  const float *router, float *const *refs, const clffn_npy *x, const clffn_npy *dy,
                  const moe_away *away);

/* demo.c: the demo FFN on device (NULL: the default one); the exit status. */
int run_demo(const char *device);

/* tp.c, built with MPI: the layer split over the ranks of MPI_COMM_WORLD (MPI initialised);
 * the exit status. ep.c, likewise: a mixture-of-experts layer's experts split over them. */
int run_tensor_parallel(const options *o);
int run_expert_parallel(const options *o);

#endif
