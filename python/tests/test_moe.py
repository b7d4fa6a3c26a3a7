"""clffn.MoE against a numpy float64 mixture of experts written from the formulas, and
clffn.torch.MoE against a PyTorch (float64) Mixtral block: outputs, choices, and every gradient.

The router's inputs are dyadic (x and the router's weights in steps of 1/64), so its logits are
exact in float32 and float64 alike and both sides choose the same experts."""
import numpy as np
import pytest

import clffn
from reference import act

D, FF, E = 32, 48, 6


def dyadic(rng, shape, steps, den):
    return (rng.integers(-steps, steps + 1, shape) / den).astype(np.float32)


def reference(layer, x, routing):
    """y, chosen [T, k] and weights [T, k] of the layer's state_dict, in float64."""
    sd = {k: v.astype(np.float64) for k, v in layer.state_dict().items()}
    xs = x.reshape(-1, D).astype(np.float64)
    logits = xs @ sd["gate.weight"].T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    k = layer.top_k
    chosen = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # ties: the lower index first
    w = np.take_along_axis(p, chosen, 1)
    if routing == "normalized":
        w = w / w.sum(1, keepdims=True)
    y = np.zeros_like(xs)
    for t in range(xs.shape[0]):
        for j in range(k):
            e = f"experts.{chosen[t, j]}"
            h = act("silu", xs[t] @ sd[e + ".w1.weight"].T) * (xs[t] @ sd[e + ".w3.weight"].T)
            y[t] += w[t, j] * (h @ sd[e + ".w2.weight"].T)
    return y.reshape(x.shape), chosen, w


@pytest.mark.parametrize("routing", ["normalized", "topk"])
@pytest.mark.parametrize("tokens,k", [(1, 2), (7, 1), (40, 3)])
def test_forward_matches_numpy(routing, tokens, k):
    rng = np.random.default_rng(tokens * 10 + k)
    layer = clffn.MoE(D, FF, E, top_k=k, routing=routing)
    layer.set_router(dyadic(rng, (E, D), 16, 64))
    x = dyadic(rng, (tokens, D), 64, 64)
    y = layer(x)
    ref, chosen, w = reference(layer, x, routing)
    np.testing.assert_array_equal(layer.last_experts.reshape(-1, k), chosen)
    np.testing.assert_allclose(layer.last_weights.reshape(-1, k), w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("counts", ["host", "auto"])
def test_counts_on_the_host_give_the_same_bits(counts):
    rng = np.random.default_rng(11)
    a = clffn.MoE(D, FF, E, top_k=2)
    b = clffn.MoE(D, FF, E, top_k=2, counts=counts).load_state_dict(a.state_dict())
    x = dyadic(rng, (3, D), 64, 64)
    np.testing.assert_array_equal(a(x), b(x))
    np.testing.assert_array_equal(a.last_experts, b.last_experts)
    if counts == "host":
        assert not b.counts_kept
    with pytest.raises(clffn.ArgumentError):
        clffn.MoE(D, FF, E, counts="sideways")


def test_grouping_off_gives_the_same_bits():
    # f16 experts run clffn's own kernels at 3 tokens, so the counts stay on the device
    rng = np.random.default_rng(12)
    a = clffn.MoE(D, FF, E, top_k=2, weight_dtype="f16")
    b = clffn.MoE(D, FF, E, top_k=2, weight_dtype="f16", grouping=False)
    b.load_state_dict(a.state_dict())
    assert not a.grouped and not b.grouped  # no call yet
    assert not a.counts_kept
    x = dyadic(rng, (3, D), 64, 64)
    np.testing.assert_array_equal(a(x), b(x))
    np.testing.assert_array_equal(a.last_weights, b.last_weights)
    assert a.grouped and not b.grouped
    assert a.counts_kept and b.counts_kept  # one at a time, but each reading its count there


def test_state_dict_round_trip_and_bad_input():
    a = clffn.MoE(D, FF, E)
    b = clffn.MoE(D, FF, E).load_state_dict(a.state_dict())
    x = np.random.default_rng(3).standard_normal((4, D)).astype(np.float32)
    np.testing.assert_array_equal(a(x), b(x))
    with pytest.raises(clffn.ArgumentError):
        clffn.MoE(D, FF, 2, top_k=3)
    with pytest.raises(clffn.ArgumentError):
        a.set_router(np.zeros((E + 1, D), np.float32))
    with pytest.raises(clffn.ArgumentError):
        clffn.MoE(D, FF, E).backward(np.zeros((1, D), np.float32))


def test_aux_loss_is_k_for_a_tied_router():
    layer = clffn.MoE(D, FF, E, top_k=2, aux_loss_coef=0.1)
    layer.set_router(np.zeros((E, D), np.float32))
    layer(np.ones((5, D), np.float32))
    assert abs(layer.aux_loss() - 2.0) < 1e-6


torch = pytest.importorskip("torch")
import clffn.torch as ct  # noqa: E402
from reference import DEQUANT  # noqa: E402


class MixtralBlock(torch.nn.Module):
    """Mixtral's MixtralSparseMoeBlock, written out (its routing, its expert MLP), y only."""

    def __init__(self, d, f, e, k):
        super().__init__()
        self.k = k
        self.gate = torch.nn.Linear(d, e, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.ModuleDict(
            {n: torch.nn.Linear(*s, bias=False) for n, s in
             (("w1", (d, f)), ("w2", (f, d)), ("w3", (d, f)))}) for _ in range(e))

    def forward(self, x):
        logits = self.gate(x)
        p = torch.softmax(logits, dim=-1)
        w, chosen = torch.topk(p, self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        y = torch.zeros_like(x)
        for j in range(self.k):
            for e, ex in enumerate(self.experts):
                mask = (chosen[:, j] == e).unsqueeze(-1).to(x.dtype)
                h = torch.nn.functional.silu(ex["w1"](x)) * ex["w3"](x)
                y = y + mask * w[:, j:j + 1] * ex["w2"](h)
        return y


def matches_module(mine, ref, tokens, seed):
    """mine (a clffn.torch module) against ref (the float64 PyTorch block with the same
    parameters) on dyadic x [tokens, D]: y, dx and every parameter's gradient."""
    x = torch.from_numpy(dyadic(np.random.default_rng(seed), (tokens, D), 64, 64))
    xr = x.double().requires_grad_(True)
    xm = x.clone().requires_grad_(True)
    dy = torch.from_numpy(np.random.default_rng(seed + 1).standard_normal((tokens, D)))
    yr, ym = ref(xr), mine(xm)
    np.testing.assert_allclose(ym.detach().numpy(), yr.detach().numpy(), rtol=0,
                               atol=1e-5 * yr.abs().max().item())
    (yr * dy).sum().backward()
    (ym * dy.float()).sum().backward()
    np.testing.assert_allclose(xm.grad.numpy(), xr.grad.numpy(), rtol=0,
                               atol=1e-5 * xr.grad.abs().max().item())
    theirs = dict(ref.named_parameters())
    for name, p in mine.named_parameters():
        if not p.requires_grad:  # an expert's matrix kept compressed: frozen
            assert p.grad is None, name
            continue
        g = theirs[name].grad
        want = np.zeros(p.shape) if g is None else g.numpy()
        assert p.grad is not None, name
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=0,
                                   atol=1e-5 * max(np.abs(want).max(), 1e-3), err_msg=name)


@pytest.mark.parametrize("counts", ["device", "host"])
def test_torch_module_matches_mixtral_block_and_its_gradients(counts):
    torch.manual_seed(0)
    ref = MixtralBlock(D, FF, E, 2).double()
    mine = ct.MoE(D, FF, experts=E, top_k=2, counts=counts)
    with torch.no_grad():
        rng = np.random.default_rng(5)
        ref.gate.weight.copy_(torch.from_numpy(dyadic(rng, (E, D), 16, 64)))
    mine.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    matches_module(mine, ref, 9, 6)


class Qwen2MoeBlock(torch.nn.Module):
    """Qwen2-MoE's sparse MoE block (Qwen2MoeSparseMoeBlock, norm_topk_prob false), written
    out: its routing, its experts' MLP (gate_proj, up_proj, down_proj), and the shared expert of
    its own width behind shared_expert_gate's sigmoid, y only."""

    def __init__(self, d, f, e, k, fs):
        super().__init__()
        self.k = k
        self.gate = torch.nn.Linear(d, e, bias=False)
        mlp = lambda w: torch.nn.ModuleDict({n: torch.nn.Linear(*s, bias=False) for n, s in (
            ("gate_proj", (d, w)), ("up_proj", (d, w)), ("down_proj", (w, d)))})
        self.experts = torch.nn.ModuleList(mlp(f) for _ in range(e))
        self.shared_expert = mlp(fs)
        self.shared_expert_gate = torch.nn.Linear(d, 1, bias=False)

    @staticmethod
    def run(m, x):
        return m["down_proj"](torch.nn.functional.silu(m["gate_proj"](x)) * m["up_proj"](x))

    def forward(self, x):
        p = torch.softmax(self.gate(x), dim=-1)
        w, chosen = torch.topk(p, self.k, dim=-1)
        y = torch.zeros_like(x)
        for j in range(self.k):
            for e, ex in enumerate(self.experts):
                mask = (chosen[:, j] == e).unsqueeze(-1).to(x.dtype)
                y = y + mask * w[:, j:j + 1] * self.run(ex, x)
        s = torch.sigmoid(self.shared_expert_gate(x))
        return y + s * self.run(self.shared_expert, x)


def round_experts(block, dtype):
    """The float64 block's experts' matrices rounded to dtype as GGUF rounds them (reference.py's
    ports): the values the device computes with."""
    with torch.no_grad():
        for name, m in block.named_modules():
            if isinstance(m, torch.nn.Linear) and name not in ("gate", "shared_expert_gate"):
                w = DEQUANT[dtype](m.weight.float().numpy()).astype(np.float64)
                m.weight.copy_(torch.from_numpy(w))


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0", "q4_0"])
@pytest.mark.parametrize("tokens", [1, 9])
def test_torch_moe_with_compressed_experts_matches_the_rounded_block(dtype, tokens):
    """Experts kept compressed and frozen: y, dx and the router's gradient are those of the
    float64 block whose experts' matrices are rounded to the type; the experts get none."""
    torch.manual_seed(3)
    fq = 64  # W2's input dimension: a multiple of 32
    ref = MixtralBlock(D, fq, E, 2).double()
    with torch.no_grad():
        ref.gate.weight.copy_(torch.from_numpy(dyadic(np.random.default_rng(13), (E, D), 16, 64)))
    mine = ct.MoE(D, fq, experts=E, top_k=2, weight_dtype=dtype)
    mine.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    round_experts(ref, dtype)
    assert mine.gate.weight.requires_grad and not mine.experts[0].w3.weight.requires_grad
    matches_module(mine, ref, tokens, 14)
    assert np.abs(mine.gate.weight.grad.numpy()).max() > 0


def test_torch_qwen2_moe_with_q8_0_experts_matches_the_rounded_block():
    torch.manual_seed(4)
    fq = 64
    ref = Qwen2MoeBlock(D, fq, E, 2, 2 * fq).double()
    with torch.no_grad():
        ref.gate.weight.copy_(torch.from_numpy(dyadic(np.random.default_rng(15), (E, D), 16, 64)))
    mine = ct.Qwen2MoE(D, fq, experts=E, top_k=2, shared_d_ff=2 * fq, weight_dtype="q8_0")
    mine.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    round_experts(ref, "q8_0")
    assert not mine.shared_expert.down_proj.weight.requires_grad
    matches_module(mine, ref, 5, 16)
    assert np.abs(mine.shared_expert_gate.weight.grad.numpy()).max() > 0


def test_torch_qwen2_moe_loads_the_blocks_state_dict_and_matches_its_gradients():
    """clffn.torch.Qwen2MoE takes the block's state_dict under Qwen's own names and gives its
    outputs and every parameter's gradient, the shared expert and its gate included."""
    torch.manual_seed(2)
    FS = 3 * FF
    ref = Qwen2MoeBlock(D, FF, E, 2, FS).double()
    mine = ct.Qwen2MoE(D, FF, experts=E, top_k=2, shared_d_ff=FS)
    with torch.no_grad():
        ref.gate.weight.copy_(torch.from_numpy(dyadic(np.random.default_rng(11), (E, D), 16, 64)))
    assert sorted(mine.state_dict()) == sorted(ref.state_dict())
    mine.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    matches_module(mine, ref, 6, 12)
    assert np.abs(mine.shared_expert_gate.weight.grad.numpy()).max() > 0


def test_qwen2_moe_shared_expert_gate_matches_torch_and_its_gradients():
    torch.manual_seed(1)
    FS = 2 * FF
    ref = Qwen2MoeBlock(D, FF, E, 2, FS).double()
    rng = np.random.default_rng(8)
    with torch.no_grad():
        ref.gate.weight.copy_(torch.from_numpy(dyadic(rng, (E, D), 16, 64)))
    layer = clffn.MoE(D, FF, E, top_k=2, routing="topk", shared_expert=True, shared_d_ff=FS,
                      shared_gate=True)
    names = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    sd = {"gate.weight": ref.gate.weight,
          "shared_expert_gate.weight": ref.shared_expert_gate.weight}
    for i, ex in enumerate(list(ref.experts) + [ref.shared_expert]):
        prefix = f"experts.{i}" if i < E else "shared_expert"
        sd.update({f"{prefix}.{c}.weight": ex[q].weight for c, q in names.items()})
    layer.load_state_dict({k: v.detach().float().numpy() for k, v in sd.items()})
    x = dyadic(np.random.default_rng(9), (7, D), 64, 64)
    dy = np.random.default_rng(10).standard_normal((7, D)).astype(np.float32)
    xr = torch.from_numpy(x).double().requires_grad_(True)
    yr = ref(xr)
    (yr * torch.from_numpy(dy).double()).sum().backward()
    y = layer(x)
    np.testing.assert_allclose(y, yr.detach().numpy(), rtol=0,
                               atol=1e-5 * yr.abs().max().item())
    dx, grads = layer.backward(dy)
    np.testing.assert_allclose(dx, xr.grad.numpy(), rtol=0,
                               atol=1e-5 * xr.grad.abs().max().item())
    assert grads["shared_expert_gate.weight"].shape == (1, D)
    assert grads["shared_expert.w1.weight"].shape == (FS, D)
    for name, p in sd.items():
        want = np.zeros(p.shape) if p.grad is None else p.grad.numpy()
        np.testing.assert_allclose(grads[name], want, rtol=0,
                                   atol=1e-5 * max(np.abs(want).max(), 1e-3), err_msg=name)
    with pytest.raises(clffn.ArgumentError):
        clffn.MoE(D, FF, E, shared_gate=True)  # a gate without a shared expert
    with pytest.raises(clffn.ArgumentError):
        layer.set_router(sd["gate.weight"].detach().numpy())  # the gate missing
