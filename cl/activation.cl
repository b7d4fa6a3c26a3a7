// =================================================================================================
// activation.cl — the hidden activations, written once for float and floatN.
//
// Every form is the exact one (no fast-math, no approximations beyond the built-ins' ulp bounds):
// llm.c's #168 shows how quietly fast-math breaks GELU. NaN propagates: relu(NaN) is NaN, since the
// comparison with 0 is false for NaN and the input is passed through.
// =================================================================================================

// The activation ids are the public clffn_activation values, defined by the host in the build
// options (-DCLFFN_ACT_RELU=0 …, see clffn_defs.h), and so is CLFFN_ACT, the one this program
// computes.
#if !defined(CLFFN_ACT) || !defined(CLFFN_ACT_RELU)
  #error "the host defines CLFFN_ACT and the activation ids (src/program.c)"
#endif

#define CLFFN_SQRT1_2   0.70710678118654752440f // 1/sqrt(2), for erf-GELU
#define CLFFN_SQRT2_PI  0.79788456080286535588f // sqrt(2/pi), for tanh-GELU
#define CLFFN_GELU_CUBE 0.044715f

#if CLFFN_ACT == CLFFN_ACT_RELU
  #define CLFFN_ACTIVATE(x) ((x) < 0.0f ? 0.0f : (x))
#elif CLFFN_ACT == CLFFN_ACT_GELU
  #define CLFFN_ACTIVATE(x) (0.5f * (x) * (1.0f + erf((x) * CLFFN_SQRT1_2)))
#elif CLFFN_ACT == CLFFN_ACT_GELU_TANH
  // 0.5·(1 + tanh(u)) written as 1 / (1 + exp(-2u)), the same function: POCL's tanh returns
  // -0.99999994 for large negative u (within OpenCL's 5-ulp bound), which made gelu_tanh(-100)
  // -3e-6 instead of -0 and gelu_tanh(-Inf) -Inf instead of the formula's NaN (-Inf · 0).
  #define CLFFN_GELU_TANH_U(x) (CLFFN_SQRT2_PI * ((x) + CLFFN_GELU_CUBE * (x) * (x) * (x)))
  #define CLFFN_ACTIVATE(x) ((x) / (1.0f + exp(-2.0f * CLFFN_GELU_TANH_U(x))))
#elif CLFFN_ACT == CLFFN_ACT_SILU
  #define CLFFN_ACTIVATE(x) ((x) / (1.0f + exp(-(x))))
#elif CLFFN_ACT == CLFFN_ACT_SIGMOID
  #define CLFFN_ACTIVATE(x) (1.0f / (1.0f + exp(-(x))))
#elif CLFFN_ACT == CLFFN_ACT_IDENTITY
  #define CLFFN_ACTIVATE(x) (x)
#else
  #error "unknown CLFFN_ACT"
#endif

// The derivative d act / dx, for the backward pass (the same forms, differentiated).
#if CLFFN_ACT == CLFFN_ACT_RELU
  #define CLFFN_ACTIVATE_GRAD(x) ((x) > 0.0f ? 1.0f : 0.0f)
#elif CLFFN_ACT == CLFFN_ACT_GELU
  #define CLFFN_INV_SQRT_2PI 0.39894228040143267794f // 1/sqrt(2*pi)
  #define CLFFN_ACTIVATE_GRAD(x) \
    (0.5f * (1.0f + erf((x) * CLFFN_SQRT1_2)) + (x) * exp(-0.5f * (x) * (x)) * CLFFN_INV_SQRT_2PI)
#elif CLFFN_ACT == CLFFN_ACT_GELU_TANH
  // with s = 0.5·(1 + tanh(u)) = 1 / (1 + exp(-2u)): 1 - tanh(u)² = 4·s·(1 - s)
  inline float clffn_gelu_tanh_grad(const float x) {
    const float s = 1.0f / (1.0f + exp(-2.0f * CLFFN_GELU_TANH_U(x)));
    return s + 2.0f * x * s * (1.0f - s) * CLFFN_SQRT2_PI * (1.0f + 3.0f * CLFFN_GELU_CUBE * x * x);
  }
  #define CLFFN_ACTIVATE_GRAD(x) clffn_gelu_tanh_grad(x)
#elif CLFFN_ACT == CLFFN_ACT_SILU
  inline float clffn_silu_grad(const float x) {
    const float s = 1.0f / (1.0f + exp(-x));
    return s * (1.0f + x * (1.0f - s));
  }
  #define CLFFN_ACTIVATE_GRAD(x) clffn_silu_grad(x)
#elif CLFFN_ACT == CLFFN_ACT_SIGMOID
  inline float clffn_sigmoid_grad(const float x) {
    const float s = 1.0f / (1.0f + exp(-x));
    return s * (1.0f - s);
  }
  #define CLFFN_ACTIVATE_GRAD(x) clffn_sigmoid_grad(x)
#else
  #define CLFFN_ACTIVATE_GRAD(x) 1.0f
#endif
