#!/usr/bin/env python3
"""PyTorch's mixture-of-experts layer on a CUDA GPU, timed the way clffn-bench --experts times clffn's.

The comparison for clffn's MoE layer in the GPU section of docs/PERFORMANCE.md.

    scripts/torch-moe-bench.py [--reps N] [--json] [--dtype fp32|fp16|bf16] SHAPE ...

SHAPE is TOKENS,D_MODEL,D_FF,EXPERTS,TOP_K: Mixtral's sparse MoE block as Hugging Face's
MixtralSparseMoeBlock runs it (transformers 4.x): router logits x·Wg^T, softmax in fp32, top-k, the
k weights renormalised, then for each expert that a token chose, its tokens gathered, the SwiGLU
expert (w2(silu(w1 x) * w3 x), no biases) run on them, scaled by their routing weights and
index_add_-ed into the output. That loop reads the chosen experts' token lists back to the host
(torch.where), as every eager PyTorch MoE does.

Matrix products run in true fp32 (TF32 off) for fp32; --dtype fp16 or bf16 keeps the weights and
activations in that type. Best and median of N forwards after two warm-ups, CUDA events around
each; the result is checked once against the same layer in float64.
"""
import importlib.util
import json
import os
import sys

import torch
import torch.nn.functional as F

# the timer, the types and the command line are torch-ffn-bench.py's, beside this file
_spec = importlib.util.spec_from_file_location(
    "torch_ffn_bench", os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch-ffn-bench.py")
)
_ffn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_ffn)
DTYPES, timed = _ffn.DTYPES, _ffn.timed


def moe_forward(x, wg, experts, top_k):
    """Mixtral's block: x [T, D], wg [E, D], experts a list of (w1 [F, D], w3 [F, D], w2 [D, F])."""
    probs = F.softmax(F.linear(x, wg).float(), dim=-1)
    weights, chosen = torch.topk(probs, top_k, dim=-1)
    weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
    out = torch.zeros_like(x)
    mask = F.one_hot(chosen, num_classes=len(experts)).permute(2, 1, 0)  # [E, k, T]
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        w1, w3, w2 = experts[e]
        slot, rows = torch.where(mask[e].squeeze(0))
        xs = x[rows]
        ys = F.linear(F.silu(F.linear(xs, w1)) * F.linear(xs, w3), w2)
        out.index_add_(0, rows, ys * weights[rows, slot, None])
    return out, chosen


def bench(tokens, d_model, d_ff, n_experts, top_k, reps, dtype):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    dt = DTYPES[dtype]

    def rnd(*shape, scale):
        return ((torch.rand(*shape, generator=g, device=dev) * 2 - 1) * scale).to(dt)

    x = rnd(tokens, d_model, scale=1.0)
    wg = rnd(n_experts, d_model, scale=d_model**-0.5)
    experts = [
        (
            rnd(d_ff, d_model, scale=d_model**-0.5),
            rnd(d_ff, d_model, scale=d_model**-0.5),
            rnd(d_model, d_ff, scale=d_ff**-0.5),
        )
        for _ in range(n_experts)
    ]
    with torch.no_grad():
        y, chosen = moe_forward(x, wg, experts, top_k)
        wide = [tuple(w.double() for w in e) for e in experts]
        want, _ = moe_forward(x.double(), wg.double(), wide, top_k)
        rel = ((y.double() - want).norm() / want.norm()).item()
        n_chosen = int(torch.unique(chosen).numel())
        best, median = timed(lambda: moe_forward(x, wg, experts, top_k), reps)
    read = (n_experts * d_model + n_chosen * 3 * d_model * d_ff) * dt.itemsize
    return {
        "shape": f"{tokens},{d_model},{d_ff},{n_experts},{top_k}",
        "dtype": dtype,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "best_s": best,
        "median_s": median,
        "experts_chosen": n_chosen,
        "weights_read_bytes": read,
        "weights_gbps": read / best * 1e-9,
        "gflops": 2.0 * tokens * top_k * 3 * d_model * d_ff / best * 1e-9,
        "rel_error_vs_fp64": rel,
    }


def main():
    a = _ffn.arguments(__doc__, "torch-moe-bench")
    if a is None:
        return 1
    for s in a.shapes:
        t, d, f, e, k = (int(v) for v in s.split(","))
        if not 1 <= k <= e:
            print(f"torch-moe-bench: top-k {k} outside 1..{e}", file=sys.stderr)
            return 2
        r = bench(t, d, f, e, k, a.reps, a.dtype)
        if a.json:
            print(json.dumps(r))
        else:
            print(
                f"{r['shape']} {r['dtype']}: best {r['best_s'] * 1e3:.3f} ms, median"
                f" {r['median_s'] * 1e3:.3f} ms, {r['experts_chosen']} experts read at"
                f" {r['weights_gbps']:.0f} GB/s; rel. error vs fp64 {r['rel_error_vs_fp64']:.1e}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
