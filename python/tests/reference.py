"""The FFN in numpy float64, written from the formulas (independent of clffn)."""
import math

import numpy as np

_erf = np.vectorize(math.erf)


def act(name, a):
    if name == "relu":
        return np.where(a > 0, a, 0.0)
    if name == "gelu":
        return 0.5 * a * (1.0 + _erf(a / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))
    if name == "silu":
        return a / (1.0 + np.exp(-a))
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-a))
    return a


def act_grad(name, a):
    if name == "relu":
        return (a > 0).astype(np.float64)
    if name == "gelu":
        return 0.5 * (1.0 + _erf(a / math.sqrt(2.0))) + a * np.exp(-0.5 * a * a) / math.sqrt(
            2.0 * math.pi)
    if name == "gelu_tanh":
        k = math.sqrt(2.0 / math.pi)
        u = k * (a + 0.044715 * a ** 3)
        t = np.tanh(u)
        return 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * a * a)
    if name == "silu":
        s = 1.0 / (1.0 + np.exp(-a))
        return s * (1.0 + a * (1.0 - s))
    if name == "sigmoid":
        s = 1.0 / (1.0 + np.exp(-a))
        return s * (1.0 - s)
    return np.ones_like(a)


def forward(x, w, activation, gated, residual=False, mask=None, p=0.0):
    """w: dict of float64 arrays in out_in layout (w1 [F, D], w2 [D, F], …); mask [T, F] of 0/1
    (kept) for training-mode dropout with probability p. Returns y and the pieces backward
    needs."""
    X = x.reshape(-1, x.shape[-1]).astype(np.float64)
    a = X @ w["w1"].T + (w["b1"] if w.get("b1") is not None else 0.0)
    g = X @ w["v"].T + (w["bv"] if w.get("bv") is not None else 0.0) if gated else None
    h = act(activation, a) * (g if gated else 1.0)
    scale = np.ones_like(h) if mask is None else mask / (1.0 - p)
    h = h * scale
    y = h @ w["w2"].T + (w["b2"] if w.get("b2") is not None else 0.0)
    if residual:
        y = y + X
    return y.reshape(x.shape), dict(X=X, a=a, g=g, h=h, scale=scale)


def backward(dy, w, activation, gated, residual, keep):
    D = dy.shape[-1]
    dY = dy.reshape(-1, D).astype(np.float64)
    X, a, g, h, s = keep["X"], keep["a"], keep["g"], keep["h"], keep["scale"]
    grads = {"w2": dY.T @ h, "b2": dY.sum(0)}
    dh = (dY @ w["w2"]) * s
    da = dh * act_grad(activation, a) * (g if gated else 1.0)
    grads["w1"] = da.T @ X
    grads["b1"] = da.sum(0)
    dx = da @ w["w1"]
    if gated:
        dg = dh * act(activation, a)
        grads["v"] = dg.T @ X
        grads["bv"] = dg.sum(0)
        dx = dx + dg @ w["v"]
    if residual:
        dx = dx + dY
    return dx.reshape(dy.shape), grads


def close(got, ref, rtol=1e-5, atol=1e-6):
    """clffn's tolerance: |got − ref| ≤ rtol·max|ref| + atol."""
    ref = np.asarray(ref, np.float64)
    err = np.abs(np.asarray(got, np.float64) - ref).max()
    tol = rtol * np.abs(ref).max() + atol
    assert err <= tol, f"max error {err:.3g} > tolerance {tol:.3g}"


# The weight types as GGUF rounds them: numpy ports of ggml's quantize_row_q8_0_ref and
# quantize_row_q4_0_ref, and bf16 to nearest even; each returns the values the device holds.
def q8_0(w):
    """GGUF's q8_0 of an [out, in] float32 matrix, dequantized (the values the device holds)."""
    b = w.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (b * idv[:, None]).astype(np.float32).astype(np.float64)
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)  # roundf: halves away from zero
    d16 = d.astype(np.float16).astype(np.float32)
    return (q.astype(np.float32) * d16[:, None]).reshape(w.shape)


def q4_0(w):
    b = w.astype(np.float32).reshape(-1, 32)
    i = np.abs(b).argmax(axis=1)  # the first of equal magnitudes, as the reference keeps
    mx = b[np.arange(len(b)), i]
    d = (mx / np.float32(-8)).astype(np.float32)
    idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = ((b * idv[:, None]).astype(np.float32) + np.float32(8.5)).astype(np.float32)
    q = np.minimum(15, np.trunc(v)).astype(np.float32)
    d16 = d.astype(np.float16).astype(np.float32)
    return ((q - 8) * d16[:, None]).reshape(w.shape)


def bf16(w):
    u = w.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return r.view(np.float32).reshape(w.shape)


DEQUANT = {"f32": lambda w: w.astype(np.float32), "f16": lambda w: w.astype(np.float16)
           .astype(np.float32), "bf16": bf16, "q8_0": q8_0, "q4_0": q4_0}
