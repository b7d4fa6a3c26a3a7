"""PyTorch modules whose forward and backward run on clffn (needs python3-torch).

    import torch, clffn.torch
    ff = clffn.torch.FeedForward(512, 2048, dropout=0.1)        # PositionwiseFeedForward's
    y = ff(x); y.sum().backward()                                # w_1/w_2 .grad filled
    ff2 = clffn.torch.from_module(existing_module)               # copies its weights

The parameters are ordinary torch Parameters (float32, on the CPU), named as in the reference
modules: w_1, w_2 for a plain FFN (the Annotated Transformer's PositionwiseFeedForward), layer1,
layer2 and linear_v for a gated one (labml's FeedForward), so their state_dicts load as they are.
Every forward uploads the current parameters, so an optimizer's step is seen by the next call.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._ffn import FFN, ArgumentError, INVALID_ARGUMENT
from ._moe import MoE as _NpMoE, mixtral_name as _mixtral_name

_FUNCS = {F.relu: "relu", F.gelu: "gelu", F.silu: "silu", torch.sigmoid: "sigmoid",
          torch.relu: "relu", F.sigmoid: "sigmoid"}


def _np(t):
    return None if t is None else t.detach().to(torch.float32).cpu().numpy()


class _Fn(torch.autograd.Function):
    """y = FFN(x) on clffn; its backward is clffn's backward of the same forward (the dropout
    mask recomputed from the seed and offset that forward used)."""

    @staticmethod
    def forward(ctx, module, x, *params):
        ffn = module._ffn
        module._upload()
        seed, offset = ffn.rng_state()
        y = ffn(_np(x))
        module._calls += 1
        ctx.module, ctx.call, ctx.rng = module, module._calls, (seed, offset)
        ctx.x = x.detach()
        return torch.from_numpy(y).to(x.device)

    @staticmethod
    def backward(ctx, dy):
        module = ctx.module
        ffn = module._ffn
        if module._calls != ctx.call:  # another forward came since: run this one again
            after = ffn.rng_state()
            module._upload()
            ffn.seed(*ctx.rng)
            ffn(_np(ctx.x))
            ffn.seed(*after)
        dx, g = ffn.backward(_np(dy.contiguous()))
        names, layout = ffn._names()
        grads = []
        for key, p in module._param_map():
            if p is None:
                continue
            grads.append(torch.from_numpy(np.ascontiguousarray(g[names[key]])).to(p.device))
        return (None, torch.from_numpy(dx).to(dy.device), *grads)


class FeedForward(nn.Module):
    """FeedForward(d_model, d_ff, dropout=0.1, activation="relu", is_gated=False, bias1=True,
    bias2=True, bias_gate=True, device=None): the reference modules' FFN, computed by clffn.
    activation is a name (relu, gelu, gelu_tanh, silu, sigmoid, identity, or a GLU name, which
    sets is_gated) or one of torch's functions (F.relu, F.gelu, F.silu, torch.sigmoid).
    `device` is the OpenCL device (see clffn.devices()); tensors stay on the CPU."""

    def __init__(self, d_model, d_ff, dropout=0.1, activation="relu", is_gated=False, bias1=True,
                 bias2=True, bias_gate=True, device=None):
        super().__init__()
        if callable(activation):
            if activation not in _FUNCS:
                raise ArgumentError(INVALID_ARGUMENT, f"activation {activation!r} has no clffn "
                                    f"counterpart (relu, gelu, silu, sigmoid)")
            activation = _FUNCS[activation]
        self._ffn = FFN(d_model, d_ff, activation=activation, gated=is_gated, bias1=bias1,
                        bias2=bias2, bias_gate=bias_gate, dropout=dropout, device=device)
        self.is_gated = self._ffn.gated
        self.dropout_p = float(dropout)
        first, second = ("layer1", "layer2") if self.is_gated else ("w_1", "w_2")
        self._first, self._second = first, second
        setattr(self, first, nn.Linear(d_model, d_ff, bias=bias1))
        setattr(self, second, nn.Linear(d_ff, d_model, bias=bias2))
        if self.is_gated:
            self.linear_v = nn.Linear(d_model, d_ff, bias=bias_gate)
        self._calls = 0

    def _param_map(self):
        l1, l2 = getattr(self, self._first), getattr(self, self._second)
        lv = getattr(self, "linear_v", None)
        return [("w1", l1.weight), ("b1", l1.bias), ("v", lv.weight if lv else None),
                ("bv", lv.bias if lv else None), ("w2", l2.weight), ("b2", l2.bias)]

    def _upload(self):
        p = dict(self._param_map())
        self._ffn.set_weights(_np(p["w1"]), _np(p["b1"]), _np(p["w2"]), _np(p["b2"]),
                              v=_np(p["v"]), bv=_np(p["bv"]), layout="out_in")

    def train(self, mode=True):
        super().train(mode)
        self._ffn.train(mode)
        return self

    def seed(self, seed, offset=0):
        """Dropout's seed and offset (clffn.FFN.seed)."""
        self._ffn.seed(seed, offset)

    def forward(self, x):
        if x.dtype != torch.float32:
            x = x.to(torch.float32)  # documented: clffn computes in float32
        params = [p for _, p in self._param_map() if p is not None]
        return _Fn.apply(self, x.contiguous(), *params)

    def extra_repr(self):
        return repr(self._ffn)


_MODULES = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Sigmoid: "sigmoid", nn.Identity: "identity"}


def from_module(m, device=None):
    """A FeedForward with the weights of `m` (copied): a PositionwiseFeedForward (w_1, w_2,
    dropout, optionally activation) or a labml FeedForward (layer1, layer2, linear_v when
    is_gated, activation, dropout)."""
    l1 = getattr(m, "w_1", None) or getattr(m, "layer1", None)
    l2 = getattr(m, "w_2", None) or getattr(m, "layer2", None)
    if not isinstance(l1, nn.Linear) or not isinstance(l2, nn.Linear):
        raise ArgumentError(INVALID_ARGUMENT, "the module has no w_1/w_2 or layer1/layer2 "
                            "nn.Linear pair")
    lv = getattr(m, "linear_v", None) if getattr(m, "is_gated", False) else None
    act = getattr(m, "activation", F.relu)
    if isinstance(act, nn.GELU):
        act = "gelu_tanh" if getattr(act, "approximate", "none") == "tanh" else "gelu"
    elif type(act) in _MODULES:
        act = _MODULES[type(act)]
    drop = getattr(m, "dropout", None)
    p = drop.p if isinstance(drop, nn.Dropout) else float(drop or 0.0)
    ff = FeedForward(l1.in_features, l1.out_features, dropout=p, activation=act,
                     is_gated=lv is not None, bias1=l1.bias is not None,
                     bias2=l2.bias is not None,
                     bias_gate=lv is not None and lv.bias is not None, device=device)
    with torch.no_grad():
        mine = dict(ff._param_map())
        src = {"w1": l1.weight, "b1": l1.bias, "w2": l2.weight, "b2": l2.bias,
               "v": lv.weight if lv is not None else None,
               "bv": lv.bias if lv is not None else None}
        for k, t in src.items():
            if t is not None:
                mine[k].copy_(t)
    ff.train(m.training)
    return ff


class _MoeFn(torch.autograd.Function):
    """y = MoE(x) on clffn; its backward is clffn's backward of the same forward (run again
    first if another forward of the module came in between)."""

    @staticmethod
    def forward(ctx, module, x, *params):
        module._upload()
        y = module._moe(_np(x))
        module._calls += 1
        ctx.module, ctx.call, ctx.x = module, module._calls, x.detach()
        return torch.from_numpy(y).to(x.device)

    @staticmethod
    def backward(ctx, dy):
        module = ctx.module
        if module._calls != ctx.call:
            module._upload()
            module._moe(_np(ctx.x))
        dx, g = module._moe.backward(_np(dy.contiguous()))
        g = {n: g[_mixtral_name(n)] for n, _ in module.named_parameters() if _mixtral_name(n) in g}
        grads = [torch.from_numpy(np.ascontiguousarray(g[name])).to(p.device)
                 if name in g else torch.zeros_like(p) for name, p in module.named_parameters()]
        return (None, torch.from_numpy(dx).to(dy.device), *grads)


class _Expert(nn.Module):
    """Mixtral's MixtralBlockSparseTop2MLP: w2(act(w1(x)) * w3(x)), no biases."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)


class MoE(nn.Module):
    """MoE(d_model, d_ff, experts=8, top_k=2, activation="swiglu", routing="normalized",
    device=None, counts="device", grouping=True): Mixtral's sparse MoE block (block_sparse_moe),
    computed by clffn. Its parameters are named as Mixtral's (gate.weight [experts, d_model];
    experts.{e}.w1, w2, w3), so a Mixtral layer's block_sparse_moe state_dict loads as it is.
    Returns y only (Mixtral's module also returns the router logits). Every forward uploads the
    current parameters. counts and grouping as clffn.MoE takes them ("host" or "auto": the
    counts read back; grouping=False: the experts one at a time; the same results)."""

    def __init__(self, d_model, d_ff, experts=8, top_k=2, activation="swiglu",
                 routing="normalized", device=None, counts="device", grouping=True):
        super().__init__()
        self._moe = _NpMoE(d_model, d_ff, experts, top_k=top_k, activation=activation,
                           routing=routing, device=device, counts=counts, grouping=grouping)
        self.gate = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(_Expert(d_model, d_ff) for _ in range(experts))
        self._calls = 0

    def _upload(self):
        self._moe.load_state_dict({k: _np(v) for k, v in self.state_dict().items()})

    def forward(self, x):
        if x.dtype != torch.float32:
            x = x.to(torch.float32)  # documented: clffn computes in float32
        return _MoeFn.apply(self, x.contiguous(), *self.parameters())

    def extra_repr(self):
        return repr(self._moe)


class _QwenMlp(nn.Module):
    """Qwen2-MoE's Qwen2MoeMLP: down_proj(act(gate_proj(x)) * up_proj(x)), no biases."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)


class Qwen2MoE(MoE):
    """Qwen2MoE(d_model, d_ff, experts=60, top_k=4, shared_d_ff=None, norm_topk_prob=False,
    device=None, counts="device", grouping=True): Qwen2-MoE's sparse MoE block
    (Qwen2MoeSparseMoeBlock, a layer's mlp), computed by clffn: softmax routing over the
    experts, the top_k kept as they are (or renormalised with norm_topk_prob), SwiGLU experts,
    and a shared expert of width shared_d_ff (the config's shared_expert_intermediate_size;
    default d_ff) scaled by the sigmoid of shared_expert_gate. Parameters are named as Qwen's (gate.weight [experts, d_model];
    experts.{e}.gate_proj, up_proj, down_proj; shared_expert.*; shared_expert_gate.weight
    [1, d_model]), so a Qwen2-MoE layer's mlp state_dict loads as it is. The defaults are
    Qwen1.5-MoE-A2.7B's but for the widths (d_model 2048, d_ff 1408, shared_d_ff 5632 there).
    Returns y only (Qwen's module also returns the router logits)."""

    def __init__(self, d_model, d_ff, experts=60, top_k=4, shared_d_ff=None,
                 norm_topk_prob=False, device=None, counts="device", grouping=True):
        nn.Module.__init__(self)
        shared_d_ff = d_ff if shared_d_ff is None else shared_d_ff
        self._moe = _NpMoE(d_model, d_ff, experts, top_k=top_k, activation="swiglu",
                           routing="normalized" if norm_topk_prob else "topk",
                           shared_expert=True, shared_d_ff=shared_d_ff, shared_gate=True,
                           device=device, counts=counts, grouping=grouping)
        self.gate = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(_QwenMlp(d_model, d_ff) for _ in range(experts))
        self.shared_expert = _QwenMlp(d_model, shared_d_ff)
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False)
        self._calls = 0
