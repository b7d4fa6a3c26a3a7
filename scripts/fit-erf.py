#!/usr/bin/env python3
"""Fits the coefficients of the kernels' own erf (cl/activation.cl) and prints them as its
#defines, with an estimate of the float error (the measured figure comes from tests/test_erf.c on
the device).

    /usr/bin/python3 scripts/fit-erf.py        (needs numpy: Debian's python3-numpy)

The form, chosen so that a float evaluation rounds little:
    |x| < 1:      erf(x) = x + x * P(s)/Q(s),  s = x^2       P degree 3, Q degree 3 (Q(0) = 1)
    1 <= |x| < 4: erf(x) = 1 - R(t)/S(t),      t = |x| - 1.5 R degree 6, S degree 6 (S(0) = 1)
Below 1 the rational is erf(x)/x - 1, small, fitted for relative error of erf; above 1 it is
erfc, fitted for absolute error (what 1 - erfc keeps of it). Centring t at 1.5 keeps the
alternating Horner terms from cancelling (centred at 0 the float error was 2.1 ulp, at 1.5
under 1.1). Fits are Lawson's iteration: weighted linear least squares on the linearised
problem N - f*D = 0, the weights multiplied by the error each round, which tends to minimax.
"""
from math import erf, erfc

import numpy as np

SPLIT, CENTRE, CLAMP = 1.0, 1.5, 4.0
N_POINTS = 30000


def chebyshev_points(a, b):
    t = np.cos(np.linspace(np.pi, 0.0, N_POINTS))
    return (t + 1.0) / 2.0 * (b - a) + a


def lawson(f, num_basis, den_basis, scale, rounds=300):
    """Minimises max |scale * (N/D - f)|, N = num_basis @ a, D = 1 + den_basis @ b."""
    w = np.full(len(f), 1.0 / len(f))
    den = np.ones_like(f)
    best = None
    for _ in range(rounds):
        lhs = np.hstack([num_basis, -f[:, None] * den_basis])
        row = np.sqrt(w) * scale / np.abs(den)
        c, *_ = np.linalg.lstsq(lhs * row[:, None], f * row, rcond=None)
        a, b = c[: num_basis.shape[1]], c[num_basis.shape[1]:]
        den = 1.0 + den_basis @ b
        err = np.abs(scale * ((num_basis @ a) / den - f))
        if best is None or err.max() < best[2]:
            best = (a, b, err.max())
        w = w * err
        w /= w.sum()
    return best


def horner(coefs, t):
    """float32 Horner with each step an fma (emulated: the product is exact in double)."""
    r = np.full_like(t, np.float32(coefs[-1]))
    for c in coefs[-2::-1]:
        r = (r.astype(np.float64) * t + np.float64(np.float32(c))).astype(np.float32)
    return r


def main():
    x = chebyshev_points(1e-4, SPLIT)
    s = x * x
    f = np.array([erf(v) for v in x])
    sp, sq, e_small = lawson(f / x - 1.0, s[:, None] ** np.arange(4), s[:, None] ** np.arange(1, 4),
                             x / f)
    x = chebyshev_points(SPLIT, CLAMP)
    t = x - CENTRE
    lp, lq, e_large = lawson(np.array([erfc(v) for v in x]), t[:, None] ** np.arange(7),
                             t[:, None] ** np.arange(1, 7), np.ones_like(x))
    print(f"// fit: relative error {e_small:.2g} below {SPLIT}, absolute {e_large:.2g} above")
    for name, coefs, first in (("SP", sp, 0), ("SQ", sq, 1), ("LP", lp, 0), ("LQ", lq, 1)):
        for i, c in enumerate(coefs):
            print(f"#define CLFFN_ERF_{name}{i + first} {np.float32(c): .9e}f")

    # the float evaluation, as the kernel does it, on a dense sample of [0, 4.1]
    xs = np.concatenate([np.linspace(0.0, 4.1, 400001),
                         np.random.default_rng(0).uniform(0.0, 4.1, 200000)]).astype(np.float32)
    a = np.minimum(xs, np.float32(CLAMP))
    large = a >= np.float32(SPLIT)
    ss = (a * a).astype(np.float32)
    tt = (a - np.float32(CENTRE)).astype(np.float32)
    num = np.where(large, horner(lp, tt), horner(sp, ss))
    den = np.where(large, horner(np.r_[1.0, lq], tt), horner(np.r_[1.0, sq], ss))
    r = (num / den).astype(np.float32)
    got = np.where(large, np.float32(1.0) - r, (a.astype(np.float64) * r + a).astype(np.float32))
    ref = np.array([erf(float(v)) for v in xs])
    _, e = np.frexp(ref)
    ulp = np.ldexp(1.0, np.maximum(e - 1, -126) - 23)
    err = np.abs(got.astype(np.float64) - ref) / ulp
    print(f"// float estimate on {len(xs)} points: max {err.max():.2f} ulp at x = {xs[err.argmax()]}")


if __name__ == "__main__":
    main()
