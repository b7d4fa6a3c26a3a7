// =================================================================================================
// activation.cl — the hidden activations, written once for float and floatN.
//
// Every form is the exact one (no fast-math, no approximations beyond the built-ins' ulp bounds,
// and erf is our own with a measured bound tighter than the built-in's): llm.c's #168 shows how
// quietly fast-math breaks GELU. NaN propagates: relu(NaN) is NaN, since the comparison with 0 is
// false for NaN and the input is passed through.
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

// -------------------------------------------------------------------------------------------------
// erf, our own: the built-in erf is allowed 16 ulp and on POCL it is a scalar call per element,
// 3.5x the cost of the whole ReLU epilogue at BERT's shape. This one is branch-free (both regions
// computed, one selected: the same instructions for every lane, so it vectorises), one division,
// and its error over all 2^32 floats is at most 1.12 ulp on POCL and on an H100, against the
// built-in's 16 allowed (docs/PERFORMANCE.md has the measurement; tests/test_erf.c keeps it so).
//   |x| < 1:      erf(x) = x + x·P(x²)/Q(x²)       (fdlibm's form: the leading x is exact)
//   1 <= |x| < 4: erf(x) = 1 - R(|x| - 1.5)/S(|x| - 1.5)   (the rational is erfc, and is small)
//   |x| >= 4:     erf(x) = ±1 (erfc(4) = 1.5e-8 is under 0.5 ulp of 1)
// The coefficients are a minimax fit (scripts/fit-erf.py: Lawson's iteration on relative error
// below 1, absolute error above; max fit error 2.7e-11 and 4.7e-9); the Horner steps are fma()
// so that every device rounds them alike. NaN stays NaN: the clamp is a select on a comparison
// that is false for NaN.
#define CLFFN_ERF_SP0  1.283791661e-01f
#define CLFFN_ERF_SP1 -3.203854263e-01f
#define CLFFN_ERF_SP2 -4.090348259e-02f
#define CLFFN_ERF_SP3 -5.235819612e-03f
#define CLFFN_ERF_SQ1  4.341900647e-01f
#define CLFFN_ERF_SQ2  7.453610748e-02f
#define CLFFN_ERF_SQ3  5.239308812e-03f
#define CLFFN_ERF_LP0  3.389485180e-02f
#define CLFFN_ERF_LP1 -8.429218084e-02f
#define CLFFN_ERF_LP2  8.920121938e-02f
#define CLFFN_ERF_LP3 -5.134879053e-02f
#define CLFFN_ERF_LP4  1.693095081e-02f
#define CLFFN_ERF_LP5 -3.026034916e-03f
#define CLFFN_ERF_LP6  2.285552182e-04f
#define CLFFN_ERF_LQ1  1.021926761e+00f
#define CLFFN_ERF_LQ2  9.542308450e-01f
#define CLFFN_ERF_LQ3  5.483120084e-01f
#define CLFFN_ERF_LQ4  2.688080966e-01f
#define CLFFN_ERF_LQ5  9.041285515e-02f
#define CLFFN_ERF_LQ6  1.994158328e-02f

// The one quotient. OpenCL lets a device's division be 2.5 ulp off unless the program is built
// with -cl-fp32-correctly-rounded-divide-sqrt, and NVIDIA's is (erf reached 1.130 ulp on an H100
// with it, against 1.113 with POCL's IEEE division). The host builds with that option wherever
// the device offers it and says so with CLFFN_EXACT_DIVISION; elsewhere the quotient gets one
// correction step, q + (n - q·d)·(1/d) with the residual exact by fma, which leaves it within
// about 0.5 ulp whatever the reciprocal's error (the accuracy test's probe runs that step with a
// reciprocal 2 ulp off to prove it).
#define CLFFN_RECIP(d) (1.0f / (d))
// A reciprocal 2 ulp off, up or down by the divisor's last mantissa bit: the worst division
// OpenCL allows, short of its 2.5-ulp bound.
#define CLFFN_RECIP_2ULP_OFF(d) as_float(as_int(1.0f / (d)) + (as_int(d) & 1) * 4 - 2)
#define CLFFN_RECIP4_2ULP_OFF(d) as_float4(as_int4(1.0f / (d)) + (as_int4(d) & 1) * 4 - 2)
#define CLFFN_DEFINE_CORRECTED_QUOTIENT(name, T, RECIP)                                          \
  inline T name(const T n, const T d) {                                                         \
    const T inv = RECIP(d), q = n * inv;                                                        \
    return fma(fma(-q, d, n), inv, q);                                                          \
  }
#ifdef CLFFN_EXACT_DIVISION
inline float clffn_quotient(const float n, const float d) { return n / d; }
inline float4 clffn_quotient4(const float4 n, const float4 d) { return n / d; }
#else
CLFFN_DEFINE_CORRECTED_QUOTIENT(clffn_quotient, float, CLFFN_RECIP)
CLFFN_DEFINE_CORRECTED_QUOTIENT(clffn_quotient4, float4, CLFFN_RECIP)
#endif
CLFFN_DEFINE_CORRECTED_QUOTIENT(clffn_quotient_2ulp, float, CLFFN_RECIP_2ULP_OFF)
CLFFN_DEFINE_CORRECTED_QUOTIENT(clffn_quotient4_2ulp, float4, CLFFN_RECIP4_2ULP_OFF)

// One body for float and float4 (OpenCL C has no overloading of user functions): select() and
// the relational built-ins take both, with IT, T's integer type, as the condition; QUOTIENT is
// one of the quotients above.
#define CLFFN_DEFINE_ERF(name, T, IT, QUOTIENT)                                                  \
  inline T name(const T x) {                                                                    \
    const T ax = fabs(x);                                                                       \
    const T a = select(ax, (T)(4.0f), isgreater(ax, (T)(4.0f)));                                \
    const T s = a * a, t = a - (T)(1.5f);                                                       \
    T sp = fma((T)(CLFFN_ERF_SP3), s, (T)(CLFFN_ERF_SP2));                                      \
    sp = fma(fma(sp, s, (T)(CLFFN_ERF_SP1)), s, (T)(CLFFN_ERF_SP0));                            \
    T sq = fma((T)(CLFFN_ERF_SQ3), s, (T)(CLFFN_ERF_SQ2));                                      \
    sq = fma(fma(sq, s, (T)(CLFFN_ERF_SQ1)), s, (T)(1.0f));                                     \
    T lp = fma((T)(CLFFN_ERF_LP6), t, (T)(CLFFN_ERF_LP5));                                      \
    lp = fma(fma(lp, t, (T)(CLFFN_ERF_LP4)), t, (T)(CLFFN_ERF_LP3));                            \
    lp = fma(fma(fma(lp, t, (T)(CLFFN_ERF_LP2)), t, (T)(CLFFN_ERF_LP1)), t, (T)(CLFFN_ERF_LP0));\
    T lq = fma((T)(CLFFN_ERF_LQ6), t, (T)(CLFFN_ERF_LQ5));                                      \
    lq = fma(fma(lq, t, (T)(CLFFN_ERF_LQ4)), t, (T)(CLFFN_ERF_LQ3));                            \
    lq = fma(fma(fma(lq, t, (T)(CLFFN_ERF_LQ2)), t, (T)(CLFFN_ERF_LQ1)), t, (T)(1.0f));         \
    const IT large = isgreaterequal(a, (T)(1.0f));                                              \
    const T r = QUOTIENT(select(sp, lp, large), select(sq, lq, large));                         \
    return copysign(select(fma(a, r, a), (T)(1.0f) - r, large), x);                             \
  }
CLFFN_DEFINE_ERF(clffn_erf, float, int, clffn_quotient)
CLFFN_DEFINE_ERF(clffn_erf4, float4, int4, clffn_quotient4)
CLFFN_DEFINE_ERF(clffn_erf_2ulp_div, float, int, clffn_quotient_2ulp)
CLFFN_DEFINE_ERF(clffn_erf4_2ulp_div, float4, int4, clffn_quotient4_2ulp)

#ifndef CLFFN_WTYPE // not in the weight kernels' programs (src/program.c)
// erf of n floats whose bit patterns are first, first + stride, …: the accuracy test's probe of
// clffn_erf and clffn_erf4 (form & CLFFN_ERF_PROBE_VEC: four consecutive patterns per
// work-item), with no input buffer, so every float can be swept in chunks; with
// CLFFN_ERF_PROBE_DIV_2ULP the same functions through the corrected quotient with a reciprocal
// 2 ulp off, whatever the device's division.
__kernel void clffn_erf_probe(__global float *restrict y, const uint first, const uint stride,
                              const ulong n, const uint form) {
  const ulong i0 = (ulong)get_global_id(0) * 4;
  if (i0 >= n) { return; }
  const int off = (form & CLFFN_ERF_PROBE_DIV_2ULP) != 0;
  if ((form & CLFFN_ERF_PROBE_VEC) && i0 + 4 <= n) {
    const float4 x = as_float4((uint4)(first) + (uint4)(0, 1, 2, 3) * stride + (uint)i0 * stride);
    vstore4(off ? clffn_erf4_2ulp_div(x) : clffn_erf4(x), 0, y + i0);
    return;
  }
  for (ulong i = i0; i < i0 + 4 && i < n; ++i) {
    const float x = as_float(first + (uint)i * stride);
    y[i] = off ? clffn_erf_2ulp_div(x) : clffn_erf(x);
  }
}
#endif

// Each form by name; CLFFN_ACTIVATE below is the program's own. 0.5·(1 + tanh(u)) in
// gelu_tanh is written as 1 / (1 + exp(-2u)), the same function: POCL's tanh returns -0.99999994
// for large negative u (within OpenCL's 5-ulp bound), which made gelu_tanh(-100) -3e-6 instead
// of -0 and gelu_tanh(-Inf) -Inf instead of the formula's NaN (-Inf · 0).
#define CLFFN_RELU(x) ((x) < 0.0f ? 0.0f : (x))
#define CLFFN_GELU(x) (0.5f * (x) * (1.0f + clffn_erf((x) * CLFFN_SQRT1_2)))
#define CLFFN_GELU4(x) (0.5f * (x) * (1.0f + clffn_erf4((x) * CLFFN_SQRT1_2)))
#define CLFFN_GELU_TANH_U(x) (CLFFN_SQRT2_PI * ((x) + CLFFN_GELU_CUBE * (x) * (x) * (x)))
#define CLFFN_GELU_TANH(x) ((x) / (1.0f + exp(-2.0f * CLFFN_GELU_TANH_U(x))))
#define CLFFN_SILU(x) ((x) / (1.0f + exp(-(x))))
#define CLFFN_SIGMOID(x) (1.0f / (1.0f + exp(-(x))))

#if CLFFN_ACT == CLFFN_ACT_RELU
  #define CLFFN_ACTIVATE(x) CLFFN_RELU(x)
#elif CLFFN_ACT == CLFFN_ACT_GELU
  #define CLFFN_ACTIVATE(x) CLFFN_GELU(x)
  #define CLFFN_ACTIVATE4(x) CLFFN_GELU4(x)
#elif CLFFN_ACT == CLFFN_ACT_GELU_TANH
  #define CLFFN_ACTIVATE(x) CLFFN_GELU_TANH(x)
#elif CLFFN_ACT == CLFFN_ACT_SILU
  #define CLFFN_ACTIVATE(x) CLFFN_SILU(x)
#elif CLFFN_ACT == CLFFN_ACT_SIGMOID
  #define CLFFN_ACTIVATE(x) CLFFN_SIGMOID(x)
#elif CLFFN_ACT == CLFFN_ACT_IDENTITY
  #define CLFFN_ACTIVATE(x) (x)
#else
  #error "unknown CLFFN_ACT"
#endif

// The activation act (a clffn_activation id) of one float, for kernels built for every
// activation at once (the weight kernels' fused epilogue, cl/weights.cl): the same expressions
// as CLFFN_ACTIVATE and CLFFN_ACTIVATE4, chosen at run time by a uniform branch. vec4 computes x
// as one lane of a float4, as the epilogue's float4 path does: a device's vector exp may round
// otherwise than its scalar one (POCL's did, by an ulp), and the fused value is the bits of the
// epilogue's.
inline float clffn_activate_by(const uint act, const float x, const int vec4) {
  const float4 v = (float4)(x);
  switch (act) {
  case CLFFN_ACT_RELU: return CLFFN_RELU(x);
  case CLFFN_ACT_GELU: return vec4 ? CLFFN_GELU4(v).x : CLFFN_GELU(x);
  case CLFFN_ACT_GELU_TANH: return vec4 ? CLFFN_GELU_TANH(v).x : CLFFN_GELU_TANH(x);
  case CLFFN_ACT_SILU: return vec4 ? CLFFN_SILU(v).x : CLFFN_SILU(x);
  case CLFFN_ACT_SIGMOID: return vec4 ? CLFFN_SIGMOID(v).x : CLFFN_SIGMOID(x);
  default: return x;
  }
}
// CLFFN_ACTIVATE takes a float; CLFFN_ACTIVATE4 a float4, and is the same expression where the
// form uses only built-ins, which take either.
#ifndef CLFFN_ACTIVATE4
  #define CLFFN_ACTIVATE4(x) CLFFN_ACTIVATE(x)
#endif

// The derivative d act / dx, for the backward pass (the same forms, differentiated).
#if CLFFN_ACT == CLFFN_ACT_RELU
  #define CLFFN_ACTIVATE_GRAD(x) ((x) > 0.0f ? 1.0f : 0.0f)
#elif CLFFN_ACT == CLFFN_ACT_GELU
  #define CLFFN_INV_SQRT_2PI 0.39894228040143267794f // 1/sqrt(2*pi)
  #define CLFFN_GELU_PDF_TERM(x) ((x) * exp(-0.5f * (x) * (x)) * CLFFN_INV_SQRT_2PI)
  #define CLFFN_ACTIVATE_GRAD(x) \
    (0.5f * (1.0f + clffn_erf((x) * CLFFN_SQRT1_2)) + CLFFN_GELU_PDF_TERM(x))
  #define CLFFN_ACTIVATE_GRAD4(x) \
    (0.5f * (1.0f + clffn_erf4((x) * CLFFN_SQRT1_2)) + CLFFN_GELU_PDF_TERM(x))
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

// The derivative of four elements at once: the forms above are written for float (their helper
// functions take one), so by lanes unless the form defines its own float4 version.
#ifndef CLFFN_ACTIVATE_GRAD4
  #define CLFFN_ACTIVATE_GRAD4(a)                                                   \
    ((float4)(CLFFN_ACTIVATE_GRAD((a).x), CLFFN_ACTIVATE_GRAD((a).y),                \
              CLFFN_ACTIVATE_GRAD((a).z), CLFFN_ACTIVATE_GRAD((a).w)))
#endif
