"""PyTorch modules whose forward and backward run on clffn (needs python3-torch).

    import torch, clffn.torch
    ff = clffn.torch.FeedForward(512, 2048, dropout=0.1)        # PositionwiseFeedForward's
    y = ff(x); y.sum().backward()                                # w_1/w_2 .grad filled
    ff2 = clffn.torch.from_module(existing_module)               # copies its weights

The parameters are ordinary torch Parameters (float32, on the CPU), named as in the reference
modules: w_1, w_2 for a plain FFN (the Annotated Transformer's PositionwiseFeedForward), layer1,
layer2 and linear_v for a gated one (labml's FeedForward), so their state_dicts load as they are.
Each forward uploads the parameters that changed since the last: an optimizer's step,
load_state_dict(), any in-place change (which torch counts in the tensor's version) or a new
Parameter. A change through .data is not counted, so it is seen only after upload().

weight_dtype="f16", "bf16", "q8_0" or "q4_0" keeps the projections' matrices on the device in
that type: a frozen base whose adapters or biases are trained, as with a quantized LLM. Those
matrices are frozen Parameters (requires_grad False; torch.float16 or torch.bfloat16 for f16 and
bf16 weights, float32 for the quantized types, which torch has no dtype for) and hold the values
as given; the device holds them rounded to the type (GGUF's rounding for q8_0 and q4_0), and the
forward and x's gradient are those of the rounded values. Biases and the router stay float32 and
trainable. Asking for a compressed matrix's gradient (requires_grad True on it) is refused at
the forward.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._ffn import FFN, ArgumentError, COMPRESSED_WEIGHTS, INVALID_ARGUMENT
from ._moe import MoE as _NpMoE, mixtral_name as _mixtral_name

_FUNCS = {F.relu: "relu", F.gelu: "gelu", F.silu: "silu", torch.sigmoid: "sigmoid",
          torch.relu: "relu", F.sigmoid: "sigmoid"}


def _np(t):
    return None if t is None else t.detach().to(torch.float32).cpu().numpy()


# the torch dtype a compressed matrix's Parameter keeps: its own where torch has one
_TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def _stamp(tensors):
    """What changes when a tensor is changed in place (its version) or replaced."""
    return tuple((id(t), t.data_ptr(), t._version, t.dtype, tuple(t.shape)) for t in tensors
                 if t is not None)


def _freeze(lin, dtype):
    """nn.Linear lin's weight as a frozen Parameter of the torch dtype compressed weights of
    `dtype` keep."""
    lin.weight = nn.Parameter(lin.weight.detach().to(_TORCH_DTYPES.get(dtype, torch.float32)),
                              requires_grad=False)


def _check_frozen(named):
    """Refuses a forward that would need a compressed matrix's gradient."""
    if not torch.is_grad_enabled():
        return
    for name, p in named:
        if p.requires_grad:
            raise ArgumentError(COMPRESSED_WEIGHTS, f"{name} is kept compressed on the device "
                                f"and has no gradient: leave it frozen (requires_grad_(False))")


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
            if names[key] not in g:  # a compressed matrix: frozen, no gradient
                grads.append(None)
                continue
            grads.append(torch.from_numpy(np.ascontiguousarray(g[names[key]])).to(p.device))
        return (None, torch.from_numpy(dx).to(dy.device), *grads)


class FeedForward(nn.Module):
    """FeedForward(d_model, d_ff, dropout=0.1, activation="relu", is_gated=False, bias1=True,
    bias2=True, bias_gate=True, device=None, weight_dtype="f32", quantized_inputs=False): the
    reference modules' FFN, computed by clffn. activation is a name (relu, gelu, gelu_tanh, silu,
    sigmoid, identity, or a GLU name, which sets is_gated) or one of torch's functions (F.relu,
    F.gelu, F.silu, torch.sigmoid). `device` is the OpenCL device (see clffn.devices()); tensors
    stay on the CPU. weight_dtype keeps the matrices compressed and frozen (the module's
    docstring); quantized_inputs as clffn.FFN takes it."""

    def __init__(self, d_model, d_ff, dropout=0.1, activation="relu", is_gated=False, bias1=True,
                 bias2=True, bias_gate=True, device=None, weight_dtype="f32",
                 quantized_inputs=False):
        super().__init__()
        if callable(activation):
            if activation not in _FUNCS:
                raise ArgumentError(INVALID_ARGUMENT, f"activation {activation!r} has no clffn "
                                    f"counterpart (relu, gelu, silu, sigmoid)")
            activation = _FUNCS[activation]
        self._ffn = FFN(d_model, d_ff, activation=activation, gated=is_gated, bias1=bias1,
                        bias2=bias2, bias_gate=bias_gate, dropout=dropout, device=device,
                        weight_dtype=weight_dtype, quantized_inputs=quantized_inputs)
        self.is_gated = self._ffn.gated
        self.dropout_p = float(dropout)
        first, second = ("layer1", "layer2") if self.is_gated else ("w_1", "w_2")
        self._first, self._second = first, second
        setattr(self, first, nn.Linear(d_model, d_ff, bias=bias1))
        setattr(self, second, nn.Linear(d_ff, d_model, bias=bias2))
        if self.is_gated:
            self.linear_v = nn.Linear(d_model, d_ff, bias=bias_gate)
        self.weight_dtype = self._ffn.weight_dtype
        self._stored = self.weight_dtype != "f32"
        if self._stored:
            for name in (first, second, "linear_v"):
                if hasattr(self, name):
                    _freeze(getattr(self, name), self.weight_dtype)
        self._uploaded = (None, None)  # the matrices' and the biases' _stamp() on the device
        self._calls = 0

    def _param_map(self):
        l1, l2 = getattr(self, self._first), getattr(self, self._second)
        lv = getattr(self, "linear_v", None)
        return [("w1", l1.weight), ("b1", l1.bias), ("v", lv.weight if lv else None),
                ("bv", lv.bias if lv else None), ("w2", l2.weight), ("b2", l2.bias)]

    def _matrices(self):
        names = {self._first: "w1", self._second: "w2", "linear_v": "v"}
        p = dict(self._param_map())
        return [(f"{n}.weight", p[k]) for n, k in names.items() if p[k] is not None]

    def _upload(self, force=False):
        p = dict(self._param_map())
        mats = _stamp(m for _, m in self._matrices())
        biases = _stamp(p[k] for k in ("b1", "bv", "b2"))
        if force or mats != self._uploaded[0]:
            self._uploaded = (None, None)  # until the upload succeeds
            self._ffn.set_weights(_np(p["w1"]), _np(p["b1"]), _np(p["w2"]), _np(p["b2"]),
                                  v=_np(p["v"]), bv=_np(p["bv"]), layout="out_in")
        elif biases != self._uploaded[1]:
            self._uploaded = (mats, None)
            self._ffn._set_biases(_np(p["b1"]), _np(p["bv"]), _np(p["b2"]))
        self._uploaded = (mats, biases)

    def upload(self):
        """Uploads every parameter now (converted to weight_dtype): after a change through
        .data, which the next forward would not see."""
        self._upload(force=True)

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
        if self._stored:
            _check_frozen(self._matrices())
        params = [p for _, p in self._param_map() if p is not None]
        return _Fn.apply(self, x.contiguous(), *params)

    def extra_repr(self):
        return repr(self._ffn)


_MODULES = {nn.ReLU: "relu", nn.SiLU: "silu", nn.Sigmoid: "sigmoid", nn.Identity: "identity"}


def from_module(m, device=None, weight_dtype="f32", quantized_inputs=False):
    """A FeedForward with the weights of `m` (copied): a PositionwiseFeedForward (w_1, w_2,
    dropout, optionally activation) or a labml FeedForward (layer1, layer2, linear_v when
    is_gated, activation, dropout). weight_dtype and quantized_inputs as FeedForward takes
    them."""
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
                     bias_gate=lv is not None and lv.bias is not None, device=device,
                     weight_dtype=weight_dtype, quantized_inputs=quantized_inputs)
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
        # compressed matrices are frozen: no gradient; an f32 expert no token chose gets zeros
        grads = [torch.from_numpy(np.ascontiguousarray(g[name])).to(p.device) if name in g else
                 torch.zeros_like(p) if p.requires_grad else None
                 for name, p in module.named_parameters()]
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
    device=None, counts="device", grouping=True, weight_dtype="f32", quantized_inputs=False):
    Mixtral's sparse MoE block (block_sparse_moe), computed by clffn. Its parameters are named
    as Mixtral's (gate.weight [experts, d_model]; experts.{e}.w1, w2, w3), so a Mixtral layer's
    block_sparse_moe state_dict loads as it is. Returns y only (Mixtral's module also returns
    the router logits). Each forward uploads the router and the experts that changed since the
    last (the module's docstring). counts and grouping as clffn.MoE takes them ("host" or
    "auto": the counts read back; grouping=False: the experts one at a time; the same results).
    weight_dtype keeps the experts' matrices compressed and frozen (the module's docstring; the
    router stays float32 and trainable); quantized_inputs as clffn.MoE takes it."""

    def __init__(self, d_model, d_ff, experts=8, top_k=2, activation="swiglu",
                 routing="normalized", device=None, counts="device", grouping=True,
                 weight_dtype="f32", quantized_inputs=False):
        super().__init__()
        self._moe = _NpMoE(d_model, d_ff, experts, top_k=top_k, activation=activation,
                           routing=routing, device=device, counts=counts, grouping=grouping,
                           weight_dtype=weight_dtype, quantized_inputs=quantized_inputs)
        self.gate = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(_Expert(d_model, d_ff) for _ in range(experts))
        self._calls = 0
        self._compress()

    def _compress(self):
        """Freezes the experts' matrices where they are kept compressed."""
        self.weight_dtype = self._moe.experts[0].weight_dtype
        self._uploaded = {}  # each expert's matrices' _stamp() when last converted
        if self.weight_dtype != "f32":
            for m in self._expert_modules().values():
                for lin in m.children():
                    _freeze(lin, self.weight_dtype)

    def _expert_modules(self):
        """The expert modules under their state_dict prefixes, in the layer's order."""
        out = {f"experts.{e}": m for e, m in enumerate(self.experts)}
        if getattr(self, "shared_expert", None) is not None:
            out["shared_expert"] = self.shared_expert
        return out

    def _upload(self, force=False):
        sg = getattr(self, "shared_expert_gate", None)  # Qwen2-MoE's
        self._moe.set_router(_np(self.gate.weight), _np(self.gate.bias),
                             _np(sg.weight) if sg is not None else None,
                             _np(sg.bias) if sg is not None else None)
        layer = dict(self._moe._named_experts())
        for prefix, m in self._expert_modules().items():
            mats = {_mixtral_name(f"{prefix}.{n}.weight"): lin.weight
                    for n, lin in m.named_children()}
            stamp = _stamp(mats.values())
            if force or self._uploaded.get(prefix) != stamp:
                self._uploaded.pop(prefix, None)  # until the upload succeeds
                g = lambda k: _np(mats[f"{prefix}.{k}.weight"])
                layer[prefix].set_weights(g("w1"), None, g("w2"), None, v=g("w3"))
                self._uploaded[prefix] = stamp

    def upload(self):
        """Uploads every parameter now (converted to weight_dtype): after a change through
        .data, which the next forward would not see."""
        self._upload(force=True)

    def forward(self, x):
        if x.dtype != torch.float32:
            x = x.to(torch.float32)  # documented: clffn computes in float32
        if self.weight_dtype != "f32":
            _check_frozen((n, p) for n, p in self.named_parameters()
                          if n.startswith(("experts.", "shared_expert.")))
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
    device=None, counts="device", grouping=True, weight_dtype="f32", quantized_inputs=False):
    Qwen2-MoE's sparse MoE block (Qwen2MoeSparseMoeBlock, a layer's mlp), computed by clffn:
    softmax routing over the experts, the top_k kept as they are (or renormalised with
    norm_topk_prob), SwiGLU experts, and a shared expert of width shared_d_ff (the config's
    shared_expert_intermediate_size; default d_ff) scaled by the sigmoid of shared_expert_gate.
    Parameters are named as Qwen's (gate.weight [experts, d_model]; experts.{e}.gate_proj,
    up_proj, down_proj; shared_expert.*; shared_expert_gate.weight [1, d_model]), so a Qwen2-MoE
    layer's mlp state_dict loads as it is. The defaults are Qwen1.5-MoE-A2.7B's but for the
    widths (d_model 2048, d_ff 1408, shared_d_ff 5632 there). Returns y only (Qwen's module also
    returns the router logits). weight_dtype and quantized_inputs as MoE takes them (the shared
    expert's matrices kept as the experts')."""

    def __init__(self, d_model, d_ff, experts=60, top_k=4, shared_d_ff=None,
                 norm_topk_prob=False, device=None, counts="device", grouping=True,
                 weight_dtype="f32", quantized_inputs=False):
        nn.Module.__init__(self)
        shared_d_ff = d_ff if shared_d_ff is None else shared_d_ff
        self._moe = _NpMoE(d_model, d_ff, experts, top_k=top_k, activation="swiglu",
                           routing="normalized" if norm_topk_prob else "topk",
                           shared_expert=True, shared_d_ff=shared_d_ff, shared_gate=True,
                           device=device, counts=counts, grouping=grouping,
                           weight_dtype=weight_dtype, quantized_inputs=quantized_inputs)
        self.gate = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(_QwenMlp(d_model, d_ff) for _ in range(experts))
        self.shared_expert = _QwenMlp(d_model, shared_d_ff)
        self.shared_expert_gate = nn.Linear(d_model, 1, bias=False)
        self._calls = 0
        self._compress()
