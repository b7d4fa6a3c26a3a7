#!/usr/bin/env python3
"""PyTorch's fp32 FFN on a CUDA GPU, timed the way clffn-bench times clffn's.

The comparison of the GPU section of docs/PERFORMANCE.md (scripts/gpu-report.sh runs it).

    scripts/torch-ffn-bench.py [--reps N] [--json] [--dtype fp32|fp16|bf16] SHAPE ...

SHAPE is TOKENS,D_MODEL,D_FF,ACTIVATION with ACTIVATION one of relu, gelu, gelu_tanh, silu,
sigmoid, identity, or a GLU name (swiglu, geglu, reglu): the seed modules' FeedForward,
act(x W1^T + b1) [* (x V^T + bv)] W2^T + b2, with nn.Linear's [out, in] weights.

Matrix products run in true fp32 (TF32 off for cuBLAS and cuDNN), so the comparison is with
clffn's SGEMMs. --dtype fp16 or bf16 keeps the weights, the biases and the activations in that
type, as a PyTorch user with torch.float16 weights runs them (cuBLAS accumulating in fp32): the
comparison for clffn's f16 and bf16 weights. Each forward is timed with CUDA events around it, best and median of N after two
warm-ups (clffn-bench's rule); the products alone (x W1^T, x V^T, h W2^T through torch.mm, no bias
or activation) are timed the same way, so the share outside cuBLAS shows.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

ACT = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "identity": lambda x: x,
}
GLU = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}


def timed(fn, reps):
    """Best and median seconds of reps calls after two warm-ups, CUDA events around each."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    times.sort()
    return times[0], times[len(times) // 2]


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def bench(tokens, d_model, d_ff, activation, reps, dtype="fp32"):
    gated = activation in GLU
    act = ACT[GLU.get(activation, activation)]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)

    def rnd(*shape, scale):
        return ((torch.rand(*shape, generator=g, device=dev) * 2 - 1) * scale).to(DTYPES[dtype])

    x = rnd(tokens, d_model, scale=1.0)
    w1, b1 = rnd(d_ff, d_model, scale=d_model**-0.5), rnd(d_ff, scale=d_model**-0.5)
    v, bv = rnd(d_ff, d_model, scale=d_model**-0.5), rnd(d_ff, scale=d_model**-0.5)
    w2, b2 = rnd(d_model, d_ff, scale=d_ff**-0.5), rnd(d_model, scale=d_ff**-0.5)
    h = torch.empty(tokens, d_ff, device=dev, dtype=DTYPES[dtype])

    def forward():
        a = act(F.linear(x, w1, b1))
        if gated:
            a = a * F.linear(x, v, bv)
        return F.linear(a, w2, b2)

    def products():
        torch.mm(x, w1.t())
        if gated:
            torch.mm(x, v.t())
        torch.mm(h, w2.t())

    with torch.no_grad():
        # the products' result must be the FFN's: checked once against float64 on the GPU
        ref = forward().double()  # in the weights' type: its rounding shows here
        a = act(F.linear(x.double(), w1.double(), b1.double()))
        if gated:
            a = a * F.linear(x.double(), v.double(), bv.double())
        want = F.linear(a, w2.double(), b2.double())
        rel = ((ref - want).norm() / want.norm()).item()
        best, median = timed(forward, reps)
        gemm_best, _ = timed(products, reps)
    flops = 2.0 * tokens * d_model * d_ff * (3 if gated else 2)
    return {
        "shape": f"{tokens},{d_model},{d_ff},{activation}",
        "dtype": dtype,
        "weights_bytes": d_ff * d_model * (3 if gated else 2) * DTYPES[dtype].itemsize,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "best_s": best,
        "median_s": median,
        "gflops": flops / best * 1e-9,
        "weights_gbps": d_ff * d_model * (3 if gated else 2) * DTYPES[dtype].itemsize / best * 1e-9,
        "gemms_best_s": gemm_best,
        "outside_gemm_share": max(0.0, 1 - gemm_best / best),
        "rel_error_vs_fp64": rel,
    }


def arguments(doc, prog):
    """The command line both benchmarks take, and true fp32 products; None without a GPU."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("shapes", nargs="+")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA device", file=sys.stderr)
        return None
    return a


def main():
    a = arguments(__doc__, "torch-ffn-bench")
    if a is None:
        return 1
    for s in a.shapes:
        t, d, f, act = s.split(",")
        if act not in ACT and act not in GLU:
            print(f"torch-ffn-bench: unknown activation {act}", file=sys.stderr)
            return 2
        r = bench(int(t), int(d), int(f), act, a.reps, a.dtype)
        if a.json:
            print(json.dumps(r))
        else:
            print(
                f"{r['shape']} {r['dtype']}: best {r['best_s'] * 1e3:.3f} ms, median"
                f" {r['median_s'] * 1e3:.3f} ms, {r['gflops']:.0f} GFLOP/s; products alone {r['gemms_best_s'] * 1e3:.3f}"
                f" ms ({100 * r['outside_gemm_share']:.1f}% outside); rel. error vs fp64"
                f" {r['rel_error_vs_fp64']:.1e}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
