"""clffn.MoE: the C library's mixture-of-experts layer (clffn_moe) behind a numpy interface."""
import ctypes

import numpy as np

from . import _lib
from ._ffn import (ArgumentError, FFN, INVALID_ARGUMENT, INVALID_SIZE, NO_FORWARD, _check,
                   _context, _parse_activation, _parse_dtype, _ptr)

ROUTINGS = ("normalized", "topk")
COUNTS = ("device", "host", "auto")  # clffn_moe_counts, in its order


class _Expert(FFN):
    """One expert of a layer: an FFN whose handle the layer owns (set_weights, state_dict and
    the properties work as on any FFN; its own forward would replace what the layer's backward
    needs, so the layer runs it)."""

    def __init__(self, layer, handle, cfg, dtype):  # pylint: disable=super-init-not-called
        self._layer, self._ctx, self._cfg, self._dtype = layer, layer._ctx, cfg, dtype
        self._handle = ctypes.c_void_p(handle)
        self.training, self._grads, self._last_shape, self._w = False, None, None, None
        self._enc = None
        self.preset = "labml" if cfg.gated else "annotated"

    def __del__(self):
        self._handle = None  # the layer's, released with it


class MoE:
    """A sparse mixture-of-experts layer on an OpenCL device (Mixtral, Qwen-MoE, Switch).

    MoE(d_model, d_ff, experts, top_k=2, activation="swiglu", bias=False,
    routing="normalized", router_bias=False, shared_expert=False, device=None,
    weight_dtype="f32", aux_loss_coef=0.0, shared_d_ff=None, shared_gate=False,
    quantized_inputs=False, counts="device", grouping=True, shared_scratch=False). Each expert is
    an FFN of (d_model, d_ff, activation, bias); the router [experts, d_model] scores each
    token, the top_k best experts (ties to the lower index) run it, and their outputs are
    summed with the softmax probabilities renormalised over the chosen ("normalized",
    Mixtral's) or as they are ("topk", Switch's). A shared expert (Qwen-MoE's) runs on every
    token and is added; its width is shared_d_ff (default d_ff), and with shared_gate its
    output is scaled by sigmoid(x·shared_expert_gate.weightᵀ) (Qwen2-MoE's). Weights start as
    nn.Linear initialises them (seed 0); load_state_dict() takes a Mixtral block's
    (gate.weight, experts.{e}.w1/w2/w3) or a Qwen2-MoE block's (gate.weight,
    experts.{e}.gate_proj/up_proj/down_proj, shared_expert.*, shared_expert_gate.weight).

    layer(x) takes [..., d_model] and returns float32 of the same shape; last_experts and
    last_weights then hold each token's choice [..., top_k] and its weights. quantized_inputs
    as FFN takes it: q8_0 and q4_0 experts round their rows to q8_0 first (bf16 ones to bf16),
    as llama.cpp does. counts says where a forward whose experts run clffn's own kernels (a
    few tokens, or any where the context's crossovers reach them) keeps the experts' row counts
    (clffn_moe_set_counts): "device" runs the experts grouped, a launch a stage for all of them
    (the fastest), "host" reads the counts back and launches only the chosen ones, one at a
    time, "auto" reads them back where some expert must go unchosen; the outputs are the same
    bits. grouping=False runs the experts one at a time even with the counts on the device
    (clffn_moe_set_grouping), with the same bits; grouped says whether the last call ran them
    grouped. shared_scratch as FFN takes it: the layer's experts then use the scratch that the
    device's other layers made with shared_scratch=True use.
    """

    def __init__(self, d_model, d_ff, experts, top_k=2, activation="swiglu", bias=False,
                 routing="normalized", router_bias=False, shared_expert=False, device=None,
                 weight_dtype="f32", aux_loss_coef=0.0, shared_d_ff=None, shared_gate=False,
                 quantized_inputs=False, counts="device", grouping=True, shared_scratch=False):
        shared_d_ff = d_ff if shared_d_ff is None else shared_d_ff
        for name, v in (("d_model", d_model), ("d_ff", d_ff), ("experts", experts),
                        ("top_k", top_k), ("shared_d_ff", shared_d_ff)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ArgumentError(INVALID_SIZE, f"{name} must be a positive integer, not {v!r}")
        if top_k > experts:
            raise ArgumentError(INVALID_ARGUMENT, f"top_k ({top_k}) exceeds experts ({experts})")
        if (shared_gate or shared_d_ff != d_ff) and not shared_expert:
            raise ArgumentError(INVALID_ARGUMENT, "shared_d_ff and shared_gate need "
                                                  "shared_expert=True")
        if routing not in ROUTINGS:
            raise ArgumentError(INVALID_ARGUMENT, f"routing must be one of {ROUTINGS}, not "
                                                  f"{routing!r}")
        if counts not in COUNTS:
            raise ArgumentError(INVALID_ARGUMENT, f"counts must be one of {COUNTS}, not "
                                                  f"{counts!r}")
        act, gated = _parse_activation(activation, False)
        dtype = _parse_dtype(weight_dtype)
        self._handle = None
        self._ctx = _context(device, quantized_inputs, shared_scratch)
        mc = _lib.moe_config_default(int(d_model), int(d_ff), int(experts), int(top_k))
        mc.expert.activation, mc.expert.gated = act, int(gated)
        mc.expert.bias1 = mc.expert.bias2 = mc.expert.bias_gate = int(bool(bias))
        mc.routing = ROUTINGS.index(routing)
        mc.router_bias, mc.shared_expert = int(bool(router_bias)), int(bool(shared_expert))
        mc.aux_loss_coef = float(aux_loss_coef)
        mc.shared_d_ff = int(shared_d_ff) if shared_expert else 0
        mc.shared_gate = int(bool(shared_gate))
        handle = ctypes.c_void_p()
        _check(_lib.moe_create(self._ctx.handle, ctypes.byref(mc), ctypes.byref(handle)),
               "creating the layer")
        self._handle, self._mc = handle, mc
        _check(_lib.moe_set_counts(handle, COUNTS.index(counts)), "setting where the counts go")
        _check(_lib.moe_set_grouping(handle, int(bool(grouping))), "setting the grouping")
        sc = _lib.Config.from_buffer_copy(mc.expert)
        sc.d_ff = int(shared_d_ff)
        self._experts = [_Expert(self, _lib.moe_expert(handle, e), mc.expert, dtype)
                         for e in range(int(experts))]
        if shared_expert:
            self._experts.append(_Expert(self, _lib.moe_expert(handle, int(experts)), sc, dtype))
        self.last_experts = self.last_weights = None
        self._last_shape = None
        rng = np.random.default_rng(0)
        D = int(d_model)
        u = lambda shape, b: rng.uniform(-b, b, shape).astype(np.float32)
        self.set_router(u((int(experts), D), 1 / np.sqrt(D)),
                        u(int(experts), 1 / np.sqrt(D)) if router_bias else None,
                        u((1, D), 1 / np.sqrt(D)) if shared_gate else None,
                        u(1, 1 / np.sqrt(D)) if shared_gate and router_bias else None)
        for ex in self._experts:
            F = ex._cfg.d_ff
            b1, b2 = 1 / np.sqrt(D), 1 / np.sqrt(F)
            ex.set_weights(u((F, D), b1), u(F, b1) if bias else None, u((D, F), b2),
                           u(D, b2) if bias else None, v=u((F, D), b1) if gated else None,
                           bv=u(F, b1) if gated and bias else None)

    def __del__(self):
        if getattr(self, "_handle", None) and _lib is not None:
            _lib.moe_destroy(self._handle)
            self._handle = None

    # -- configuration and weights -------------------------------------------------------------
    @property
    def num_experts(self):
        return self._mc.experts

    @property
    def top_k(self):
        return self._mc.top_k

    @property
    def experts(self):
        """The E experts (clffn.FFN objects the layer owns: set_weights, state_dict)."""
        return self._experts[:self._mc.experts]

    @property
    def grouped(self):
        """Whether the last call ran the routed experts grouped, a launch a stage for all of
        them (clffn_moe_experts_grouped): with the counts on the device, grouping on, and every
        expert's weights uploaded alike."""
        return bool(_lib.moe_experts_grouped(self._handle))

    @property
    def counts_kept(self):
        """Whether the last call kept the expert counts on the device (clffn_moe_counts_kept):
        counts="device" or "auto" asks for it, and it happens where every expert's products
        run clffn's own kernels in one pass (few tokens); a prefill reads them back."""
        return bool(_lib.moe_counts_kept(self._handle))

    @property
    def shared_expert(self):
        return self._experts[-1] if self._mc.shared_expert else None

    def set_router(self, weight, bias=None, shared_gate=None, shared_gate_bias=None):
        """The router: weight [experts, d_model] (nn.Linear's layout), bias [experts] when the
        layer has one; with shared_gate=True at creation, the shared expert's gate too:
        shared_gate [1, d_model] (Qwen2-MoE's shared_expert_gate.weight) and shared_gate_bias
        [1] with router_bias."""
        E, D = self._mc.experts, self._mc.expert.d_model
        gated = bool(self._mc.shared_gate)
        w = self._array(weight, "router weight", (E, D))
        if bool(bias is not None) != bool(self._mc.router_bias):
            raise ArgumentError(INVALID_ARGUMENT, "router bias given without router_bias, or "
                                                  "missing with it")
        if bool(shared_gate is not None) != gated or bool(
                shared_gate_bias is not None) != (gated and bool(self._mc.router_bias)):
            raise ArgumentError(INVALID_ARGUMENT, "the shared expert's gate (and its bias, with "
                                                  "router_bias) goes with shared_gate=True alone")
        b = None if bias is None else self._array(bias, "router bias", (E,))
        sg = None if shared_gate is None else self._array(shared_gate, "shared gate", (1, D))
        sgb = (None if shared_gate_bias is None
               else self._array(shared_gate_bias, "shared gate bias", (1,)))
        # the C layer takes the gate as the router's row E
        rows = w if sg is None else np.ascontiguousarray(np.concatenate([w, sg]))
        rb = b if sgb is None else np.ascontiguousarray(np.concatenate([b, sgb]))
        _check(_lib.moe_upload_router(self._handle, _ptr(rows), _ptr(rb)), "uploading the router")
        self._router = (w, b, sg, sgb)

    @staticmethod
    def _array(a, what, shape):
        a = np.ascontiguousarray(FFN._floats(a, what), dtype=np.float32)
        if a.size == int(np.prod(shape)) and len(shape) == 2 and shape[0] == 1:
            a = a.reshape(shape)  # [d_model] for [1, d_model], as GGUF stores the gate
        if a.shape != shape:
            raise ArgumentError(INVALID_ARGUMENT, f"{what} has shape {a.shape}, expected {shape}")
        return a

    def state_dict(self):
        """Mixtral's names: gate.weight (and gate.bias), experts.{e}.w1 (W1, the activated
        projection), w3 (V, gated layers) and w2 (W2) .weight/.bias; shared_expert.* likewise,
        and shared_expert_gate.weight (.bias) with shared_gate."""
        out = {k: a.copy() for k, a in zip(_ROUTER, self._router) if a is not None}
        for name, ex in self._named_experts():
            for k, a in ex._values().items():
                if a is not None:
                    out[f"{name}.{_MIXTRAL[k]}"] = a.copy()
        return out

    def load_state_dict(self, sd):
        """Sets the router and every expert from a state_dict with state_dict()'s names (a
        Mixtral block's block_sparse_moe state_dict loads as it is), or Qwen2-MoE's for the
        experts' projections (gate_proj, up_proj, down_proj: a Qwen2MoeSparseMoeBlock's mlp
        state_dict loads as it is)."""
        sd = {mixtral_name(k): np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach")
                                          else v)
              for k, v in sd.items()}
        self.set_router(*(sd.get(k) for k in _ROUTER))
        c = self._mc.expert
        for name, ex in self._named_experts():
            g = lambda k: sd.get(f"{name}.{_MIXTRAL[k]}")
            ex.set_weights(g("w1"), g("b1") if c.bias1 else None, g("w2"),
                           g("b2") if c.bias2 else None, v=g("v") if c.gated else None,
                           bv=g("bv") if c.gated and c.bias_gate else None)
        return self

    def _named_experts(self):
        names = [f"experts.{e}" for e in range(self._mc.experts)]
        if self._mc.shared_expert:
            names.append("shared_expert")
        return zip(names, self._experts)

    # -- passes --------------------------------------------------------------------------------
    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        """y = MoE(x) for x [..., d_model]; each token's experts and weights are kept in
        last_experts and last_weights [..., top_k]."""
        x = self._experts[0]._input(x, "x")
        D, k = self._mc.expert.d_model, self._mc.top_k
        T = x.size // D
        y = np.empty_like(x)
        ch = np.empty(x.shape[:-1] + (k,), np.int32)
        wt = np.empty(x.shape[:-1] + (k,), np.float32)
        _check(_lib.moe_forward_host(self._handle, T, _ptr(x), x.size, _ptr(y), y.size,
                                     ch.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), _ptr(wt)),
               "forward pass")
        self.last_experts, self.last_weights, self._last_shape = ch, wt, x.shape
        return y

    def backward(self, dy, accumulate=False):
        """The backward of the last forward: dy [the output's shape] in; returns (dx, grads),
        grads under state_dict()'s names (experts kept compressed: their biases' only; experts
        no token chose: zeros). accumulate=True adds to the gradients the previous backward
        returned (kept by the layer)."""
        if self._last_shape is None:
            raise ArgumentError(NO_FORWARD, "backward() needs a forward() first")
        dy = self._experts[0]._input(dy, "dy")
        if dy.shape != self._last_shape:
            raise ArgumentError(INVALID_ARGUMENT, f"dy has shape {list(dy.shape)}, the last "
                                f"forward's output {list(self._last_shape)}")
        if not accumulate or getattr(self, "_grads", None) is None:
            self._grads = self._zero_grads()
        g = self._grads
        arrays = (_lib.Weights * len(self._experts))()
        for i, (name, _) in enumerate(self._named_experts()):
            arrays[i] = _lib.Weights(*(_ptr(g.get(f"{name}.{_MIXTRAL[k]}"))
                                       for k in ("w1", "b1", "v", "bv", "w2", "b2")))
        dx = np.empty_like(dy)
        T = dy.size // self._mc.expert.d_model
        _check(_lib.moe_backward_host(self._handle, T, _ptr(dy), dy.size, _ptr(dx), dx.size,
                                      _ptr(g["_router"]), _ptr(g.get("_router_bias")), arrays,
                                      int(bool(accumulate))), "backward pass")
        out = {k: a.copy() for k, a in g.items() if not k.startswith("_")}
        # the router's rows: the experts', then the shared expert's gate
        E = self._mc.experts
        for k, a in (("weight", g["_router"]), ("bias", g.get("_router_bias"))):
            if a is not None:
                out[f"gate.{k}"] = a[:E].copy()
                if self._mc.shared_gate:
                    out[f"shared_expert_gate.{k}"] = a[E:].copy()
        return dx, out

    def _zero_grads(self):
        R, D = self._mc.experts + self._mc.shared_gate, self._mc.expert.d_model
        g = {"_router": np.zeros((R, D), np.float32)}
        if self._router[1] is not None:
            g["_router_bias"] = np.zeros(R, np.float32)
        for name, ex in self._named_experts():
            keep = ("b1", "bv", "b2") if ex._dtype else tuple(ex._w)
            for k, a in ex._w.items():
                if a is not None and k in keep:
                    g[f"{name}.{_MIXTRAL[k]}"] = np.zeros_like(a)
        return g

    def aux_loss(self):
        """The load-balancing loss of the last forward: E · Σ_e f_e · P_e (f_e the share of
        choices that went to expert e, P_e its mean router probability); backward() adds
        aux_loss_coef times its gradient."""
        loss = ctypes.c_double()
        _check(_lib.moe_aux_loss(self._handle, ctypes.byref(loss)), "the auxiliary loss")
        return loss.value

    def __repr__(self):
        c = self._mc
        return (f"clffn.MoE(d_model={c.expert.d_model}, d_ff={c.expert.d_ff}, "
                f"experts={c.experts}, top_k={c.top_k}, routing={ROUTINGS[c.routing]!r}, "
                f"shared_expert={bool(c.shared_expert)}) on "
                f"{self._experts[0].device_name()!r}")


# the router's arrays, as set_router() takes them, by state_dict() name
_ROUTER = ("gate.weight", "gate.bias", "shared_expert_gate.weight", "shared_expert_gate.bias")

# Qwen2-MoE's names for an expert's projections (Qwen2MoeMLP), and Mixtral's
_QWEN2 = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def mixtral_name(name):
    """A state_dict name in Mixtral's words: experts.{e}.up_proj.weight becomes
    experts.{e}.w3.weight, and so on; other names stay."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _QWEN2:
        parts[-2] = _QWEN2[parts[-2]]
    return ".".join(parts)


# clffn's names for an expert's tensors, and Mixtral's
_MIXTRAL = {"w1": "w1.weight", "b1": "w1.bias", "v": "w3.weight", "bv": "w3.bias",
            "w2": "w2.weight", "b2": "w2.bias"}
