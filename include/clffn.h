/*
 * clffn — the Transformer's position-wise feed-forward network on any OpenCL device.
 *
 *   plain:  y = act(x·W1 + b1)·W2 + b2                         (+ x with residual)
 *   gated:  y = (act(x·W1 + b1) ⊙ (x·V + bv))·W2 + b2           (GLU family)
 *
 * applied to every row of x. Shapes, used throughout this header:
 *
 *   T = tokens (batch × seq), D = d_model, F = d_ff
 *   x, y      [T, D]           row-major floats
 *   W1, V     [F, D] (CLFFN_LAYOUT_OUT_IN, as torch.nn.Linear stores them)
 *             [D, F] (CLFFN_LAYOUT_IN_OUT, as numpy and GPT-2's Conv1D do)
 *   W2        [D, F] (OUT_IN) or [F, D] (IN_OUT)
 *   b1, bv    [F]      b2  [D]
 *   hidden    [T, F]
 *
 * Both projections are CLBlast SGEMMs; bias, activation, gating and dropout are clffn's own
 * OpenCL kernels, fused into one pass over the hidden tensor.
 *
 * Two ways in:
 *   - device level: bring your cl_context, cl_command_queue and cl_mem buffers; clffn_forward()
 *     enqueues and returns at once with an optional event, like a CLBlast routine.
 *   - host level: clffn_context_create_default() owns context and queue; clffn_forward_host()
 *     takes and returns float arrays.
 *
 * Errors: every function returns a clffn_status. Negative values from OpenCL (and CLBlast) are
 * passed through unchanged; clffn's own codes sit in the range CLFFN_ERROR_BASE and below.
 * A failing call leaves the caller's outputs untouched.
 *
 * Threads: a clffn_context may be shared between threads (tested: 8 threads × 100 forwards,
 * host level and device level with a queue each, results bit-identical to one thread's). A
 * clffn_ffn may not be used from two threads at once: it owns kernel arguments and a workspace
 * that a second caller would overwrite while the first one's commands still read them. Give
 * each thread its own clffn_ffn; they can bind the same device weights
 * (clffn_ffn_bind_weights) so the weights are stored once.
 *
 * NaN and Inf propagate as IEEE arithmetic on the formulas says: relu(NaN) is NaN, dropout
 * multiplies by 0 (a dropped NaN stays NaN, as in PyTorch), nothing is clamped.
 *
 * This header is the stable API. clffn's tools and tests also use a few hooks (its SGEMM path,
 * the dropout generator, the CPU reference); they are declared at the end, only where
 * CLFFN_HOOKS is defined before this header is included, and may change in any release.
 */
#ifndef CLFFN_H
#define CLFFN_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(CLFFN_BUILDING_DLL)
#define CLFFN_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define CLFFN_API __attribute__((visibility("default")))
#else
#define CLFFN_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */
#define CLFFN_VERSION_MAJOR 0
#define CLFFN_VERSION_MINOR 1
#define CLFFN_VERSION_PATCH 0
#define CLFFN_VERSION_NUMBER \
    (CLFFN_VERSION_MAJOR * 10000 + CLFFN_VERSION_MINOR * 100 + CLFFN_VERSION_PATCH)
#define CLFFN_STRINGIFY_(x) #x
#define CLFFN_STRINGIFY(x) CLFFN_STRINGIFY_(x)
#define CLFFN_VERSION_STRING             \
    CLFFN_STRINGIFY(CLFFN_VERSION_MAJOR) \
    "." CLFFN_STRINGIFY(CLFFN_VERSION_MINOR) "." CLFFN_STRINGIFY(CLFFN_VERSION_PATCH)

/** The library's CLFFN_VERSION_NUMBER, to detect a header/library mismatch at run time. */
CLFFN_API unsigned clffn_version_number(void);
/** The library's version as "MAJOR.MINOR.PATCH"; a static string. */
CLFFN_API const char *clffn_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status
 * ------------------------------------------------------------------------------------------- */
/** Every call's result. 0 is success; OpenCL's negative codes (CL_OUT_OF_RESOURCES = -5, the ICD
 *  loader's CL_PLATFORM_NOT_FOUND_KHR = -1001, …) and CLBlast's (-1024…-1007, -2050…-2040) pass
 *  through unchanged, so a value may be outside the names listed here. */
typedef enum clffn_status {
    CLFFN_SUCCESS = 0,
    CLFFN_PLATFORM_NOT_FOUND = -1001, /* no OpenCL platform installed (install pocl-opencl-icd) */

    CLFFN_ERROR_BASE = -4096,
    CLFFN_ERROR_NULL_ARGUMENT = -4096,      /* a required pointer or handle is NULL */
    CLFFN_ERROR_INVALID_SIZE = -4097,       /* a size is zero, or above its documented limit */
    CLFFN_ERROR_SIZE_OVERFLOW = -4098,      /* a size overflows size_t or the device's max alloc */
    CLFFN_ERROR_BUFFER_TOO_SMALL = -4099,   /* an array or cl_mem is shorter than the shape needs */
    CLFFN_ERROR_INVALID_DROPOUT = -4100,    /* dropout p is not in [0, 1] (or is NaN) */
    CLFFN_ERROR_INVALID_ACTIVATION = -4101, /* unknown clffn_activation value or name */
    CLFFN_ERROR_INVALID_LAYOUT = -4102,     /* unknown clffn_layout value */
    CLFFN_ERROR_INVALID_ARGUMENT = -4103,   /* another argument out of range (see the function) */
    CLFFN_ERROR_DEVICE_NOT_FOUND = -4104,   /* CLFFN_DEVICE or the given spec matched no device */
    CLFFN_ERROR_DEVICE_UNSUPPORTED = -4105, /* device lacks OpenCL 1.2 or an online compiler */
    CLFFN_ERROR_NO_WEIGHTS = -4106,         /* forward before weights were uploaded or bound */
    CLFFN_ERROR_INVALID_QUEUE = -4107,      /* queue of another context/device, or out-of-order */
    CLFFN_ERROR_KERNEL_SOURCE = -4108,      /* a .cl file under CLFFN_KERNEL_DIR can't be read */
    CLFFN_ERROR_NO_FORWARD = -4109,         /* hidden tensor asked for before any forward */
    CLFFN_ERROR_BUFFER_OVERLAP = -4110,     /* y partly overlaps x (equal is fine, partly is not) */
    CLFFN_ERROR_OUT_OF_HOST_MEMORY = -4111, /* malloc failed in clffn's own code */
    CLFFN_ERROR_CONTEXT_ALIVE = -4112,      /* clffn_release_all while a context still exists */
    CLFFN_ERROR_COMPRESSED_WEIGHTS = -4113, /* a gradient asked of weights kept compressed */
    CLFFN_ERROR_PROFILING_TIMES = -4114     /* the device's event timestamps are unusable */
} clffn_status;

/** A static, human-readable name for any status, OpenCL's and CLBlast's included
 *  ("CL_OUT_OF_RESOURCES", "CLFFN_ERROR_BUFFER_TOO_SMALL: …"). Never NULL. */
CLFFN_API const char *clffn_status_string(int status);

/* ---------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------- */
/** The hidden activation. With gated = 1 they give the GLU family:
 *  GLU = sigmoid, ReGLU = relu, GEGLU = gelu, SwiGLU = silu, bilinear = identity. */
typedef enum clffn_activation {
    CLFFN_ACT_RELU = 0,      /* max(0, x); NaN stays NaN */
    CLFFN_ACT_GELU = 1,      /* x·Φ(x) = 0.5·x·(1 + erf(x/√2)), exact */
    CLFFN_ACT_GELU_TANH = 2, /* 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) */
    CLFFN_ACT_SILU = 3,      /* x·σ(x), a.k.a. swish */
    CLFFN_ACT_SIGMOID = 4,   /* σ(x) = 1/(1 + e^−x) */
    CLFFN_ACT_IDENTITY = 5,  /* x */
    CLFFN_ACT_COUNT_ = 6
} clffn_activation;

/** How a weight matrix is stored (see the shape legend at the top). */
typedef enum clffn_layout {
    CLFFN_LAYOUT_OUT_IN = 0, /* [out, in]: torch.nn.Linear.weight */
    CLFFN_LAYOUT_IN_OUT = 1  /* [in, out]: numpy x @ W, GPT-2 Conv1D */
} clffn_layout;

/** What an FFN computes. Defaults (clffn_config_default) follow labml's FeedForward and the
 *  PyTorch and numpy position-wise FFNs it is usually met in: ReLU, not gated, all biases on,
 *  dropout 0.1, no residual. */
typedef struct clffn_config {
    size_t d_model;              /* D, > 0 */
    size_t d_ff;                 /* F, > 0 */
    clffn_activation activation; /* hidden activation */
    int gated;                   /* 1: hidden = act(x·W1 + b1) ⊙ (x·V + bv) */
    int bias1;                   /* 1: add b1 (the first layer's bias) */
    int bias2;                   /* 1: add b2 (the second layer's bias) */
    int bias_gate;               /* 1: add bv (the gate's bias; gated only) */
    float dropout;               /* p in [0, 1]; used only in training mode */
    int residual;                /* 1: y = FFN(x) + x (a sublayer's "output + x") */
} clffn_config;

/** A config with the defaults above for the given dimensions. */
CLFFN_API clffn_config clffn_config_default(size_t d_model, size_t d_ff);

/** Checks a config: NULL → CLFFN_ERROR_NULL_ARGUMENT, zero dims → CLFFN_ERROR_INVALID_SIZE,
 *  weights too large for size_t → CLFFN_ERROR_SIZE_OVERFLOW, p outside [0, 1] or NaN →
 *  CLFFN_ERROR_INVALID_DROPOUT, unknown activation → CLFFN_ERROR_INVALID_ACTIVATION. */
CLFFN_API clffn_status clffn_config_validate(const clffn_config *config);

/** Lower-case name of an activation ("relu", "gelu", "gelu_tanh", "silu", "sigmoid",
 *  "identity"), or NULL for an unknown value. */
CLFFN_API const char *clffn_activation_name(clffn_activation activation);

/** Parses an activation name, case-insensitively: the six names above, "swish" for silu,
 *  "linear" for identity, and the GLU names "glu", "reglu", "geglu", "swiglu", "bilinear",
 *  which also set *gated to 1 (otherwise *gated is set to 0). gated may be NULL.
 *  Unknown name → CLFFN_ERROR_INVALID_ACTIVATION; NULL name/out → CLFFN_ERROR_NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_activation_parse(const char *name, clffn_activation *out, int *gated);

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */
/** Host weight arrays, shapes as in the legend. A bias may be NULL when its flag is off
 *  (it is ignored then); v and bv are used only by gated FFNs. */
typedef struct clffn_host_weights {
    const float *w1; /* [F, D] or [D, F] */
    const float *b1; /* [F] */
    const float *v;  /* [F, D] or [D, F], gated only */
    const float *bv; /* [F], gated only */
    const float *w2; /* [D, F] or [F, D] */
    const float *b2; /* [D] */
} clffn_host_weights;

/** A view of part of a cl_mem: offset counted in floats, as in CLBlast. */
typedef struct clffn_buffer {
    cl_mem mem;
    size_t offset;
} clffn_buffer;

/** Caller-owned device weights for clffn_ffn_bind_weights(); shapes as in the legend.
 *  For a gated FFN either pass V separately (two SGEMMs for the first projection), or set
 *  v.mem = NULL and store W1 and V stacked in w1 — [2F, D] with W1's rows first (OUT_IN), or
 *  [D, 2F] with each row holding W1's F values then V's (IN_OUT) — which runs one SGEMM over
 *  both, reading x once. Biases with their flag off may have mem = NULL. */
typedef struct clffn_device_weights {
    clffn_buffer w1;
    clffn_buffer b1;
    clffn_buffer v;
    clffn_buffer bv;
    clffn_buffer w2;
    clffn_buffer b2;
} clffn_device_weights;

/** Weight initialisers. */
typedef enum clffn_init {
    /* torch.nn.Linear: weights and biases uniform in ±1/√fan_in (fan_in = D for W1, V; F for W2) */
    CLFFN_INIT_TORCH_LINEAR = 0,
    /* the common numpy FFN's: weights randn·0.01, biases zero */
    CLFFN_INIT_NUMPY_RANDN = 1
} clffn_init;

/** Mutable host weight arrays filled by clffn_init_weights_host(); shapes as in the legend. */
typedef struct clffn_weight_arrays {
    float *w1, *b1, *v, *bv, *w2, *b2;
} clffn_weight_arrays;

/** Fills host arrays with initial weights from a seed, deterministically on every machine.
 *  Arrays whose flag is off (or v/bv for a plain FFN) may be NULL and are skipped. Matrices are
 *  written in `layout`. Errors: NULL config/out or a needed array NULL → NULL_ARGUMENT; bad
 *  config → its validate status; unknown scheme → INVALID_ARGUMENT; bad layout → INVALID_LAYOUT. */
CLFFN_API clffn_status clffn_init_weights_host(const clffn_config *config, clffn_init scheme,
                                               uint64_t seed, clffn_layout layout,
                                               const clffn_weight_arrays *out);

/* ---------------------------------------------------------------------------------------------
 * Weight types: the bytes users store weights in, kept as they are on the device
 * ------------------------------------------------------------------------------------------- */
/** The element types W1, V and W2 may be kept in. Biases, activations, accumulation and
 *  outputs are always f32. The quantized types are GGUF's: blocks of 32 consecutive values along
 *  the input dimension, so a matrix of them is [out, in] (CLFFN_LAYOUT_OUT_IN) with in a
 *  multiple of 32, each row ⌈in/32⌉ blocks, exactly as llama.cpp stores it. */
typedef enum clffn_dtype {
    CLFFN_DTYPE_F32 = 0,  /* IEEE binary32 */
    CLFFN_DTYPE_F16 = 1,  /* IEEE binary16 (torch.float16) */
    CLFFN_DTYPE_BF16 = 2, /* bfloat16: a binary32's upper 16 bits (torch.bfloat16) */
    CLFFN_DTYPE_Q8_0 = 3, /* 34-byte blocks: f16 scale d, 32 × int8 q; value d·q */
    CLFFN_DTYPE_Q4_0 = 4, /* 18-byte blocks: f16 d, 16 bytes; value j of the block is the low
                           * nibble q of byte j (j < 16) or the high nibble of byte j − 16,
                           * and equals d·(q − 8) */
    CLFFN_DTYPE_COUNT_ = 5
} clffn_dtype;

/** Values per block of a type (32 for q8_0 and q4_0, 1 for the others). */
#define CLFFN_QK 32

/** Lower-case name: "f32", "f16", "bf16", "q8_0", "q4_0"; NULL for an unknown value. */
CLFFN_API const char *clffn_dtype_name(clffn_dtype dtype);

/** Parses a name above, case-insensitively. Errors: NULL_ARGUMENT, INVALID_ARGUMENT (unknown). */
CLFFN_API clffn_status clffn_dtype_parse(const char *name, clffn_dtype *out);

/** Bytes of n values in dtype (n·4, n·2, or n/32 blocks of 34 or 18 bytes) into *bytes.
 *  Errors: NULL_ARGUMENT; INVALID_ARGUMENT for an unknown dtype, or a quantized one with n not
 *  a multiple of 32; SIZE_OVERFLOW. */
CLFFN_API clffn_status clffn_dtype_bytes(clffn_dtype dtype, size_t n, size_t *bytes);

/** Converts n float32 values, in storage order, to dtype: f16 and bf16 round to nearest even
 *  (NaN stays a quiet NaN, overflow becomes ±inf for f16); q8_0 and q4_0 round exactly as GGUF's
 *  reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) do, value for value and
 *  bit for bit, each run of 32 values one block, so a row-major [out, in] matrix converts to
 *  GGUF's layout. dst_bytes must be ≥ clffn_dtype_bytes(dtype, n). f32 copies. Errors:
 *  NULL_ARGUMENT; INVALID_ARGUMENT (unknown dtype; quantized with n not a multiple of 32, or a
 *  non-finite value in src, for which GGUF's reference has no defined result);
 *  BUFFER_TOO_SMALL; SIZE_OVERFLOW. dst is written only on success. */
CLFFN_API clffn_status clffn_convert_weights(clffn_dtype dtype, const float *src, size_t n,
                                             void *dst, size_t dst_bytes);

/** The other way: n values in dtype (storage order, as above) to float32, exactly (every
 *  value of every type is a float32). Errors: NULL_ARGUMENT; INVALID_ARGUMENT (unknown dtype,
 *  or quantized with n not a multiple of 32); BUFFER_TOO_SMALL when src_bytes or dst_len is
 *  short. */
CLFFN_API clffn_status clffn_convert_to_f32(clffn_dtype dtype, const void *src, size_t src_bytes,
                                            size_t n, float *dst, size_t dst_len);

/* ---------------------------------------------------------------------------------------------
 * Context: one OpenCL device, the compiled kernels, and an internal in-order queue
 * ------------------------------------------------------------------------------------------- */
typedef struct clffn_context clffn_context;

/** Wraps the caller's context and device (both retained, released by destroy). clffn creates
 *  one internal queue on them for uploads and blocking reads; forwards run on the caller's
 *  queue. Errors: NULL → NULL_ARGUMENT; device not in the context → INVALID_ARGUMENT; a device
 *  without OpenCL 1.2 and a compiler → DEVICE_UNSUPPORTED; OpenCL errors pass through. */
CLFFN_API clffn_status clffn_context_create(cl_context context, cl_device_id device,
                                            clffn_context **out);

/** Creates a context that owns its OpenCL context and queue on the device named by `spec`:
 *  "P:D" (platform and device index, as clffn-devices lists them) or a case-insensitive
 *  substring of the device name. spec NULL or "" means: CLFFN_DEVICE from the environment if
 *  set, else the device clffn_devices_default() picks (a GPU first; POCL before llvmpipe).
 *  Errors: no platform → CLFFN_PLATFORM_NOT_FOUND (-1001); nothing matched → DEVICE_NOT_FOUND;
 *  DEVICE_UNSUPPORTED as above. */
CLFFN_API clffn_status clffn_context_create_for_device(const char *spec, clffn_context **out);

/** clffn_context_create_for_device(NULL, out): the host-level way in. */
CLFFN_API clffn_status clffn_context_create_default(clffn_context **out);

/** Releases the context and what it retained. NULL is a no-op. FFNs created on it must be
 *  destroyed first. CLBlast's process-wide program cache keeps its own reference to every
 *  cl_context it ran a GEMM on, until clffn_release_all() (or the application's own
 *  CLBlastClearCache()). */
CLFFN_API void clffn_context_destroy(clffn_context *ctx);

/** Releases what clffn and CLBlast hold for the whole process: CLBlast's cache of compiled GEMM
 *  programs (CLBlastClearCache(), which also drops its references to every cl_context), so that
 *  nothing OpenCL is left to release after main returns. Without it, CLBlast's static cache
 *  releases its programs from a destructor at exit, when the OpenCL implementation may already
 *  have torn itself down; some (Oclgrind, some vendor drivers) then crash the exiting program.
 *  Call it once at the end, after every clffn_context is destroyed and while no other thread
 *  runs a CLBlast routine; clffn works again afterwards (its GEMMs recompile). Every clffn tool
 *  calls it before it exits. Errors: a clffn_context still alive → CONTEXT_ALIVE, and nothing
 *  is released; CLBlast's status passes through. */
CLFFN_API clffn_status clffn_release_all(void);

/** The context's OpenCL handles (not retained for the caller); NULL for a NULL ctx. The queue
 *  is clffn's internal in-order queue (profiling enabled), usable for the caller's own work. */
CLFFN_API cl_context clffn_context_cl_context(const clffn_context *ctx);
CLFFN_API cl_device_id clffn_context_cl_device(const clffn_context *ctx);
CLFFN_API cl_command_queue clffn_context_queue(const clffn_context *ctx);

/** 1 when the context's device keeps subnormal floats (CL_FP_DENORM in its single-precision
 *  config), 0 when it flushes them, as OpenCL allows and many GPUs and Mesa's llvmpipe do; 0
 *  for a NULL ctx. On such a device every clffn kernel reads a subnormal input (x, a weight
 *  stored as f32 or bf16, a gradient) as zero of the same sign, writes a zero of the result's
 *  sign where the exact result is subnormal, and an intermediate value that underflows becomes
 *  zero: results differ from an IEEE device's by at most the order of the smallest normal float
 *  (1.2e-38) times the operands' magnitudes (silu(-88), 5e-37, comes out 0), and erf keeps its
 *  ulp bound for every normal input. f16, q8_0 and q4_0 weights are decoded exactly either way:
 *  their smallest values are normal floats. */
CLFFN_API int clffn_context_denormals(const clffn_context *ctx);

/** Writes the device's name into buf (NUL-terminated, truncated to size). Errors:
 *  NULL_ARGUMENT, INVALID_SIZE for size 0, OpenCL's. */
CLFFN_API clffn_status clffn_context_device_name(const clffn_context *ctx, char *buf, size_t size);

/** The build log of the last kernel build that failed on this context (the device compiler's
 *  own words), or "" if none failed. Valid until the next build or destroy. */
CLFFN_API const char *clffn_context_build_log(const clffn_context *ctx);

/* ---------------------------------------------------------------------------------------------
 * Devices
 * ------------------------------------------------------------------------------------------- */
/** One OpenCL device as clffn_devices_list() reports it. Strings are NUL-terminated, truncated
 *  to their arrays. */
typedef struct clffn_device_info {
    unsigned platform_index, device_index; /* "P:D", as CLFFN_DEVICE takes it */
    cl_platform_id platform;
    cl_device_id device;
    char platform_name[128];
    char name[128];
    char vendor[128];
    char driver_version[128];   /* CL_DRIVER_VERSION */
    char device_version[128];   /* CL_DEVICE_VERSION, "OpenCL M.m …" */
    char opencl_c_version[128]; /* CL_DEVICE_OPENCL_C_VERSION */
    cl_device_type type;
    cl_uint compute_units;
    cl_uint clock_mhz;
    cl_ulong global_mem_bytes;
    cl_ulong local_mem_bytes;
    cl_ulong max_alloc_bytes;
    size_t max_work_group_size;
    int fp16;      /* cl_khr_fp16 */
    int fp64;      /* cl_khr_fp64 or a non-zero CL_DEVICE_DOUBLE_FP_CONFIG */
    int supported; /* 1 when clffn can run on it (OpenCL 1.2, a compiler, available) */
    int denormals; /* CL_FP_DENORM in CL_DEVICE_SINGLE_FP_CONFIG; 0: subnormals count as zero */
    int software;  /* a GPU driver stack run on the CPU to test it (Mesa's llvmpipe, softpipe) */
} clffn_device_info;

/** Lists every device of every platform in platform order. Writes at most `capacity` entries
 *  to out (out may be NULL when capacity is 0) and the total number of devices to *count, so a
 *  first call with capacity 0 sizes the array. Errors: NULL count → NULL_ARGUMENT; no platform
 *  → CLFFN_PLATFORM_NOT_FOUND (-1001); OpenCL's. */
CLFFN_API clffn_status clffn_devices_list(clffn_device_info *out, size_t capacity, size_t *count);

/** The device that clffn_context_create_default() opens, given the list clffn_devices_list()
 *  wrote: among the supported devices, a GPU, else an accelerator, else a CPU device of a CPU
 *  runtime (POCL, a vendor's CPU runtime), else a software GPU stack (`software`: Mesa's
 *  llvmpipe, which rusticl offers next to POCL and which exists to test drivers), else any
 *  other; the first in list order among equals. The platforms' order (which the ICD loader
 *  decides, not the user) therefore never puts llvmpipe before POCL. When no device is
 *  supported the same order picks among all, so that opening it names what is missing.
 *  *index receives the position in devs. Errors: NULL devs (with n > 0) or NULL index →
 *  NULL_ARGUMENT; n == 0 → DEVICE_NOT_FOUND. */
CLFFN_API clffn_status clffn_devices_default(const clffn_device_info *devs, size_t n,
                                             size_t *index);

/** sizeof(clffn_device_info) in this build of the library. Bindings that mirror the struct (the
 *  Python package does, through ctypes) compare theirs with it, so that a library built from
 *  another clffn.h is refused instead of written past their array. */
CLFFN_API size_t clffn_device_info_size(void);

/** A short name for a device type: "GPU", "CPU", "accelerator", "custom" or "other". */
CLFFN_API const char *clffn_device_type_name(cl_device_type type);

/* ---------------------------------------------------------------------------------------------
 * Tuning profiles (written by clffn-tune, applied when a context opens its device)
 * ------------------------------------------------------------------------------------------- */
/** The folder of tuning profiles: $CLFFN_TUNE_DIR, else $XDG_CACHE_HOME/clffn, else
 *  ~/.cache/clffn. Errors: NULL_ARGUMENT, INVALID_SIZE (size 0), BUFFER_TOO_SMALL,
 *  INVALID_ARGUMENT when none of those variables is set. */
CLFFN_API clffn_status clffn_tuning_dir(char *buf, size_t size);

/** The profile file of a device: <dir>/<platform>__<device>__<driver>.json, so a driver update
 *  starts from the built-in defaults again. Errors as clffn_tuning_dir(). */
CLFFN_API clffn_status clffn_tuning_profile_path(cl_device_id device, char *buf, size_t size);

/** 1 when the device has a profile file, 2 when only a built-in profile matches, 0 otherwise. */
CLFFN_API int clffn_tuning_has_profile(cl_device_id device);

/** The built-in profile that matches the device (by platform and device name), as the JSON text
 *  a profile file holds, or NULL where none matches (or device is NULL). A context applies it
 *  when the device has no profile file; saved at clffn_tuning_profile_path() it is a starting
 *  point to edit. The text is the library's own: not to be freed or changed. */
CLFFN_API const char *clffn_tuning_builtin_profile(cl_device_id device);

/** What the context applied when it opened its device: "profile <path>", "built-in profile", or
 *  "none (…)". The parameters go to CLBlast for the whole process (CLBlastOverrideParameters),
 *  so the caller's own CLBlast SGEMMs on that device use them too; CLFFN_NO_TUNING=1 skips it. */
CLFFN_API const char *clffn_context_tuning(const clffn_context *ctx);

/** Largest inner-dimension block clffn_context_set_gemm_k_block() takes. */
#define CLFFN_MAX_GEMM_K_BLOCK ((size_t)1 << 20)

/** Sets how the context's FFNs run their SGEMMs along the inner dimension K: 0 runs each product
 *  as one CLBlast call; n > 0 splits K into floor(K/n) about equal blocks (multiples of 64) and
 *  sums their products into the output, each block one CLBlast call. On CPU devices CLBlast's
 *  tiled kernel slows down once a tile's operand panels (tile × K) outgrow the caches, and
 *  blocks keep them in cache (docs/PERFORMANCE.md has the measurements); on GPUs they only add
 *  passes over the output. The tuning profile sets it when the context opens its device
 *  ("clffn": {"GEMM_K_BLOCK": n}; none applied means 0); clffn-tune measures it. Results differ
 *  from unblocked ones only by float summation order. Takes effect on the next call of any of
 *  the context's FFNs; not to be changed while another thread runs one. Errors: NULL_ARGUMENT;
 *  k_block > CLFFN_MAX_GEMM_K_BLOCK → INVALID_SIZE. */
CLFFN_API clffn_status clffn_context_set_gemm_k_block(clffn_context *ctx, size_t k_block);

/** The context's inner-dimension block (see clffn_context_set_gemm_k_block); 0 for NULL. */
CLFFN_API size_t clffn_context_gemm_k_block(const clffn_context *ctx);

/** Largest row count clffn_context_set_gemm_k_block_min_rows() takes. */
#define CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS ((size_t)1 << 24)

/** Sets the fewest rows (m: the token rows of the forward's and the input-gradient products, the
 *  output rows of the weight gradients) a product needs to be K-blocked: a smaller product runs
 *  as one CLBlast call whatever the block. With few tokens the operand panels fit in cache
 *  anyway, and each block is one more call with its own copy kernels (on POCL, 512 → 2048 at 4
 *  and 8 tokens ran 20–35% faster unblocked; docs/PERFORMANCE.md). The tuning profile sets it
 *  ("clffn": {"GEMM_K_BLOCK_MIN_ROWS": n}), else 0: every product is blocked. Same rules of
 *  effect as clffn_context_set_gemm_k_block(). Errors: NULL_ARGUMENT; rows >
 *  CLFFN_MAX_GEMM_K_BLOCK_MIN_ROWS → INVALID_SIZE. */
CLFFN_API clffn_status clffn_context_set_gemm_k_block_min_rows(clffn_context *ctx, size_t rows);

/** The context's K-blocking threshold (see clffn_context_set_gemm_k_block_min_rows); 0 for
 *  NULL. */
CLFFN_API size_t clffn_context_gemm_k_block_min_rows(const clffn_context *ctx);

/** Largest token count clffn_context_set_gemv_max_tokens() takes. */
#define CLFFN_MAX_GEMV_TOKENS ((size_t)1 << 16)

/** The small-batch crossover of a device with no tuning profile that says otherwise: one
 *  token (decoding) runs as a matrix-vector product, since a GEMM pads a single row to a whole
 *  tile on every device CLBlast tunes. */
#define CLFFN_DEFAULT_GEMV_MAX_TOKENS ((size_t)1)

/** Sets the small-batch crossover: a product over at most max_tokens token rows (both of the
 *  forward's, and the backward's dh and dx) runs as one CLBlast GEMV per token, which reads the
 *  weight once per token and pads nothing; above it, one SGEMM, which pads the token dimension
 *  to the GEMM's tile but reuses each weight across tokens. 0 never takes the GEMV path;
 *  CLFFN_MAX_GEMV_TOKENS always does up to that count. The weight gradients are SGEMMs either
 *  way (their inner dimension is the token count, which a GEMV cannot shorten). Results differ
 *  from the SGEMM path's only by float summation order. The tuning profile sets it when the
 *  context opens its device ("clffn": {"GEMV_MAX_TOKENS": n}; clffn-tune measures it), else
 *  CLFFN_DEFAULT_GEMV_MAX_TOKENS. Takes effect on the next call of any of the context's FFNs and
 *  of clffn_sgemm(); not to be changed while another thread runs one. Errors: NULL_ARGUMENT;
 *  max_tokens > CLFFN_MAX_GEMV_TOKENS → INVALID_SIZE. */
CLFFN_API clffn_status clffn_context_set_gemv_max_tokens(clffn_context *ctx, size_t max_tokens);

/** The context's small-batch crossover (see clffn_context_set_gemv_max_tokens); 0 for NULL. */
CLFFN_API size_t clffn_context_gemv_max_tokens(const clffn_context *ctx);

/** The layout uploaded weights are kept in on a device whose tuning profile does not say
 *  otherwise: [in, out]. CLBlast's tiled SGEMM kernel, as tuned for nearly every device
 *  (GEMMK 0), wants both operands with the inner dimension running down the rows; the
 *  forward's products find [in, out] weights that way, while [out, in] ones are transposed
 *  into scratch on every forward call: on POCL about as long as the product itself for a few
 *  tokens, and its matrix-vector kernel reads them half as fast (docs/PERFORMANCE.md). */
#define CLFFN_DEFAULT_WEIGHT_LAYOUT CLFFN_LAYOUT_IN_OUT

/** Sets the layout clffn_ffn_upload_weights() (and clffn_ffn_init_weights()) keep W1, V and W2
 *  in on the device, whatever layout they are handed over in: [in, out] makes the forward's
 *  products cheapest with CLBlast's usual kernels and the backward's input products dearer by
 *  the same transposition, [out, in] the reverse, so inference gains and training breaks even.
 *  The layout handed over stays the FFN's for everything the caller sees (gradients, TP
 *  gathers). Bound weights (clffn_ffn_bind_weights) are always used as they are. The tuning
 *  profile sets it when the context opens its device ("clffn": {"WEIGHT_LAYOUT": n}, n a
 *  clffn_layout value; clffn-tune measures it), else CLFFN_DEFAULT_WEIGHT_LAYOUT. Takes effect
 *  at the next upload; weights already uploaded stay as they are. Errors: NULL_ARGUMENT;
 *  INVALID_LAYOUT. */
CLFFN_API clffn_status clffn_context_set_weight_layout(clffn_context *ctx, clffn_layout layout);

/** The layout the context's uploads keep weights in (see clffn_context_set_weight_layout);
 *  CLFFN_DEFAULT_WEIGHT_LAYOUT for NULL. */
CLFFN_API clffn_layout clffn_context_weight_layout(const clffn_context *ctx);

/** Most tokens one pass of clffn's own few-token kernels takes (cl/weights.cl). A forward
 *  product over more tokens, where its crossover (clffn_context_set_kernel_max_tokens) allows,
 *  runs the kernels in passes of this many, each reading the weights once. */
#define CLFFN_MAX_KERNEL_TOKENS ((size_t)16)

/** Which products a few-token crossover is for (clffn_context_set_kernel_max_tokens). */
typedef enum clffn_kernel_class {
    CLFFN_KERNELS_F32 = 0,        /* over f32 weights, against CLBlast's GEMV or SGEMM */
    CLFFN_KERNELS_COMPRESSED = 1, /* over f16 or bf16 weights with f32 inputs, against
                                     dequantized blocks and SGEMM */
    CLFFN_KERNELS_QUANTIZED = 2,  /* over q8_0, q4_0 or bf16 weights kept [out, in] whose inputs
                                     the context quantizes (clffn_context_set_quantized_inputs),
                                     against the same */
    CLFFN_KERNELS_COMPRESSED_LARGE = 3, /* over any compressed weights with f32 inputs, in
                                           products of at least
                                           clffn_context_kernel_large_weights() weights */
    CLFFN_KERNELS_BLOCKS = 4 /* over q8_0 or q4_0 weights with f32 inputs, against the same */
} clffn_kernel_class;

/** The few-token crossovers of a device with no tuning profile that says otherwise: weights
 *  kept compressed (f16, bf16, q8_0, q4_0) run clffn's kernels up to 8 tokens, whether their
 *  inputs are quantized or not, f32 weights CLBlast's path (clffn_context_set_gemv_max_tokens)
 *  at every count. */
#define CLFFN_DEFAULT_KERNEL_MAX_TOKENS ((size_t)8)
#define CLFFN_DEFAULT_KERNEL_MAX_TOKENS_F32 ((size_t)0)
/** Where a profile gives CLFFN_KERNELS_COMPRESSED_LARGE's crossover without its size: products
 *  of at least 4096·11008 weights count as large (W2 of the shape clffn-tune measures it on). */
#define CLFFN_DEFAULT_KERNEL_LARGE_WEIGHTS ((size_t)45088768)

/** Sets up to how many token rows a product of the given class (a clffn_kernel_class; any
 *  other nonzero value counts as CLFFN_KERNELS_COMPRESSED) runs on clffn's own few-token
 *  kernels, which read each weight once for all of a pass's tokens in its stored type and split
 *  the inner dimension over a work-group. Above the count, compressed weights' blocks are
 *  dequantized into f32 scratch for CLBlast's SGEMM, and f32 weights take CLBlast's GEMV or
 *  SGEMM as before (0 keeps a class off the kernels at every count). A count above
 *  CLFFN_MAX_KERNEL_TOKENS has the forward's products run the kernels in passes of that many
 *  tokens; the backward's ∂x takes the kernels up to one pass (its column form loses to SGEMM
 *  beyond). Quantized inputs need no f32 conversion of the weights and multiply in integers, so
 *  on a CPU their crossover lies far past the others' (docs/PERFORMANCE.md, "Passes").
 *  Compressed weights with f32 inputs have a second crossover for large products
 *  (CLFFN_KERNELS_COMPRESSED_LARGE, products of at least clffn_context_kernel_large_weights()
 *  weights): SGEMM over dequantized blocks gets slower per token as the inner dimension grows,
 *  the kernels do not, so on a CPU the kernels win further on a 4096 → 11008 layer than on a
 *  1024 → 2816 one. Below that size q8_0's and q4_0's kernels decode bytes where f16's and
 *  bf16's convert halves, and on a CPU they win further (CLFFN_KERNELS_BLOCKS: on POCL on an
 *  AMD EPYC, at every count to 1024 tokens, where f16 and bf16 stop near 256). Setting
 *  CLFFN_KERNELS_COMPRESSED sets the large products' and the blocks' crossovers too; set
 *  CLFFN_KERNELS_COMPRESSED_LARGE or CLFFN_KERNELS_BLOCKS after it to tell them apart. The
 *  tuning profile sets them ("clffn": {"KERNEL_MAX_TOKENS": n, "KERNEL_MAX_TOKENS_F32": n,
 *  "KERNEL_MAX_TOKENS_QX": n, "KERNEL_MAX_TOKENS_LARGE": n, "KERNEL_MAX_TOKENS_BLOCKS": n,
 *  "KERNEL_LARGE_WEIGHTS": w}; clffn-tune measures where the kernels stop winning), else the
 *  defaults above, the large products' and the blocks' crossovers being the compressed one
 *  where a profile gives none. Results differ from the other paths' only by
 *  float summation order. Same rules of effect as clffn_context_set_gemm_k_block(). Errors:
 *  NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_context_set_kernel_max_tokens(clffn_context *ctx, int which,
                                                           size_t max_tokens);

/** The context's few-token crossover for a clffn_kernel_class (see above); 0 for NULL. */
CLFFN_API size_t clffn_context_kernel_max_tokens(const clffn_context *ctx, int which);

/** Sets from how many weights a product over compressed weights with f32 inputs takes the
 *  CLFFN_KERNELS_COMPRESSED_LARGE crossover instead of CLFFN_KERNELS_COMPRESSED's: the
 *  weights one product reads, d_model·d_ff for W2, and for W1, or 2·d_model·d_ff where a gated
 *  FFN's W1 and V are read together (weights kept as stored, [out, in]). The tuning profile's
 *  "KERNEL_LARGE_WEIGHTS", else CLFFN_DEFAULT_KERNEL_LARGE_WEIGHTS. Same rules of effect as
 *  clffn_context_set_gemm_k_block(). Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_context_set_kernel_large_weights(clffn_context *ctx, size_t weights);

/** The context's threshold for large products (see above); 0 for NULL. */
CLFFN_API size_t clffn_context_kernel_large_weights(const clffn_context *ctx);

/** Turns quantized inputs on (on ≠ 0) or off (0, the default) for products over q8_0, q4_0
 *  and bf16 weights kept [out, in] on clffn's few-token kernels (up to
 *  clffn_context_kernel_max_tokens(ctx, CLFFN_KERNELS_QUANTIZED) token rows, forward; the
 *  backward's ∂x and the dequantized SGEMMs of more tokens keep f32).
 *  Each product's input rows (x for W1 and V, the hidden layer for W2, an expert's gathered
 *  rows) are first rounded to the type llama.cpp's ggml multiplies such weights with:
 *   - q8_0 and q4_0 weights: q8_0 blocks, as GGUF's reference quantizer rounds them (d = amax /
 *     127 rounded to f16, q = round(x / d)), each block's 32 products summed in integers; each
 *     input is off by up to half its block's step. A NaN or an infinity in a token's input
 *     makes that token's outputs NaN, as on the f32 path (its block's scale is NaN).
 *   - bf16 weights: bf16, to nearest even (each input off by up to 2^-9 of itself), each
 *     product of two bf16 values exact in f32. NaNs and infinities pass as on the f32 path.
 *  It trades accuracy for speed: the result is then that of the weights' values times the
 *  rounded inputs, within 1e-5 of the double reference on those, not on x itself. On x86 CPUs
 *  with AVX-512BW (POCL) the q8_0 products run on 8-bit integer multiply-adds, and bf16 ones on
 *  AVX-512 BF16's dot products where the CPU has them (which treat values and sums below 2^-126
 *  as zero); both are faster than f32 inputs from a few tokens on. Other devices compute the
 *  same sums in plain arithmetic, a GPU with a row's work-items side by side, where one token's
 *  product, bound by the weights' bytes, gains nothing (docs/PERFORMANCE.md, "NVIDIA H200").
 *  f16 weights keep f32 inputs. Takes effect on the next forward. Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_context_set_quantized_inputs(clffn_context *ctx, int on);

/** 1 where the context quantizes the inputs of q8_0, q4_0 and bf16 products, else 0 (also for
 *  NULL). */
CLFFN_API int clffn_context_quantized_inputs(const clffn_context *ctx);

/** Turns fused epilogues on (on ≠ 0) or off (0). A context starts as its tuning profile says
 *  ("FUSED_EPILOGUES": 0 or 1 in its "clffn" section), else with them on, but on a CPU device,
 *  where POCL ran the fused kernels no faster (docs/PERFORMANCE.md). Where a product
 *  runs on clffn's few-token kernels along the weights' rows (W kept [out, in], one row a
 *  work-item or a work-group's lanes a row: every such product on a GPU, and on a CPU those
 *  whose input row fits its first-level cache), the kernel applies the FFN's epilogue as it
 *  writes its sums, so the epilogue takes no launch of its own: after the first product, bias,
 *  activation and gate (not with dropout), and after the second, b2 (not with a residual).
 *  Each value is the one the separate epilogue computes, to the bit, and the hidden tensors are
 *  written as before. A decoding forward on a GPU is a few launches, whose gaps are much of its
 *  time; a mixture-of-experts layer's experts gain alike. Stage times (clffn_ffn_stage_times)
 *  then count a fused epilogue in its product's time and give it 0. Takes effect on the next
 *  forward. Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_context_set_fused_epilogues(clffn_context *ctx, int on);

/** 1 where the context fuses epilogues into few-token products, else 0 (also for NULL). */
CLFFN_API int clffn_context_fused_epilogues(const clffn_context *ctx);

/** Chooses how compressed weights are dequantized into f32 for SGEMM where the block is written
 *  transposed (past the few-token kernels, when the layout the weights are kept in is not the
 *  one SGEMM takes): through tiles in local memory (on ≠ 0), each work-group writing whole
 *  output rows, or a tile a work-item (0), whose stores land eight rows apart. A context starts
 *  with tiles on all but CPU devices: on an H100 the work-item form took several times the
 *  tiles' time, and on POCL the tiles gain nothing (docs/PERFORMANCE.md). The values are the
 *  same either way, to the bit. A device whose kernel cannot run the tiles' work-group of 256
 *  gets the other form. Takes effect on the next product. Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_context_set_dequant_tiles(clffn_context *ctx, int on);

/** 1 where the context dequantizes transposed blocks through local-memory tiles, else 0 (also
 *  for NULL). */
CLFFN_API int clffn_context_dequant_tiles(const clffn_context *ctx);

/** The row-grouping boundary (clffn_context_set_row_group_cols) of a device whose profile gives
 *  none: x must pass 4096 floats. Where x fits the first-level cache, whether one stream a core
 *  or four reads faster depends on the host: on an AMD EPYC one row a work-item did (x of 4096
 *  floats, the first product of 4096 -> 11008 at one token), on an Intel Xeon four did, and its
 *  built-in profile groups from 512 (docs/PERFORMANCE.md). */
#define CLFFN_DEFAULT_ROW_GROUP_COLS ((size_t)4097)

/** Sets from how large an input a CPU device's few-token row kernels take weight rows several
 *  to a work-item: where a product's input (its inner dimension × the pass's tokens, in floats)
 *  is at least `floats`, each vector of x read serves four rows (up to 4 tokens) or two, and a
 *  core streams as many rows at once; below it, a row a work-item. Which reads faster where x
 *  fits the first-level cache depends on the host's cores and memory, so this is the tuning
 *  profile's "WGEMV_ROW_GROUP_COLS" (clffn-tune measures it), else
 *  CLFFN_DEFAULT_ROW_GROUP_COLS. 0 groups every
 *  product, SIZE_MAX none. Only CPU devices with one work-item a row (WGEMV_ROW_SPLIT 1) group
 *  rows; elsewhere the value is kept and unused. The sums of a grouped row are added in another
 *  order than a single row's, so the last bits of y may differ; both match the reference.
 *  Takes effect on the next product. Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_context_set_row_group_cols(clffn_context *ctx, size_t floats);

/** The context's row-grouping boundary (see above); 0 for NULL. */
CLFFN_API size_t clffn_context_row_group_cols(const clffn_context *ctx);

/** Has the FFNs (and mixture-of-experts layers) created on the context from now on share one
 *  scratch (on ≠ 0) instead of keeping one each: the f32 blocks that compressed weights are
 *  dequantized into for SGEMM, the few-token kernels' partial sums and quantized inputs, and
 *  CLBlast's padded copies. Each scratch grows to its largest product and stays: with the whole
 *  inner dimension in one block (the GPU profiles), a gated FFN's first product over compressed
 *  weights needs 2·d_ff·d_model floats, 361 MB at 4096 → 11008, more than the layer's q4_0
 *  weights (76 MB) or f16 ones (271 MB), and a model of 32 such layers keeps 32 of them. Shared,
 *  it keeps one, as large as the largest product of any of them. Turn it on only where those
 *  FFNs run one at a time, as a model's layers do: created, called and destroyed from one
 *  thread at a time, their commands on one in-order queue. Their workspaces (what a backward
 *  reads of its forward) stay their own, so a layer's backward may follow other layers'
 *  forwards. Turning it off (0, the default) changes nothing for FFNs already created. The
 *  scratch is released with the last FFN that shares it. Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_context_set_shared_scratch(clffn_context *ctx, int on);

/** 1 where FFNs created on the context now share its scratch (see above), else 0 (also for
 *  NULL). */
CLFFN_API int clffn_context_shared_scratch(const clffn_context *ctx);

/* ---------------------------------------------------------------------------------------------
 * FFN
 * ------------------------------------------------------------------------------------------- */
typedef struct clffn_ffn clffn_ffn;

/** Creates an FFN of the given config on ctx and builds its inference kernels (from the
 *  embedded .cl sources, or from the folder in CLFFN_KERNEL_DIR when set; the dropout kernels
 *  come when training starts). Dropout starts in inference mode with seed 0 and offset 0.
 *  Errors: config's validate status; weights beyond the device's max allocation →
 *  SIZE_OVERFLOW; kernel build failure → CL_BUILD_PROGRAM_FAILURE (-11) with the log in
 *  clffn_context_build_log(); unreadable kernel file → KERNEL_SOURCE. */
CLFFN_API clffn_status clffn_ffn_create(clffn_context *ctx, const clffn_config *config,
                                        clffn_ffn **out);

/** Releases the FFN, its kernels, workspace and any weights it owns or retained. NULL is a
 *  no-op. Waits for the FFN's last forward to complete (at once where the caller finished its
 *  queue, as it must before reading results; an OpenCL implementation that reports completion
 *  late is then past it before the FFN's objects go); OpenCL keeps the buffers alive for any
 *  other command still queued. */
CLFFN_API void clffn_ffn_destroy(clffn_ffn *ffn);

/** The FFN's config (a copy; for a shard, its slice's: d_ff = f1 − f0, and b2 and the residual
 *  off except on shard 0). */
CLFFN_API clffn_config clffn_ffn_get_config(const clffn_ffn *ffn);

/* ---- Tensor parallel: one layer split over several FFNs (devices, processes, machines) ----
 *
 * Megatron-LM's split of the hidden layer. Shard i of n holds hidden units [f0, f1): rows f0..f1
 * of W1 and V with b1 and bv, and columns f0..f1 of W2. Each computes a partial output
 *   y_i = act(x·W1_iᵀ + b1_i) [⊙ (x·V_iᵀ + bv_i)] · W2_iᵀ   (+ b2 (+ x) on shard 0 only)
 * and the sum of the partials over the shards is the layer's y; its backward gives its slice's
 * gradients and a partial dx, summed the same way. The sum is the caller's (an MPI_Allreduce, a
 * host loop) or clffn_tp_*'s below, for shards in one process. */

/** The hidden slice [f0, f1) of shard `index` of `count` of a layer d_ff wide: as equal as
 *  possible, the first shards one unit longer, a unit being 4 columns where d_ff is a multiple of
 *  4 (each shard then keeps the kernels' float4 path) and 1 otherwise. Errors: NULL_ARGUMENT;
 *  INVALID_ARGUMENT (count < 1, index outside [0, count), more shards than units). */
CLFFN_API clffn_status clffn_shard_range(size_t d_ff, int index, int count, size_t *f0, size_t *f1);

/** Creates shard `index` of `count` of the FFN `config` describes, on ctx: an FFN of width
 *  f1 − f0 (clffn_shard_range) whose weights are uploaded or bound as the slice (arrays of the
 *  slice's shapes; clffn_shard_weights() cuts them from full ones), and whose dropout draws by
 *  the layer's hidden index, so that with the same seed and offset every shard drops exactly
 *  what the unsplit FFN drops. Forward and backward are the FFN's own (clffn_forward, …) and
 *  return partials as described above. count = 1 gives an FFN equal to clffn_ffn_create()'s.
 *  Errors: clffn_ffn_create()'s and clffn_shard_range()'s. */
CLFFN_API clffn_status clffn_ffn_create_shard(clffn_context *ctx, const clffn_config *config,
                                              int index, int count, clffn_ffn **out);

/** The slice an FFN holds: [f0, f1) of a layer d_ff_total wide (0, d_ff, d_ff unless it is a
 *  shard). Any output may be NULL. Errors: NULL_ARGUMENT (ffn). */
CLFFN_API clffn_status clffn_ffn_shard_info(const clffn_ffn *ffn, size_t *f0, size_t *f1,
                                            size_t *d_ff_total);

/** Copies the slice [f0, f1) of a layer's full host weights (config's shapes, in `layout`) into
 *  `out`, arrays of the slice's shapes in the same layout: W1/V [S, D] or [D, S], W2 [D, S] or
 *  [S, D], b1/bv [S] (S = f1 − f0); b2 [D] is copied when both sides have it. Errors:
 *  NULL_ARGUMENT (a needed array), the config's validate status, INVALID_LAYOUT,
 *  INVALID_ARGUMENT (not 0 ≤ f0 < f1 ≤ d_ff). */
CLFFN_API clffn_status clffn_shard_weights(const clffn_config *config, clffn_layout layout,
                                           size_t f0, size_t f1, const clffn_host_weights *full,
                                           const clffn_weight_arrays *out);

/** The reverse of clffn_shard_weights(): writes (accumulate = 0) or adds (1) a slice's arrays
 *  into the full ones, e.g. to gather the shards' gradients into the layer's. Errors as
 *  clffn_shard_weights(). */
CLFFN_API clffn_status clffn_shard_place(const clffn_config *config, clffn_layout layout, size_t f0,
                                         size_t f1, const clffn_weight_arrays *slice,
                                         const clffn_weight_arrays *full, int accumulate);

/** A tensor-parallel layer in one process: shard i of `count` on contexts[i] (different devices,
 *  or one device several times), run concurrently, one thread and one queue each, the partial
 *  outputs summed on the host (in double, shard 0 first: the contexts may share no buffer, and
 *  the host-level calls return host arrays anyway). The layer behaves as one clffn_ffn of
 *  `config`: same forward and backward results (to fp32 rounding of the sum), the same dropout
 *  mask for the same seed and offset, the same errors. Contexts are borrowed: they must outlive
 *  the group. */
typedef struct clffn_tp clffn_tp;

/** Creates the group: one shard per context (clffn_ffn_create_shard). Errors: NULL_ARGUMENT
 *  (contexts, a context, config, out); INVALID_ARGUMENT (count < 1 or more shards than
 *  clffn_shard_range allows); clffn_ffn_create()'s. Nothing is left behind on error. */
CLFFN_API clffn_status clffn_tp_create(clffn_context *const *contexts, int count,
                                       const clffn_config *config, clffn_tp **out);

/** Releases the group and its shards (not the contexts). NULL is a no-op. */
CLFFN_API void clffn_tp_destroy(clffn_tp *tp);

/** The number of shards (0 for NULL). */
CLFFN_API int clffn_tp_count(const clffn_tp *tp);

/** Shard `index`, to inspect (clffn_ffn_shard_info, clffn_ffn_read_hidden, …); owned by the
 *  group. NULL for a bad index. */
CLFFN_API clffn_ffn *clffn_tp_shard(clffn_tp *tp, int index);

/** Uploads the layer's full host weights, each shard its slice (blocking). Errors as
 *  clffn_ffn_upload_weights(); after an error the group has no weights (NO_WEIGHTS) until an
 *  upload succeeds. */
CLFFN_API clffn_status clffn_tp_upload_weights(clffn_tp *tp, clffn_layout layout,
                                               const clffn_host_weights *full);

/** Training mode on every shard (clffn_ffn_set_training); on error none changed. */
CLFFN_API clffn_status clffn_tp_set_training(clffn_tp *tp, int training);

/** The dropout seed and offset of every shard (clffn_ffn_set_rng). Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_tp_set_rng(clffn_tp *tp, uint64_t seed, uint64_t offset);

/** The layer's forward, blocking: y [T, D] = FFN(x [T, D]), the sum of the shards' partials.
 *  y is written only when every shard succeeded; a failure leaves every shard's dropout offset
 *  where it was. Errors as clffn_forward_host() (the first failing shard's). */
CLFFN_API clffn_status clffn_tp_forward_host(clffn_tp *tp, size_t tokens, const float *x,
                                             size_t x_len, float *y, size_t y_len);

/** The layer's backward of the last clffn_tp_forward_host(), blocking: dx [T, D] (may be NULL)
 *  summed over the shards, and the full gradients gathered from the slices into `grads` (the
 *  layer's shapes, in the uploaded layout), overwritten or, with accumulate = 1, added to.
 *  Nothing of the caller's is written unless every shard succeeded. Errors as
 *  clffn_backward_host(). */
CLFFN_API clffn_status clffn_tp_backward_host(clffn_tp *tp, size_t tokens, const float *x,
                                              size_t x_len, const float *dy, size_t dy_len,
                                              float *dx, size_t dx_len,
                                              const clffn_weight_arrays *grads, int accumulate);

/** Uploads host weights (blocking) given in `layout` into device buffers the FFN owns, kept in
 *  the context's weight layout (clffn_context_set_weight_layout): transposed on the way when
 *  the two differ. Gradients come back in `layout`. Replaces any earlier weights; on error the
 *  earlier ones stay. Errors: NULL ffn/weights or a needed array NULL → NULL_ARGUMENT; bad
 *  layout → INVALID_LAYOUT; OpenCL's. */
CLFFN_API clffn_status clffn_ffn_upload_weights(clffn_ffn *ffn, clffn_layout layout,
                                                const clffn_host_weights *weights);

/** Host weights in a stored type: W1, V and W2 as bytes in dtype, biases as f32 (as in
 *  clffn_host_weights). Quantized matrices are [out, in] in GGUF's blocks (see clffn_dtype). */
typedef struct clffn_typed_weights {
    clffn_dtype dtype;
    const void *w1, *v, *w2; /* each clffn_dtype_bytes(dtype, out·in) bytes */
    const float *b1, *bv, *b2;
} clffn_typed_weights;

/** Uploads weights kept in their stored type (blocking): the matrices' bytes on the device are
 *  the bytes given, in `layout` (W1 and V of a gated FFN side by side in one buffer, as
 *  clffn_device_weights stacks them), so an f16 layer takes half the memory of an f32 one and
 *  a q4_0 layer 0.14 of it, and few-token passes read that much less. Forwards then run
 *  clffn's own kernels for few tokens and, for many, dequantize blocks of the inner dimension
 *  into f32 scratch for CLBlast's SGEMM; the backward computes ∂x and the biases' gradients
 *  but no weight gradient of compressed weights (CLFFN_ERROR_COMPRESSED_WEIGHTS if one is
 *  asked for). dtype F32 is clffn_ffn_upload_weights() (kept in the context's weight layout).
 *  Replaces any earlier weights; on error the earlier ones stay and nothing is allocated.
 *  Errors: NULL_ARGUMENT; INVALID_LAYOUT (unknown, or IN_OUT for a quantized dtype);
 *  INVALID_ARGUMENT (unknown dtype; a quantized one needs d_model and d_ff, the two input
 *  dimensions, to be multiples of 32: clffn_ffn_error_message() says which); SIZE_OVERFLOW;
 *  OpenCL's. */
CLFFN_API clffn_status clffn_ffn_upload_weights_typed(clffn_ffn *ffn, clffn_layout layout,
                                                      const clffn_typed_weights *weights);

/** The type the FFN's matrices are kept in on the device (F32 for bound weights and before
 *  any upload). */
CLFFN_API clffn_dtype clffn_ffn_weight_dtype(const clffn_ffn *ffn);

/** Bytes of W1, V and W2 on the device (0 before any weights), what a one-token forward reads. */
CLFFN_API size_t clffn_ffn_weight_bytes(const clffn_ffn *ffn);

/** What the last refused call on this FFN refused, in words ("q8_0 weights need d_model, the
 *  input dimension of W1 and V, to be a multiple of 32, not 100"), or "" when its status says
 *  it all. Valid until the next call on the FFN. */
CLFFN_API const char *clffn_ffn_error_message(const clffn_ffn *ffn);

/** Initialises weights with clffn_init_weights_host() and uploads them (OUT_IN layout). */
CLFFN_API clffn_status clffn_ffn_init_weights(clffn_ffn *ffn, clffn_init scheme, uint64_t seed);

/** Binds caller-owned device weights (retained until rebind or destroy; read, never written;
 *  later changes to them are seen by later forwards). Errors: NULL_ARGUMENT for a needed mem;
 *  INVALID_LAYOUT; a buffer of another context → INVALID_ARGUMENT; offset + size beyond the
 *  cl_mem → BUFFER_TOO_SMALL. */
CLFFN_API clffn_status clffn_ffn_bind_weights(clffn_ffn *ffn, clffn_layout layout,
                                              const clffn_device_weights *weights);

/** Dropout mode: training = 1 applies dropout with the config's p, 0 (the default) makes
 *  dropout the identity. The first switch to training with p > 0 builds the dropout kernels
 *  (an FFN used only for inference never builds them); if that fails the mode is unchanged.
 *  Errors: NULL_ARGUMENT; a kernel build failure (CL_BUILD_PROGRAM_FAILURE, log in
 *  clffn_context_build_log()), OpenCL's. */
CLFFN_API clffn_status clffn_ffn_set_training(clffn_ffn *ffn, int training);

/** Changes dropout p; in training mode, p > 0 builds the dropout kernels if they are not yet
 *  built (see clffn_ffn_set_training). Errors: NULL_ARGUMENT, INVALID_DROPOUT (p outside [0, 1]
 *  or NaN), a kernel build's; on error p is unchanged. */
CLFFN_API clffn_status clffn_ffn_set_dropout(clffn_ffn *ffn, float p);

/** Sets the dropout generator: the mask of hidden element e (e = t·F + j) is a pure function
 *  of (seed, offset, e) — word e mod 4 of Philox4x32-10 with key (seed low, seed high) and
 *  counter (offset + e/4 as a 64-bit value in words 0 and 1, 0, 0); dropped when the word
 *  < p·2^32. Each training forward uses the current offset and then advances it by ⌈T·F/4⌉, so
 *  successive forwards get fresh masks. Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_ffn_set_rng(clffn_ffn *ffn, uint64_t seed, uint64_t offset);

/** The generator's seed and the offset the next training forward will use (either may be NULL). */
CLFFN_API clffn_status clffn_ffn_get_rng(const clffn_ffn *ffn, uint64_t *seed, uint64_t *offset);

/** Device-level forward: enqueues y[T, D] = FFN(x[T, D]) on `queue` and returns without
 *  waiting. x and y are the caller's buffers, offsets in floats; y may equal x exactly (an
 *  in-place FFN) but not overlap it partly. queue must be in-order, on the FFN's context and
 *  device. If event is not NULL it receives an event for the last command (release it).
 *  tokens = 0 enqueues only a marker. Only y is written (besides the FFN's own workspace).
 *  Errors, all before anything is enqueued: NULL_ARGUMENT, NO_WEIGHTS, INVALID_QUEUE,
 *  SIZE_OVERFLOW (T·F beyond size_t or the device's max allocation), BUFFER_TOO_SMALL,
 *  BUFFER_OVERLAP, INVALID_ARGUMENT (buffer of another context); OpenCL's and CLBlast's. */
CLFFN_API clffn_status clffn_forward(clffn_ffn *ffn, size_t tokens, cl_mem x, size_t x_offset,
                                     cl_mem y, size_t y_offset, cl_command_queue queue,
                                     cl_event *event);

/** Host-level forward, blocking: y[T, D] = FFN(x[T, D]) on the context's internal queue.
 *  x_len and y_len are the arrays' lengths in floats and must be ≥ T·D. y is written only on
 *  success. tokens = 0 succeeds at once. Errors as clffn_forward(). */
CLFFN_API clffn_status clffn_forward_host(clffn_ffn *ffn, size_t tokens, const float *x,
                                          size_t x_len, float *y, size_t y_len);

/** Device-level backward of the last forward (same T, same x), enqueued on `queue` without
 *  waiting. Given dy [T, D] = ∂L/∂y, writes dx [T, D] (dx may be NULL to skip it) and the weight
 *  gradients into `grads` (shapes and layout as the FFN's weights; for a gated FFN leave v.mem
 *  NULL to get dW1 and dV stacked in w1, computed by one SGEMM; biases with their flag off are
 *  not touched). A gradient whose buffer's mem is NULL is skipped: every one NULL gives dx
 *  alone (weights frozen); dV without dW1 is refused (INVALID_ARGUMENT). accumulate = 0
 *  overwrites the gradients, 1 adds to them (micro-batches).
 *
 *  What the forward keeps for this: z = x·[W1|V] (pre-activation, without biases) and h (W2's
 *  input) in the FFN's workspace, and the dropout offset it used; the mask is recomputed from
 *  Philox, never stored. z rather than act(z) because act' needs the pre-activation; h because
 *  dW2 needs it and keeping it costs less than recomputing gate and mask. Another forward on the
 *  same FFN replaces them. Errors: NULL_ARGUMENT, NO_WEIGHTS, NO_FORWARD (no forward of T
 *  tokens to differentiate), INVALID_QUEUE, BUFFER_TOO_SMALL, INVALID_ARGUMENT (buffer of another
 *  context); OpenCL's and CLBlast's. */
CLFFN_API clffn_status clffn_backward(clffn_ffn *ffn, size_t tokens, cl_mem x, size_t x_offset,
                                      cl_mem dy, size_t dy_offset, cl_mem dx, size_t dx_offset,
                                      const clffn_device_weights *grads, int accumulate,
                                      cl_command_queue queue, cl_event *event);

/** Host-level backward of the last host-level forward, blocking: x and dy [T, D] in, dx [T, D]
 *  (may be NULL) and the gradients (host arrays as clffn_init_weights_host() fills, in the
 *  weights' layout) out, overwritten or, with accumulate = 1, added to; grads NULL computes dx
 *  alone (frozen weights). Lengths in floats.
 *  Errors as clffn_backward(), BUFFER_TOO_SMALL for short arrays. */
CLFFN_API clffn_status clffn_backward_host(clffn_ffn *ffn, size_t tokens, const float *x,
                                           size_t x_len, const float *dy, size_t dy_len, float *dx,
                                           size_t dx_len, const clffn_weight_arrays *grads,
                                           int accumulate);

/** Which hidden tensor clffn_ffn_read_hidden() returns, each [T, F]. */
typedef enum clffn_hidden {
    CLFFN_HIDDEN_PRE = 0,  /* x·W1 + b1: what the tutorials inspect as w_1(x) */
    CLFFN_HIDDEN_GATE = 1, /* x·V + bv: the gate's linear part (gated FFNs only) */
    CLFFN_HIDDEN_OUT = 2   /* after activation, gating and dropout: the input of W2 */
} clffn_hidden;

/** Copies a hidden tensor of the last forward into out (blocking; waits for that forward).
 *  Errors: NULL_ARGUMENT; NO_FORWARD before any forward (or after one with T = 0);
 *  INVALID_ARGUMENT for an unknown `which` or GATE on a plain FFN; BUFFER_TOO_SMALL when
 *  out_len < T·F; OpenCL's. *tokens (may be NULL) receives T. */
CLFFN_API clffn_status clffn_ffn_read_hidden(clffn_ffn *ffn, clffn_hidden which, float *out,
                                             size_t out_len, size_t *tokens);

/** Per-stage device times of one forward, in seconds, from OpenCL profiling events. */
typedef struct clffn_stage_times {
    double gemm1_s;     /* the first projection (x·W1, with V when gated) */
    double epilogue1_s; /* bias, activation, gate, dropout (0 where fused into GEMM 1) */
    double gemm2_s;     /* the second projection (h·W2) */
    double epilogue2_s; /* b2 and residual (0 where fused into GEMM 2) */
    double total_s;     /* from the start of GEMM 1 to the end of epilogue 2 */
} clffn_stage_times;

/** Turns stage timing on or off for later forwards (off by default: it adds a marker per
 *  forward). The forward's queue must have CL_QUEUE_PROFILING_ENABLE (the context's own queue
 *  does). Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_ffn_set_profiling(clffn_ffn *ffn, int on);

/** The stage times of the last forward run with profiling on (blocking: waits for it).
 *  Errors: NULL_ARGUMENT; NO_FORWARD when none was profiled; CL_PROFILING_INFO_NOT_AVAILABLE
 *  (-7) when its queue lacks profiling; PROFILING_TIMES when the device's timestamps put the
 *  stages out of the order in which the in-order queue ran them (a driver whose profiling
 *  timestamps are not times: time on the host instead); OpenCL's. */
CLFFN_API clffn_status clffn_ffn_stage_times(clffn_ffn *ffn, clffn_stage_times *out);

/* ---------------------------------------------------------------------------------------------
 * Mixture of experts
 *
 * A sparse layer of E expert FFNs of one config (Mixtral, Qwen-MoE, Switch Transformer): a
 * router [E, D] (+ bias [E]) scores each token, the k best experts (a tie going to the lower
 * index) each run the token, and the output is their weighted sum, plus an optional shared
 * expert that every token passes through:
 *   p[t] = softmax(x[t]·Wrᵀ + br)            over the E experts
 *   e[t, 0..k) = the k largest p[t]           in order, ties to the lower index
 *   w[t, j] = p[t, e[t, j]] / Σ_j p[t, e[t, j]]   (CLFFN_ROUTING_TOPK_NORMALIZED), or
 *             p[t, e[t, j]]                       (CLFFN_ROUTING_TOPK)
 *   y[t] = g[t]·shared(x[t]) + Σ_j w[t, j]·expert_{e[t, j]}(x[t])   added in that order
 * where g[t] = 1, or with a gated shared expert (Qwen2-MoE's shared_expert_gate)
 *   g[t] = sigmoid(x[t]·wsᵀ + bs)             ws [D]: the router's row E, bs its bias's entry E
 * Routing runs on the device; each expert runs on its tokens gathered into contiguous rows
 * (CLBlast's SGEMM for many, clffn's few-token kernels for few, as any FFN), and an expert no
 * token chose reads none of its weights. Where every expert's products at T tokens run clffn's
 * own kernels in one pass (T up to CLFFN_MAX_KERNEL_TOKENS and the context's
 * clffn_context_kernel_max_tokens() for the experts' type: decoding), the experts' row counts
 * stay on the device: each expert is launched for T rows
 * and its kernels read its count, so the host never waits between the routing and the
 * experts (clffn_moe_set_counts() can trade that for launching only the chosen experts). Past
 * one pass they stay on the device too where the context runs the experts' products on clffn's
 * kernels at every count up to T (the CPU profiles), the routed experts' weights are q8_0 or
 * q4_0 and the experts run grouped (clffn_moe_experts_grouped()): each expert's rows go in
 * tiles of CLFFN_MAX_KERNEL_TOKENS, a tile a step of the grouped launches. A tile reads its
 * expert's weights again, which costs f32, f16 and bf16 experts more than the wait for the
 * counts (f32 6-22% on an AMD EPYC), and the byte-sized blocks level or less. Elsewhere the
 * host reads the E counts back once, since CLBlast's products are sized on the host, and an
 * unchosen expert is not launched at all. The
 * weights are uploaded per expert through the FFN API (clffn_moe_expert()), in any stored type.
 * ------------------------------------------------------------------------------------------- */
typedef struct clffn_moe clffn_moe;

/** How router probabilities become the chosen experts' weights. */
typedef enum clffn_routing {
    CLFFN_ROUTING_TOPK_NORMALIZED = 0, /* softmax → top-k → renormalised to sum 1 (Mixtral) */
    CLFFN_ROUTING_TOPK = 1             /* softmax → top-k, as they are (Switch; Qwen2-MoE without
                              norm_topk_prob) */
} clffn_routing;

/** What a mixture-of-experts layer computes. */
typedef struct clffn_moe_config {
    clffn_config expert;   /* each expert's FFN (and the shared expert's); residual must be 0 */
    size_t experts;        /* E ≥ 1 */
    size_t top_k;          /* k in [1, E] */
    clffn_routing routing; /* default CLFFN_ROUTING_TOPK_NORMALIZED */
    int router_bias;       /* 1: the router has a bias [E] (default 0) */
    int shared_expert;     /* 1: an expert of the experts' config (but for shared_d_ff) that
                              every token passes through, its output added (default 0) */
    float aux_loss_coef;   /* α ≥ 0: the backward adds α times the load-balancing loss's
                              gradient (clffn_moe_aux_loss); 0 (default): none */
    size_t shared_d_ff;    /* the shared expert's hidden size; 0 (default): expert.d_ff.
                              Qwen2-MoE's is its shared_expert_intermediate_size */
    int shared_gate;       /* 1: the shared expert's output is scaled by a sigmoid of its own
                              logit, the router's extra row E (Qwen2-MoE; needs shared_expert;
                              default 0) */
} clffn_moe_config;

/** Mixtral's defaults for the given shapes: experts SwiGLU without biases (as clffn-run's
 *  mixtral preset reads them), normalised top-k, no router bias, no shared expert. For
 *  Qwen2-MoE set routing CLFFN_ROUTING_TOPK, shared_expert, shared_d_ff and shared_gate. */
CLFFN_API clffn_moe_config clffn_moe_config_default(size_t d_model, size_t d_ff, size_t experts,
                                                    size_t top_k);

/** Creates a mixture-of-experts layer on ctx: E expert FFNs (and the shared one) without
 *  weights, and the router without weights. Errors: NULL_ARGUMENT; the expert config's
 *  validate status (and the shared expert's, with its shared_d_ff); INVALID_ARGUMENT (E = 0,
 *  k outside [1, E], an unknown routing, residual set, E beyond 2^24, aux_loss_coef negative
 *  or not finite, shared_d_ff or shared_gate without shared_expert); SIZE_OVERFLOW;
 *  OUT_OF_HOST_MEMORY; clffn_ffn_create()'s. Nothing is left behind on error. */
CLFFN_API clffn_status clffn_moe_create(clffn_context *ctx, const clffn_moe_config *config,
                                        clffn_moe **out);

/** Creates a mixture-of-experts layer whose routed experts are split over an in-process group
 *  of count contexts (different devices, or one device several times; expert parallelism):
 *  expert e on contexts[clffn_moe_expert_owner(e, E, count)], the router, the routing, the
 *  shared expert and the combine on contexts[0]. Each expert's weights live on its own context
 *  only (upload them through clffn_moe_expert(), as for any layer). An expert on another
 *  context than the first gets its rows and returns its outputs through the host (the
 *  contexts may share no buffer); each such context runs its experts in turn on a thread of its
 *  own, beside the first context's. Each expert runs the kernels an unsplit layer runs on the
 *  same rows, so on devices that compute alike the outputs and
 *  gradients are the unsplit layer's bits. The layer is then a clffn_moe like any other, with
 *  two limits: its device-level forward and backward take x, y, dy and dx on contexts[0] and
 *  block, and clffn_moe_backward() takes no expert gradient buffers (grads->experts must be
 *  NULL: they are on several contexts; clffn_moe_backward_host() returns them). The expert
 *  counts are always read back (see clffn_moe_forward()). Contexts are borrowed: they must
 *  outlive the layer. Errors: NULL_ARGUMENT (contexts, a context, config, out);
 *  INVALID_ARGUMENT (count < 1 or more than E); clffn_moe_create()'s. Nothing is left behind on
 *  error. count = 1 gives clffn_moe_create()'s layer. */
CLFFN_API clffn_status clffn_moe_create_split(clffn_context *const *contexts, int count,
                                              const clffn_moe_config *config, clffn_moe **out);

/** The context index that owns expert e of E in a layer split over count contexts: e·count/E,
 *  so each context holds a contiguous run of ⌊E/count⌋ or ⌈E/count⌉ experts, the lower ones
 *  first. -1 when count < 1, E = 0 or e ≥ E. */
CLFFN_API int clffn_moe_expert_owner(size_t e, size_t experts, int count);

/** What a partial layer asks of its exchange (clffn_moe_exchange_fn's pass, flags or'd). */
enum {
    CLFFN_MOE_PASS_BACKWARD = 1,  /* a backward: dy's rows in, dx's out; else a forward */
    CLFFN_MOE_PASS_GRADS = 2,     /* with the backward: the experts' weight gradients are wanted */
    CLFFN_MOE_PASS_ACCUMULATE = 4 /* with GRADS: added to what the holder has, not overwritten */
};

/** A forward's pass also carries the layer's token count T in bits 8 to 30 when T is at most
 *  CLFFN_MOE_PASS_MAX_TOKENS (0 there otherwise): clffn_moe_holder_run() then runs its experts'
 *  few-token kernels as built for the layer's pass of T tokens (for T, or past
 *  CLFFN_MAX_KERNEL_TOKENS for a full pass of that many), as the whole layer does at T, so that
 *  their rows sum in the same order. An exchange hands pass on as it got it. */
#define CLFFN_MOE_PASS_MAX_TOKENS ((size_t)0x7fffff)
#define CLFFN_MOE_PASS_TOKENS(pass) ((size_t)(((unsigned)(pass) >> 8) & 0x7fffffu))
#define CLFFN_MOE_PASS_WITH_TOKENS(tokens) \
    ((size_t)(tokens) <= CLFFN_MOE_PASS_MAX_TOKENS ? (int)((unsigned)(tokens) << 8) : 0)

/** Runs, for a partial layer (clffn_moe_create_partial()), the experts it does not hold.
 *  rows[e] for each of the E experts: how many rows expert e has in this pass (0 for the
 *  experts the layer holds itself and for those no token chose). in and out are [Σ rows, D],
 *  the experts' rows one after another in expert order. A forward (no
 *  CLFFN_MOE_PASS_BACKWARD; its tokens in CLFFN_MOE_PASS_TOKENS(pass)) hands x's rows and wants
 *  each expert's FFN output of them; a backward (CLFFN_MOE_PASS_BACKWARD) hands dy's rows
 *  (already scaled by the tokens' routing weights) and wants dx's, differentiated at the rows of
 *  the last forward pass. With CLFFN_MOE_PASS_GRADS each expert's weight and bias gradients
 *  are computed where it is held and kept there (overwritten, or added with
 *  CLFFN_MOE_PASS_ACCUMULATE; an expert with no rows gets zeros unless accumulating), for the
 *  program to collect. Called on the layer's calling thread while the layer's own experts run
 *  on its device. Returns CLFFN_SUCCESS, or the status the layer's pass then fails with (out is
 *  then not used). libclffn_mpi's clffn_mpi_moe_exchange() is one, over MPI ranks. */
typedef clffn_status (*clffn_moe_exchange_fn)(void *user, int pass, const size_t *rows,
                                              const float *in, float *out);

/** Creates a mixture-of-experts layer on ctx that holds only the routed experts [first, first +
 *  count) (and the router, the shared expert and the combine, as clffn_moe_create()'s); every
 *  other expert's rows go through exchange(user, …) and its outputs come back the same way
 *  (expert parallelism over processes: each holds its own experts, one of them the layer).
 *  clffn_moe_expert() returns NULL for an expert held elsewhere, its weights are not needed
 *  here, and the backward leaves such an expert's host gradient arrays as they are (its holder
 *  has them; clffn_moe_backward() takes no expert gradient buffers, as for a split layer). The
 *  expert counts are always read back (see clffn_moe_forward()). Where the holders run the
 *  kernels this layer would on the same rows, the outputs and gradients are a whole layer's
 *  bits. user is borrowed. Errors: NULL_ARGUMENT (ctx, config, exchange, out);
 *  INVALID_ARGUMENT (count = 0 or first + count beyond E); clffn_moe_create()'s. Nothing is left
 *  behind on error. */
CLFFN_API clffn_status clffn_moe_create_partial(clffn_context *ctx, const clffn_moe_config *config,
                                                size_t first, size_t count,
                                                clffn_moe_exchange_fn exchange, void *user,
                                                clffn_moe **out);

/** The other side of an exchange: the routed experts [first, first + count) of a layer held
 *  in a process that does not hold the layer, run on the rows a partial layer sends them. */
typedef struct clffn_moe_holder clffn_moe_holder;

/** Creates a holder of the experts [first, first + count) of a layer of config, on ctx, their
 *  FFNs without weights (upload them through clffn_moe_holder_expert()). Errors: NULL_ARGUMENT;
 *  INVALID_ARGUMENT (count = 0 or first + count beyond E); clffn_moe_create()'s config checks;
 *  clffn_ffn_create()'s. Nothing is left behind on error. */
CLFFN_API clffn_status clffn_moe_holder_create(clffn_context *ctx, const clffn_moe_config *config,
                                               size_t first, size_t count, clffn_moe_holder **out);

/** Releases the holder and its experts (NULL is a no-op). */
CLFFN_API void clffn_moe_holder_destroy(clffn_moe_holder *holder);

/** Expert e of the layer (first ≤ e < first + count), owned by the holder; NULL for any other. */
CLFFN_API clffn_ffn *clffn_moe_holder_expert(clffn_moe_holder *holder, size_t e);

/** One pass of the layer's exchange (clffn_moe_exchange_fn's pass and rows [E]) on the held
 *  experts, blocking: in and out are [Σ rows[e], D] over the held e alone, in expert order.
 *  A forward runs each expert with rows on them (clffn_forward_host(), its few-token kernels as
 *  built for the pass's CLFFN_MOE_PASS_TOKENS) and keeps the rows for the backward; a backward
 *  differentiates at them, each expert's dx into out and, with CLFFN_MOE_PASS_GRADS, its
 *  weight and bias gradients into grads[e − first] (count host sets, as clffn_backward_host()
 *  takes; overwritten, or added with CLFFN_MOE_PASS_ACCUMULATE; an expert without rows: zeroed
 *  unless accumulating). Errors: NULL_ARGUMENT (in or out with
 *  rows, grads with GRADS); NO_FORWARD (a backward whose rows are not the last forward's);
 *  OUT_OF_HOST_MEMORY; the experts' (the first failure; an expert's failure leaves its rows of
 *  out unspecified). */
CLFFN_API clffn_status clffn_moe_holder_run(clffn_moe_holder *holder, int pass, const size_t *rows,
                                            const float *in, float *out,
                                            const clffn_weight_arrays *grads);

/** Releases the layer, its experts and its device buffers (NULL is a no-op). */
CLFFN_API void clffn_moe_destroy(clffn_moe *moe);

/** Expert e (0 ≤ e < E), or the shared expert (e = E, when the config has one): an FFN whose
 *  weights are uploaded or bound with the FFN API (clffn_ffn_upload_weights(),
 *  clffn_ffn_upload_weights_typed(), …). Owned by the layer. The experts on the layer's
 *  context share one scratch (compressed weights' f32 blocks at many tokens: one expert's at a
 *  time, not one an expert), so run them, and the layer, from one thread at a time, as one
 *  FFN. NULL for any other e, and for an expert a partial layer (clffn_moe_create_partial())
 *  does not hold. */
CLFFN_API clffn_ffn *clffn_moe_expert(clffn_moe *moe, size_t e);

/** Uploads the router (blocking): weight [R, D] row-major (nn.Linear's layout: Mixtral's
 *  block_sparse_moe.gate.weight), bias [R] (NULL unless the config has router_bias), where R =
 *  E, or E + 1 with shared_gate: row E is then the shared expert's gate (Qwen2-MoE's
 *  mlp.shared_expert_gate.weight [1, D] below mlp.gate.weight [E, D]). Replaces any earlier
 *  router; on error the earlier one stays. Errors: NULL_ARGUMENT (weight; bias when the config
 *  has one), OpenCL's. */
CLFFN_API clffn_status clffn_moe_upload_router(clffn_moe *moe, const float *weight,
                                               const float *bias);

/** Device-level forward: enqueues y[T, D] = MoE(x[T, D]) on queue (in-order, on the layer's
 *  context and device). Where the experts' products at T tokens all run clffn's own kernels
 *  (above: in one pass, or past it with the experts grouped) it does not block, unless
 *  clffn_moe_set_counts() asks for the counts on the host;
 *  otherwise it blocks once, for the E expert row counts the routing found, which size
 *  CLBlast's products. An expert's hidden state
 *  (clffn_ffn_read_hidden()) is meaningful only after a forward that blocked. x and y are
 *  the caller's, offsets in floats; y may equal x exactly but not overlap it partly; only y is
 *  written. tokens = 0 enqueues nothing.
 *  Errors, before anything is enqueued: NULL_ARGUMENT, NO_WEIGHTS (the router or an expert has
 *  none), INVALID_QUEUE, SIZE_OVERFLOW, BUFFER_TOO_SMALL, BUFFER_OVERLAP, INVALID_ARGUMENT
 *  (a buffer of another context); then OpenCL's and CLBlast's, and an expert forward's. */
CLFFN_API clffn_status clffn_moe_forward(clffn_moe *moe, size_t tokens, cl_mem x, size_t x_offset,
                                         cl_mem y, size_t y_offset, cl_command_queue queue);

/** Where a forward through clffn's own kernels (few tokens, or any on a context whose
 *  crossovers reach T: clffn_moe_forward()) keeps the experts' row counts. */
typedef enum clffn_moe_counts {
    CLFFN_MOE_COUNTS_DEVICE = 0, /* on the device (the default): the forward does not block; the
                                    experts run grouped (clffn_moe_experts_grouped()), else every
                                    expert is launched, an unchosen one's kernels returning at
                                    once */
    CLFFN_MOE_COUNTS_HOST = 1,   /* read back once, after the routing: the forward blocks for
                                    them, and only the chosen experts are launched, one at a
                                    time */
    CLFFN_MOE_COUNTS_AUTO = 2    /* on the host where some expert must go unchosen (E > T·k),
                                    else on the device */
} clffn_moe_counts;

/** Sets where later forwards keep the expert counts. Every launch costs the driver some
 *  microseconds whatever its work (NVIDIA's, about 10 of the host's; POCL's, about 5). Grouped
 *  (the default), the device counts launch a few kernels whatever E, with no wait: 128
 *  experts, top-8, one token on a CPU, 8 launches, and faster than HOST (f16 1.6–1.9 ms against
 *  2.1–2.2). One at a time they launch four kernels for each expert, chosen or not, and there
 *  HOST or AUTO, which launch only the chosen experts, ran that layer 2.1 (f16) to 2.6 (q8_0)
 *  times faster (docs/PERFORMANCE.md, "Mixture of experts"). The outputs are the same bits
 *  either way. A layer split over contexts or processes reads them back whatever this says.
 *  Errors: NULL_ARGUMENT; INVALID_ARGUMENT (another value; the setting unchanged). */
CLFFN_API clffn_status clffn_moe_set_counts(clffn_moe *moe, clffn_moe_counts where);

/** The layer's setting (CLFFN_MOE_COUNTS_DEVICE for NULL). */
CLFFN_API clffn_moe_counts clffn_moe_counts_where(const clffn_moe *moe);

/** Whether the layer's last forward kept the expert counts on the device (1) or read them back
 *  to the host (0). The setting is where they may stay; they stay only where the layer is not
 *  split and every expert's products at that forward's T tokens run clffn's own kernels: in one
 *  pass (at most CLFFN_MAX_KERNEL_TOKENS tokens, within the context's crossovers for the
 *  experts' type), or past it in tiles, where the crossovers reach T, the routed experts'
 *  weights are q8_0 or q4_0 and the experts run grouped. A prefill on a GPU profile
 *  (crossovers at 16 or fewer) reads them back whatever the setting.
 *  A backward after a forward that kept them runs the routing again with them read back: 0
 *  after it. 0 for NULL and before any forward. */
CLFFN_API int clffn_moe_counts_kept(const clffn_moe *moe);

/** Whether the layer's last forward ran its routed experts grouped: each stage of their forward
 *  (each product, each epilogue) one launch for all of them, so that the launches no longer
 *  grow with E. That is what a forward with the counts on the device does where every routed
 *  expert's weights were uploaded through clffn_moe_expert() in one type and layout: each such
 *  upload places the expert's tensors in the layer's buffers, one a kind of tensor, in the
 *  expert's slot (the first upload of a kind makes the buffer for all E; an expert's next
 *  upload writes over its slot once the layer's and the expert's last commands have completed,
 *  and one that fails part-way through that leaves the expert without weights). Weights bound
 *  from the caller's buffers (clffn_ffn_bind_weights()), experts of different types, and
 *  layers split over contexts run an expert at a time. The outputs are the same bits either
 *  way. 0 for NULL and before any forward. */
CLFFN_API int clffn_moe_experts_grouped(const clffn_moe *moe);

/** Switches grouping (above) on (the default) or off for the layer's later uploads and
 *  forwards. Off, each expert's upload makes buffers of its own, as a plain FFN's does, and the
 *  experts run one at a time; experts uploaded while it was on keep their slots but run one at
 *  a time too. Off is for comparing the two, and for running under a simulator that checks
 *  every read of memory the host wrote: Oclgrind 21.10 takes memory written through a part of
 *  a buffer (a sub-buffer, or an offset) for uninitialized (docs/RELIABILITY.md). A layer split
 *  over contexts or processes (its counts read back, so never grouped) keeps its experts'
 *  buffers apart whatever this says: a pool of E slots would hold room for the experts held
 *  elsewhere. The outputs are the same bits either way. Errors: NULL_ARGUMENT. */
CLFFN_API clffn_status clffn_moe_set_grouping(clffn_moe *moe, int on);

/** Host-level forward, blocking, on the context's queue: y[T, D] = MoE(x[T, D]); x_len and
 *  y_len in floats, ≥ T·D. experts [T, k] and weights [T, k] (either may be NULL) receive each
 *  token's chosen experts, best first, and their weights. The outputs are written only on
 *  success. Errors as clffn_moe_forward(), BUFFER_TOO_SMALL for a short array. */
CLFFN_API clffn_status clffn_moe_forward_host(clffn_moe *moe, size_t tokens, const float *x,
                                              size_t x_len, float *y, size_t y_len,
                                              int32_t *experts, float *weights);

/** Where clffn_moe_backward() writes the layer's gradients: the router's [R, D] and its bias
 *  [R] (with router_bias; R as clffn_moe_upload_router() has it), and per expert what
 *  clffn_backward() takes (an array of E, then the shared expert's, of its own width; NULL for
 *  no expert gradients). A NULL router.mem skips the router's. */
typedef struct clffn_moe_grads {
    clffn_buffer router;
    clffn_buffer router_bias;
    const clffn_device_weights *experts;
} clffn_moe_grads;

/** Device-level backward of the last forward (same T, same x): given dy [T, D], enqueues dx
 *  [T, D] (dx may be NULL to skip it) and the gradients on queue: the router's through the
 *  softmax and the renormalisation (the top-k choice, piecewise constant, has none), and each
 *  expert's weight and bias gradients from its own tokens, each scaled by its routing weight;
 *  an expert no token chose gets zeros (accumulate = 0) or keeps what it had (1). Blocks for
 *  nothing, but after a forward that kept the expert counts on the device (clffn_moe_forward())
 *  it first runs that forward's routing and experts again with the counts read back (one
 *  blocking read), since the experts' backwards are sized on the host. The forward keeps what this
 *  needs (probabilities, choices, gathered rows and the experts' outputs) until the next forward.
 *  Errors: NULL_ARGUMENT, NO_WEIGHTS, NO_FORWARD (no forward of T tokens), INVALID_QUEUE,
 *  SIZE_OVERFLOW, BUFFER_TOO_SMALL, BUFFER_OVERLAP, INVALID_ARGUMENT (a buffer of another context,
 *  or expert gradient buffers for a split layer: clffn_moe_create_split()), before anything is
 *  enqueued; then OpenCL's, CLBlast's and an expert backward's. */
CLFFN_API clffn_status clffn_moe_backward(clffn_moe *moe, size_t tokens, cl_mem x, size_t x_offset,
                                          cl_mem dy, size_t dy_offset, cl_mem dx, size_t dx_offset,
                                          const clffn_moe_grads *grads, int accumulate,
                                          cl_command_queue queue);

/** The load-balancing auxiliary loss of the last forward (Switch Transformer's, as Mixtral's
 *  and Qwen-MoE's training code computes it): aux = E · Σ_e f_e · P_e, with f_e the share of
 *  the T·k choices that went to expert e (each token's k choices each count 1/T, so Σ f = k)
 *  and P_e the mean router probability of e over the tokens. It is 1·k for a perfectly even
 *  router. Its gradient reaches the router through the softmax in every backward when the
 *  config's aux_loss_coef is not 0 (f, a count, has none). Blocks to read the probabilities
 *  (and the counts, after a forward that kept them on the device).
 *  Errors: NULL_ARGUMENT, NO_FORWARD, OpenCL's. */
CLFFN_API clffn_status clffn_moe_aux_loss(clffn_moe *moe, double *loss);

/** Host-level backward of the last clffn_moe_forward_host(), blocking: dy [T, D] in; dx
 *  [T, D], router_grad [R, D], router_bias_grad [R] (with router_bias; R = E, or E + 1 with
 *  shared_gate, whose gradient is row E) and expert_grads (E
 *  host sets, then the shared expert's, in each expert's weights' layout) out, each NULL to
 *  skip it, overwritten or with accumulate = 1 added to. Lengths in floats. Errors as
 *  clffn_moe_backward(), BUFFER_TOO_SMALL for a short array. */
CLFFN_API clffn_status clffn_moe_backward_host(clffn_moe *moe, size_t tokens, const float *dy,
                                               size_t dy_len, float *dx, size_t dx_len,
                                               float *router_grad, float *router_bias_grad,
                                               const clffn_weight_arrays *expert_grads,
                                               int accumulate);

#ifdef __cplusplus
}
#endif
#endif /* CLFFN_H */

/* =============================================================================================
 * Hooks for clffn's tools and tests: define CLFFN_HOOKS before including this header.
 *
 * Not part of the stable API (zstd's ZSTD_STATIC_LINKING_ONLY is the model): the SGEMM path the
 * library runs, the dropout generator and the CPU reference, for programs that time, check or
 * reproduce what the library does. Exported like the rest; may change in any release.
 * ============================================================================================= */
#if defined(CLFFN_HOOKS) && !defined(CLFFN_H_HOOKS)
#define CLFFN_H_HOOKS

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * The SGEMM path
 * ------------------------------------------------------------------------------------------- */
/** Whether an SGEMM operand is used as stored or transposed. */
typedef enum clffn_transpose { CLFFN_NO_TRANS = 0, CLFFN_TRANS = 1 } clffn_transpose;

/** How clffn splits an SGEMM's inner dimension k for a block size k_block: returns the number
 *  of CLBlast calls (1 when k_block is 0, k < 2·k_block, or k ≤ 64) and writes to *block (may be
 *  NULL) the length of each but the last, which takes the rest (k when not split). The blocks
 *  are as many as fit k_block long, made equal and rounded up to a multiple of 64, so CLBlast
 *  pads at most the last. */
CLFFN_API size_t clffn_gemm_k_split(size_t k, size_t k_block, size_t *block);

/** One SGEMM the way clffn runs its own products, for tools that time or check them (clffn-tune,
 *  clffn-bench-gemms) and for callers who want the same path: C[m,n] = α·op(A)·op(B) + β·C, all
 *  row-major, A [m,k] (trans_a: [k,m]) and B [k,n] (trans_b: [n,k]) at element offsets with
 *  leading dimensions a_ld, b_ld, c_ld, enqueued on queue (in order) and split along K by the
 *  context's block (clffn_gemm_k_split), each block a column-major CLBlast call; CLBlast takes
 *  its scratch per call, with the context's Xgemm set for its token count (m, or k when A is
 *  transposed; clffn_context_set_xgemm). With trans_a NO_TRANS and m at most the context's
 *  small-batch crossover (clffn_context_set_gemv_max_tokens), it runs as one CLBlast GEMV per
 *  row of A instead. event (may be NULL) completes with the last call. Errors:
 *  NULL_ARGUMENT; INVALID_ARGUMENT (a transpose other than the two); INVALID_QUEUE; CLBlast's
 *  and OpenCL's statuses (bad sizes, short buffers). */
CLFFN_API clffn_status clffn_sgemm(const clffn_context *ctx, clffn_transpose trans_a,
                                   clffn_transpose trans_b, size_t m, size_t n, size_t k,
                                   float alpha, cl_mem a, size_t a_off, size_t a_ld, cl_mem b,
                                   size_t b_off, size_t b_ld, float beta, cl_mem c, size_t c_off,
                                   size_t c_ld, cl_command_queue queue, cl_event *event);

/** Largest row count clffn_context_set_xgemm() takes for few_rows. */
#define CLFFN_MAX_XGEMM_FEW_ROWS ((size_t)1 << 24)

/** Sets the CLBlast Xgemm parameter sets the context's SGEMMs run with: `few` for products of
 *  fewer than few_rows tokens, `large` for the rest. A product's tokens are its m (the token rows
 *  of the forward's and the input-gradient products), or its k when A is transposed (the weight
 *  gradients sum over the tokens), so that all products of one pass take the same set: switching
 *  within a pass would cost more than the better tile saves. One tile cannot serve
 *  both: a few tokens want it narrow along the tokens (they are padded to it), many want it wide
 *  (on POCL, 8 tokens ran 2× faster forward on a 128 × 8 tile than on 128 × 32, which is up to
 *  29% faster on the large shapes; docs/PERFORMANCE.md). Each is n = 16 values named by CLBlast
 *  1.5's Xgemm parameters (GEMMK, KREG, KWG, KWI, MDIMA, MDIMC, MWG, NDIMB, NDIMC, NWG, SA, SB,
 *  STRM, STRN, VWM, VWN) in names, each once, in any order; CLBlast's constraints on them are
 *  the caller's to meet (clffn-tune does). CLBlast keeps one set per device for the whole
 *  process, so each product applies the set it wants when the device has the other, holding the
 *  device against other threads while it enqueues (about 1.5 ms on POCL per change, none while
 *  the row counts stay on one side). large NULL: no set of the context's own, its products run
 *  with whatever the device has (few must be NULL then); few NULL or few_rows 0: large for all.
 *  The tuning profile sets both ("clblast": {"Xgemm": ...}, "clblast_few_rows": {"Xgemm": ...},
 *  "clffn": {"XGEMM_FEW_ROWS": n}). Nothing is applied until a product needs it. Same rules of
 *  effect as clffn_context_set_gemm_k_block(). Errors: NULL_ARGUMENT (ctx, or names with a set);
 *  INVALID_ARGUMENT (a name missing, repeated or unknown, n not 16, few without large);
 *  few_rows > CLFFN_MAX_XGEMM_FEW_ROWS → INVALID_SIZE; on error nothing changes. */
CLFFN_API clffn_status clffn_context_set_xgemm(clffn_context *ctx, size_t n,
                                               const char *const *names, const size_t *large,
                                               const size_t *few, size_t few_rows);

/** The token count below which the context's products use its few-rows Xgemm set (see
 *  clffn_context_set_xgemm); 0 when it has none, or for NULL. */
CLFFN_API size_t clffn_context_xgemm_few_rows(const clffn_context *ctx);

/** The shape parameters of clffn's few-token kernels (cl/weights.cl documents each), in this
 *  order: ROW_SPLIT (work-items sharing a row of the row GEMV, a power of 2 ≤ 256), ROW_ROWS
 *  (rows per work-group, ≤ 256), COL_WIDTH (columns per work-item of the column GEMV: 8, 16, or
 *  a multiple of 32 ≤ 256), COL_SPLIT (work-items sharing a column group, a power of 2 ≤ 256),
 *  COL_GROUPS (column groups per work-group, ≤ 256). On a CPU device (other than Mesa's
 *  llvmpipe) with COL_SPLIT 1, the column GEMV is one work-item per strip of columns as wide as
 *  its private sums allow, and COL_WIDTH and COL_GROUPS go unused. */
#define CLFFN_WGEMV_PARAMS 5

/** Sets the context's few-token kernel shapes (the tuning profile's "clffn": {"WGEMV_ROW_SPLIT":
 *  …, "WGEMV_ROW_ROWS", "WGEMV_COL_WIDTH", "WGEMV_COL_SPLIT", "WGEMV_COL_GROUPS"}, else defaults
 *  for the device's type); NULL restores those defaults. Kernels built with other shapes stay
 *  cached. Same rules of effect as clffn_context_set_gemm_k_block(). Errors: NULL_ARGUMENT
 *  (ctx); INVALID_ARGUMENT (a value outside its range, or a work-group beyond the device's
 *  largest); on error nothing changes. */
CLFFN_API clffn_status clffn_context_set_wgemv(clffn_context *ctx,
                                               const size_t params[CLFFN_WGEMV_PARAMS]);

/** The context's few-token kernel shapes into params (zeros for NULL ctx). */
CLFFN_API void clffn_context_wgemv(const clffn_context *ctx, size_t params[CLFFN_WGEMV_PARAMS]);

/* ---------------------------------------------------------------------------------------------
 * CPU reference and the dropout generator, in plain C
 * ------------------------------------------------------------------------------------------- */
/** Philox4x32-10 (Salmon et al., Random123): out = philox(counter, key). All arrays of the
 *  stated length; none may be NULL. */
CLFFN_API void clffn_philox4x32_10(const uint32_t counter[4], const uint32_t key[2],
                                   uint32_t out[4]);

/** 1 when hidden element `index` is kept by dropout p under (seed, offset), else 0: the
 *  function the kernels compute (see clffn_ffn_set_rng()). */
CLFFN_API int clffn_dropout_keep(float p, uint64_t seed, uint64_t offset, uint64_t index);

/** The FFN in plain C with double accumulation, as an independent reference:
 *  y[T, D] (double) = FFN(x[T, D]); hidden (may be NULL) receives the [T, F] input of W2.
 *  Dropout applies when training is non-zero, with the same mask as the device for the same
 *  (seed, offset). Errors: NULL_ARGUMENT, the config's validate status, INVALID_LAYOUT,
 *  SIZE_OVERFLOW, OUT_OF_HOST_MEMORY. */
CLFFN_API clffn_status clffn_reference_forward(const clffn_config *config, clffn_layout layout,
                                               const clffn_host_weights *weights, size_t tokens,
                                               const float *x, int training, uint64_t seed,
                                               uint64_t offset, double *y, double *hidden);

/** Gradient arrays of the reference backward (double), shapes and layout as the weights'. Arrays
 *  whose flag is off (and v, bv for a plain FFN) may be NULL. */
typedef struct clffn_ref_grads {
    double *w1, *b1, *v, *bv, *w2, *b2;
} clffn_ref_grads;

/** The backward pass in plain C with double accumulation: given dy [T, D] = ∂L/∂y, writes
 *  dx [T, D] (may be NULL) and the weight gradients, overwriting them, for the same forward
 *  (training, seed, offset as the forward had; dropout's mask is recomputed). Errors as
 *  clffn_reference_forward(). */
CLFFN_API clffn_status clffn_reference_backward(const clffn_config *config, clffn_layout layout,
                                                const clffn_host_weights *weights, size_t tokens,
                                                const float *x, const float *dy, int training,
                                                uint64_t seed, uint64_t offset, double *dx,
                                                const clffn_ref_grads *grads);

/** A mixture-of-experts layer in plain C with double accumulation: routing as
 *  clffn_moe_config describes (the router's logits in double), each chosen expert by
 *  clffn_reference_forward() (inference), the weighted sum in the same order. router [R, D],
 *  router_bias [R] (NULL when the config has none; R as clffn_moe_upload_router()); experts:
 *  E host weight sets, then the shared expert's when the config has one, in `layout`. Writes
 *  y [T, D], and chosen [T, k] and weights [T, k] where not NULL. Errors: NULL_ARGUMENT,
 *  clffn_moe_create()'s argument checks, SIZE_OVERFLOW, OUT_OF_HOST_MEMORY,
 *  clffn_reference_forward()'s. */
CLFFN_API clffn_status clffn_moe_reference_forward(const clffn_moe_config *config,
                                                   clffn_layout layout, const float *router,
                                                   const float *router_bias,
                                                   const clffn_host_weights *experts, size_t tokens,
                                                   const float *x, double *y, int32_t *chosen,
                                                   double *weights);

/** The load-balancing loss (clffn_moe_aux_loss) of the reference's routing, in double.
 *  Errors as clffn_moe_reference_forward(). */
CLFFN_API clffn_status clffn_moe_reference_aux_loss(const clffn_moe_config *config,
                                                    const float *router, const float *router_bias,
                                                    size_t tokens, const float *x, double *loss);

/** The backward of clffn_moe_reference_forward() in double (with aux_loss_coef α, of
 *  Σ y·dy + α·aux): given dy [T, D], writes dx [T, D],
 *  router_grad [R, D], router_bias_grad [R] (with router_bias) and expert_grads (E sets, then
 *  the shared expert's, as clffn_reference_backward() fills them), each NULL to skip it,
 *  overwritten; an expert no token chose gets zeros. Errors as clffn_moe_reference_forward(). */
CLFFN_API clffn_status clffn_moe_reference_backward(
    const clffn_moe_config *config, clffn_layout layout, const float *router,
    const float *router_bias, const clffn_host_weights *experts, size_t tokens, const float *x,
    const float *dy, double *dx, double *router_grad, double *router_bias_grad,
    const clffn_ref_grads *expert_grads);

#ifdef __cplusplus
}
#endif
#endif /* CLFFN_HOOKS */
