"""clffn.FFN and clffn.devices(): the C library's FFN behind a numpy interface."""
import ctypes
import os
import weakref

import numpy as np

from . import _lib

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "identity")
_GLU = {"glu": "sigmoid", "reglu": "relu", "geglu": "gelu", "swiglu": "silu",
        "bilinear": "identity"}
_ALIASES = {"gelu_new": "gelu_tanh", "swish": "silu", "linear": "identity"}

# The statuses Python-side checks raise with (the C library's own values).
NULL_ARGUMENT = -4096
INVALID_SIZE = -4097
BUFFER_TOO_SMALL = -4099
INVALID_ACTIVATION = -4101
INVALID_LAYOUT = -4102
INVALID_ARGUMENT = -4103
NO_FORWARD = -4109
COMPRESSED_WEIGHTS = -4113


class Error(Exception):
    """A clffn failure: `status` is the library's code (OpenCL's and CLBlast's pass through),
    `name` its symbolic name ("CLFFN_ERROR_BUFFER_TOO_SMALL", "CL_OUT_OF_RESOURCES"), and the
    message says what was being done. Bad arguments caught before the library is called raise
    ArgumentError, which is also a ValueError."""

    def __init__(self, status, what):
        text = _lib.status_string(int(status)).decode(errors="replace")
        self.status = int(status)
        self.name = text.split(":", 1)[0]
        self.detail = text
        super().__init__(f"{what}: {text}")


class ArgumentError(Error, ValueError):
    """Refused before anything reached the device (wrong dtype, shape, name, …)."""

    def __init__(self, status, message):
        self.status = status
        self.name = _lib.status_string(status).decode().split(":", 1)[0]
        self.detail = message
        Exception.__init__(self, f"{message} ({self.name})")


def _check(status, what):
    if status != 0:
        raise Error(status, what)


def version():
    """The C library's version string."""
    return _lib.version_string().decode()


def devices():
    """Every OpenCL device, as `clffn-devices --json` lists them: a list of dicts with index
    ("P:D", what device= takes), platform, name, vendor, type, driver_version, device_version,
    opencl_c_version, compute_units, clock_mhz, global_mem_bytes, local_mem_bytes,
    max_alloc_bytes, max_work_group_size, fp16, fp64, supported, denormals (False where the device
    flushes subnormal floats to zero), software (Mesa's llvmpipe), default (the device an FFN
    gets when device= is not given and CLFFN_DEVICE is not set) and tuning. An empty list when
    no OpenCL platform is installed."""
    n = ctypes.c_size_t(0)
    st = _lib.devices_list(None, 0, ctypes.byref(n))
    if st == -1001:  # CL_PLATFORM_NOT_FOUND_KHR: nothing installed
        return []
    _check(st, "listing the devices")
    arr = (_lib.DeviceInfo * max(n.value, 1))()
    _check(_lib.devices_list(arr, n.value, ctypes.byref(n)), "listing the devices")
    pick = ctypes.c_size_t(n.value)
    if n.value:
        _check(_lib.devices_default(arr, n.value, ctypes.byref(pick)), "choosing the default")
    out = []
    for i, d in enumerate(arr[:n.value]):
        has = _lib.tuning_has_profile(d.device)
        out.append({
            "index": f"{d.platform_index}:{d.device_index}",
            "platform": d.platform_name.decode(errors="replace"),
            "name": d.name.decode(errors="replace"),
            "vendor": d.vendor.decode(errors="replace"),
            "type": _lib.device_type_name(d.type).decode(),
            "driver_version": d.driver_version.decode(errors="replace"),
            "device_version": d.device_version.decode(errors="replace"),
            "opencl_c_version": d.opencl_c_version.decode(errors="replace"),
            "compute_units": d.compute_units,
            "clock_mhz": d.clock_mhz,
            "global_mem_bytes": d.global_mem_bytes,
            "local_mem_bytes": d.local_mem_bytes,
            "max_alloc_bytes": d.max_alloc_bytes,
            "max_work_group_size": d.max_work_group_size,
            "fp16": bool(d.fp16),
            "fp64": bool(d.fp64),
            "supported": bool(d.supported),
            "denormals": bool(d.denormals),
            "software": bool(d.software),
            "default": i == pick.value,
            "tuning": {1: "profile", 2: "built-in"}.get(has, "none"),
        })
    return out


class _Context:
    """One clffn_context per device, choice of quantized inputs and of a shared scratch, shared
    by the layers on it and released with the last."""

    def __init__(self, device, quantized_inputs=False, shared_scratch=False):
        self.handle = ctypes.c_void_p()
        spec = device.encode() if device else None
        _check(_lib.context_create_for_device(spec, ctypes.byref(self.handle)),
               f"opening device {device!r}" if device else "opening the default device")
        if quantized_inputs:
            _check(_lib.context_set_quantized_inputs(self.handle, 1), "quantized_inputs")
        if shared_scratch:
            _check(_lib.context_set_shared_scratch(self.handle, 1), "shared_scratch")

    def __del__(self):
        if getattr(self, "handle", None) and _lib is not None:
            _lib.context_destroy(self.handle)
            self.handle = None


_contexts = weakref.WeakValueDictionary()


def _context(device, quantized_inputs=False, shared_scratch=False):
    key = (device or os.environ.get("CLFFN_DEVICE") or "", bool(quantized_inputs),
           bool(shared_scratch))
    ctx = _contexts.get(key)
    if ctx is None:
        ctx = _Context(device, quantized_inputs, shared_scratch)
        _contexts[key] = ctx
    return ctx


def _parse_activation(name, gated):
    if not isinstance(name, str):
        raise ArgumentError(INVALID_ACTIVATION, f"activation must be a name, not {name!r}")
    n = name.lower()
    n = _ALIASES.get(n, n)
    if n in _GLU:
        return ACTIVATIONS.index(_GLU[n]), True
    if n not in ACTIVATIONS:
        raise ArgumentError(INVALID_ACTIVATION,
                            f"unknown activation {name!r} (one of {', '.join(ACTIVATIONS)} or "
                            f"a GLU name: {', '.join(_GLU)})")
    return ACTIVATIONS.index(n), bool(gated)


def _ptr(a):
    return a.ctypes.data_as(_lib.c_float_p) if a is not None else None


# Tensor names of each preset: the same as clffn-run's (tools/clffn-run/presets.c), with the
# layout the file stores matrices in and the FFN the preset describes.
PRESETS = {
    "annotated": dict(w1="w_1.weight", b1="w_1.bias", v=None, bv=None, w2="w_2.weight",
                      b2="w_2.bias", prefixes=("",), layout="out_in", activation="relu",
                      gated=False),
    "labml": dict(w1="layer1.weight", b1="layer1.bias", v="linear_v.weight",
                  bv="linear_v.bias", w2="layer2.weight", b2="layer2.bias", prefixes=("",),
                  layout="out_in", activation="relu", gated=None),
    "gpt2": dict(w1="h.{L}.mlp.c_fc.weight", b1="h.{L}.mlp.c_fc.bias", v=None, bv=None,
                 w2="h.{L}.mlp.c_proj.weight", b2="h.{L}.mlp.c_proj.bias",
                 prefixes=("", "transformer."), layout="in_out", activation="gelu_tanh",
                 gated=False),
    "bert": dict(w1="encoder.layer.{L}.intermediate.dense.weight",
                 b1="encoder.layer.{L}.intermediate.dense.bias", v=None, bv=None,
                 w2="encoder.layer.{L}.output.dense.weight",
                 b2="encoder.layer.{L}.output.dense.bias", prefixes=("bert.", ""),
                 layout="out_in", activation="gelu", gated=False),
    "llama": dict(w1="model.layers.{L}.mlp.gate_proj.weight", b1=None,
                  v="model.layers.{L}.mlp.up_proj.weight", bv=None,
                  w2="model.layers.{L}.mlp.down_proj.weight", b2=None, prefixes=("",),
                  layout="out_in", activation="silu", gated=True),
    # a GGUF file's (clffn.load finds them by the file's magic), for state_dict()'s names
    "gguf": dict(w1="blk.{L}.ffn_gate.weight", b1="blk.{L}.ffn_gate.bias",
                 v="blk.{L}.ffn_up.weight", bv="blk.{L}.ffn_up.bias",
                 w2="blk.{L}.ffn_down.weight", b2="blk.{L}.ffn_down.bias", prefixes=("",),
                 layout="out_in", activation="silu", gated=True),
    "gguf_plain": dict(w1="blk.{L}.ffn_up.weight", b1="blk.{L}.ffn_up.bias", v=None, bv=None,
                       w2="blk.{L}.ffn_down.weight", b2="blk.{L}.ffn_down.bias",
                       prefixes=("",), layout="out_in", activation="gelu_tanh", gated=False),
}

def _open_checkpoint(path, struct, opener):
    """libclffn_io, the file opened by its `opener` into a `struct`, and an error buffer for
    the reads that follow; a file it refuses raises with its reason."""
    io = _lib.io()
    f = struct()
    err = ctypes.create_string_buffer(_lib.IO_ERR)
    if getattr(io, opener)(os.fsencode(path), ctypes.byref(f), err) != 0:
        raise ArgumentError(INVALID_ARGUMENT, f"{path}: {err.value.decode(errors='replace')}")
    return io, f, err


def _read_safetensors(path, wanted):
    """The tensors of a safetensors file whose names are in `wanted`, as float32 arrays, read by
    libclffn_io (clffn-run's loader: the file mapped, its header checked, F32/F64/F16/BF16
    converted). Names present in the file but not wanted are listed with None."""
    io, f, err = _open_checkpoint(path, _lib.StFile, "clffn_st_open")
    try:
        out = {}
        for i in range(f.count):
            t = f.tensors[i]
            name = t.name.decode(errors="replace")
            if name not in wanted:
                out[name] = None
                continue
            if not io.clffn_io_dtype_is_convertible(t.dtype):
                raise ArgumentError(INVALID_ARGUMENT, f"{path}: tensor '{name}' is "
                                    f"{io.clffn_io_dtype_name(t.dtype).decode()}; only F32, F16, "
                                    f"BF16 and F64 can be used")
            a = np.empty(tuple(t.shape[:t.rank]), np.float32)
            if io.clffn_st_read_f32(ctypes.byref(f), ctypes.pointer(t), _ptr(a), err) != 0:
                raise ArgumentError(INVALID_ARGUMENT,
                                    f"{path}: {err.value.decode(errors='replace')}")
            out[name] = a
        return out
    finally:
        io.clffn_st_close(ctypes.byref(f))


def _preset_names(preset, layer):
    p = PRESETS[preset]
    return {pre + p[k].format(L=layer) for k in ("w1", "b1", "v", "bv", "w2", "b2") if p[k]
            for pre in p["prefixes"]}


class FFN:
    """The position-wise feed-forward network of one transformer layer, on an OpenCL device.

    Parameters follow the reference modules (PositionwiseFeedForward, labml's FeedForward):
    FFN(d_model, d_ff, activation="relu", gated=False, bias1=True, bias2=True, bias_gate=True,
    dropout=0.0, residual=False, device=None). `activation` also takes the GLU names (swiglu,
    geglu, reglu, glu, bilinear), which set gated. `device` is "P:D" or a name substring as
    clffn.devices() lists them (default: CLFFN_DEVICE, else the device that
    clffn-devices marks as the default: a GPU first, POCL before Mesa's llvmpipe). Weights start as nn.Linear initialises them (uniform ±1/sqrt(fan_in), seed 0).

    ffn(x) takes a float array of any rank [..., d_model] and returns float32 of the same shape.
    Input that is not float32 or not C-contiguous is converted with a copy (float64, float16 and
    non-contiguous views are accepted); any other dtype is refused.

    quantized_inputs=True (with weight_dtype "q8_0", "q4_0" or "bf16") rounds each product's
    input rows to q8_0 blocks first (bf16 for bf16 weights), as llama.cpp multiplies these types:
    faster for few tokens, exact only to the rounded inputs (clffn_context_set_quantized_inputs).

    shared_scratch=True has the layers made with it on a device share one scratch (the f32
    blocks compressed weights are dequantized into for many tokens, CLBlast's copies) instead
    of keeping one each, which on a GPU can outgrow the compressed weights themselves. Only
    for layers run one at a time, from one thread, as a model's layers are
    (clffn_context_set_shared_scratch).
    """

    def __init__(self, d_model, d_ff, activation="relu", gated=False, bias1=True, bias2=True,
                 bias_gate=True, dropout=0.0, residual=False, device=None, weight_dtype="f32",
                 quantized_inputs=False, shared_scratch=False, _init_weights=True):
        for name, v in (("d_model", d_model), ("d_ff", d_ff)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ArgumentError(INVALID_SIZE, f"{name} must be a positive integer, not {v!r}")
        act, gated = _parse_activation(activation, gated)
        self._dtype = _parse_dtype(weight_dtype)
        self._handle = None
        self._ctx = _context(device, quantized_inputs, shared_scratch)
        cfg = _lib.config_default(int(d_model), int(d_ff))
        cfg.activation, cfg.gated = act, int(gated)
        cfg.bias1, cfg.bias2, cfg.bias_gate = int(bool(bias1)), int(bool(bias2)), int(bool(bias_gate))
        cfg.dropout, cfg.residual = float(dropout), int(bool(residual))
        _check(_lib.config_validate(ctypes.byref(cfg)), "checking the configuration")
        self._cfg = cfg
        handle = ctypes.c_void_p()
        _check(_lib.ffn_create(self._ctx.handle, ctypes.byref(cfg), ctypes.byref(handle)),
               "creating the FFN")
        self._handle = handle
        self.training = False
        # state_dict()'s names: the Annotated Transformer's for a plain FFN, labml's for a gated
        self.preset = "labml" if gated else "annotated"
        self._grads = None
        self._last_shape = None
        self._enc = None
        if not _init_weights:  # clffn.load() sets them from the file
            return
        D, F = int(d_model), int(d_ff)
        rng = np.random.default_rng(0)
        b1, b2 = 1 / np.sqrt(D), 1 / np.sqrt(F)
        u = lambda shape, b: rng.uniform(-b, b, shape).astype(np.float32)
        self._set(u((F, D), b1), u(F, b1) if bias1 else None,
                  u((D, F), b2), u(D, b2) if bias2 else None,
                  u((F, D), b1) if gated else None,
                  u(F, b1) if gated and bias_gate else None)

    # -- configuration -------------------------------------------------------------------------
    @property
    def d_model(self):
        return self._cfg.d_model

    @property
    def d_ff(self):
        return self._cfg.d_ff

    @property
    def activation(self):
        return ACTIVATIONS[self._cfg.activation]

    @property
    def gated(self):
        return bool(self._cfg.gated)

    @property
    def quantized_inputs(self):
        """Whether q8_0 and q4_0 products round their inputs to q8_0 first."""
        return bool(_lib.context_quantized_inputs(self._ctx.handle))

    @property
    def shared_scratch(self):
        """Whether the layer shares its scratch with the others made with shared_scratch=True."""
        return bool(_lib.context_shared_scratch(self._ctx.handle))

    @property
    def weight_dtype(self):
        """The type W1, V and W2 are kept in on the device: "f32", "f16", "bf16", "q8_0" or
        "q4_0"."""
        return _lib.DTYPES[self._dtype]

    @property
    def weight_bytes(self):
        """The bytes W1, V and W2 take on the device: what a one-token forward reads."""
        return _lib.ffn_weight_bytes(self._handle)

    @property
    def dropout(self):
        return self._cfg.dropout

    @dropout.setter
    def dropout(self, p):
        _check(_lib.ffn_set_dropout(self._handle, float(p)), "setting dropout")
        self._cfg.dropout = float(p)

    def device_name(self):
        buf = ctypes.create_string_buffer(256)
        _check(_lib.context_device_name(self._ctx.handle, buf, 256), "naming the device")
        return buf.value.decode(errors="replace")

    def __repr__(self):
        c = self._cfg
        return (f"clffn.FFN(d_model={c.d_model}, d_ff={c.d_ff}, activation={self.activation!r}, "
                f"gated={self.gated}, bias1={bool(c.bias1)}, bias2={bool(c.bias2)}, "
                f"bias_gate={bool(c.bias_gate)}, dropout={c.dropout:g}, "
                f"residual={bool(c.residual)}, weight_dtype={self.weight_dtype!r}) on "
                f"{self.device_name()!r}")

    def __del__(self):
        if getattr(self, "_handle", None) and _lib is not None:
            _lib.ffn_destroy(self._handle)
            self._handle = None

    # -- dropout mode --------------------------------------------------------------------------
    def train(self, mode=True):
        """Training mode: dropout applies (with p > 0). Returns self."""
        _check(_lib.ffn_set_training(self._handle, int(bool(mode))), "setting training mode")
        self.training = bool(mode)
        return self

    def eval(self):
        """Inference mode: dropout is the identity. Returns self."""
        return self.train(False)

    def seed(self, seed, offset=0):
        """Dropout's seed and Philox offset: the mask is a pure function of (seed, offset,
        element), the same on every device. Each training forward advances the offset."""
        _check(_lib.ffn_set_rng(self._handle, int(seed), int(offset)), "setting the seed")

    def rng_state(self):
        """(seed, offset) that the next training forward will use."""
        s, o = ctypes.c_uint64(), ctypes.c_uint64()
        _check(_lib.ffn_get_rng(self._handle, ctypes.byref(s), ctypes.byref(o)), "reading rng")
        return s.value, o.value

    # -- weights -------------------------------------------------------------------------------
    def _matrix(self, a, name, shape, layout):
        a = self._floats(a, name)
        want = shape if layout == "out_in" else shape[::-1]
        if a.shape != want:
            raise ArgumentError(BUFFER_TOO_SMALL,
                                f"{name} has shape {a.shape}, expected {want} ({layout})")
        return np.array(a if layout == "out_in" else a.T, dtype=np.float32, order="C")

    def _vector(self, a, name, n, needed):
        if not needed:
            if a is not None:
                raise ArgumentError(INVALID_ARGUMENT, f"{name} given, but this FFN has none")
            return None
        if a is None:
            raise ArgumentError(NULL_ARGUMENT, f"{name} is needed by this FFN's configuration")
        a = self._floats(a, name)
        if a.shape != (n,):
            raise ArgumentError(BUFFER_TOO_SMALL, f"{name} has shape {a.shape}, expected ({n},)")
        return np.array(a, dtype=np.float32)

    @staticmethod
    def _floats(a, name):
        a = np.asarray(a)
        if a.dtype.kind != "f":
            raise ArgumentError(INVALID_ARGUMENT,
                                f"{name} must be a float array, not {a.dtype} (no silent casts of "
                                f"integers or objects)")
        return a.astype(np.float32, copy=False)

    def _set(self, w1, b1, w2, b2, v, bv):
        """f32 arrays [out, in] onto the device, converted on the host to the FFN's weight type
        (GGUF's rounding for q8_0 and q4_0)."""
        if self._dtype == 0:
            hw = _lib.Weights(_ptr(w1), _ptr(b1), _ptr(v), _ptr(bv), _ptr(w2), _ptr(b2))
            _check(_lib.ffn_upload_weights(self._handle, 0, ctypes.byref(hw)), "uploading weights")
            self._w, self._enc = dict(w1=w1, b1=b1, v=v, bv=bv, w2=w2, b2=b2), None
            return
        self._set_stored(self._dtype, *(_encode(self._dtype, m, self.weight_dtype, name)
                                        for m, name in ((w1, "w1"), (v, "v"), (w2, "w2"))),
                         b1, bv, b2)

    def _set_stored(self, dtype, w1, v, w2, b1, bv, b2):
        """Matrices as (bytes, shape) in dtype, [out, in], onto the device as they are. The bytes
        stay here, not their float32 values (up to eight times the size): state_dict() decodes
        them, and _set_biases() uploads them again with other biases."""
        tw = _lib.TypedWeights(dtype, w1[0].ctypes.data, v[0].ctypes.data if v else None,
                               w2[0].ctypes.data, _ptr(b1), _ptr(bv), _ptr(b2))
        st = _lib.ffn_upload_weights_typed(self._handle, 0, ctypes.byref(tw))
        if st != 0:
            detail = _lib.ffn_error_message(self._handle).decode(errors="replace")
            if detail:
                raise ArgumentError(st, detail)
            _check(st, "uploading weights")
        self._dtype = dtype
        self._enc = dict(w1=w1, v=v, w2=w2)
        self._w = dict(w1=None, b1=b1, v=None, bv=bv, w2=None, b2=b2)

    def _set_biases(self, b1, bv, b2):
        """New biases beside the matrices already on the device (float32 arrays, None where the
        FFN has none): for compressed weights, their stored bytes uploaded again, not
        converted again."""
        if self._enc is None:
            w = self._w
            return self._set(w["w1"], b1, w["w2"], b2, w["v"], bv)
        return self._set_stored(self._dtype, self._enc["w1"], self._enc["v"], self._enc["w2"],
                                b1, bv, b2)

    def _values(self):
        """The weights as float32 arrays (None where the FFN has none), compressed matrices
        decoded to the values the device holds."""
        enc = self._enc or {}
        return {k: _decode(self._dtype, *enc[k]) if enc.get(k) else a
                for k, a in self._w.items()}

    def set_weights(self, w1, b1, w2, b2, v=None, bv=None, layout="out_in"):
        """Sets every weight from arrays (copied). layout "out_in": W1 and V [d_ff, d_model], W2
        [d_model, d_ff], as nn.Linear stores them; "in_out": transposed, as numpy x @ W and
        GPT-2's Conv1D do. Biases whose flag is off must be None; V and bv only when gated."""
        if layout not in ("out_in", "in_out"):
            raise ArgumentError(INVALID_LAYOUT, f"layout must be 'out_in' or 'in_out', not "
                                                f"{layout!r}")
        c = self._cfg
        D, F = c.d_model, c.d_ff
        w1 = self._matrix(w1, "w1", (F, D), layout)
        w2 = self._matrix(w2, "w2", (D, F), layout)
        if self.gated and v is None:
            raise ArgumentError(NULL_ARGUMENT, "v is needed: this FFN is gated")
        if not self.gated and v is not None:
            raise ArgumentError(INVALID_ARGUMENT, "v given, but this FFN is not gated")
        v = self._matrix(v, "v", (F, D), layout) if self.gated else None
        b1 = self._vector(b1, "b1", F, c.bias1)
        b2 = self._vector(b2, "b2", D, c.bias2)
        bv = self._vector(bv, "bv", F, self.gated and c.bias_gate)
        self._set(w1, b1, w2, b2, v, bv)
        self._grads = None
        return self

    def _names(self):
        p = PRESETS[self.preset]
        layer = getattr(self, "_layer", 0)
        pre = getattr(self, "_prefix", "")
        return {k: pre + p[k].format(L=layer) if p[k] else k for k in
                ("w1", "b1", "v", "bv", "w2", "b2")}, p["layout"]

    def state_dict(self):
        """The weights as numpy arrays (copies), under the names and in the layout of the
        preset last loaded ("annotated", nn.Linear's w_1.weight …, by default)."""
        names, layout = self._names()
        out = {}
        for k, a in self._values().items():
            if a is None:
                continue
            out[names[k]] = (a.T if layout == "in_out" and a.ndim == 2 else a).copy()
        return out

    def load(self, path, preset="annotated", layer=0):
        """Loads this FFN's weights from a safetensors checkpoint, by the preset's tensor names
        (those of clffn-run --preset: annotated, labml, gpt2, bert, llama; {L} = layer). The
        checkpoint's shapes must match this FFN (clffn.load() makes an FFN from a file)."""
        return self._use(_find_layer(path, preset, layer), preset, layer)

    def _use(self, layer_found, preset, layer):
        found, prefix = layer_found
        c = self._cfg
        self.set_weights(found["w1"], found.get("b1") if c.bias1 else None, found["w2"],
                         found.get("b2") if c.bias2 else None,
                         found.get("v") if self.gated else None,
                         found.get("bv") if self.gated and c.bias_gate else None,
                         layout=PRESETS[preset]["layout"])
        self.preset, self._layer, self._prefix = preset, layer, prefix
        return self

    # -- passes --------------------------------------------------------------------------------
    def _input(self, x, name):
        x = self._floats(x, name)
        if x.ndim == 0 or x.shape[-1] != self._cfg.d_model:
            raise ArgumentError(BUFFER_TOO_SMALL, f"{name} must have shape [..., "
                                f"{self._cfg.d_model}], not {list(x.shape)}")
        return np.ascontiguousarray(x)

    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        """y = FFN(x) for x [..., d_model]; y has x's shape, float32."""
        x = self._input(x, "x")
        T = x.size // self._cfg.d_model
        y = np.empty_like(x)
        _check(_lib.forward_host(self._handle, T, _ptr(x), x.size, _ptr(y), y.size),
               "forward pass")
        self._last_x, self._last_shape = x, x.shape
        return y

    def backward(self, dy, accumulate=False):
        """The backward pass of the last forward: dy = dL/dy (the output's shape) in; returns
        (dx, grads), grads a dict of the weights' gradients under state_dict()'s names and
        layout. accumulate=True adds this pass's gradients to the previous backward's (kept by
        the FFN), as micro-batches do; False starts afresh."""
        if self._last_shape is None:
            raise ArgumentError(NO_FORWARD, "backward() needs a forward() first")
        dy = self._input(dy, "dy")
        if dy.shape != self._last_shape:
            raise ArgumentError(BUFFER_TOO_SMALL, f"dy has shape {list(dy.shape)}, the last "
                                f"forward's output {list(self._last_shape)}")
        if self._grads is None or not accumulate:
            # weights kept compressed have no gradients of their own: the biases' only
            keep = ("b1", "bv", "b2") if self._dtype else tuple(self._w)
            self._grads = {k: (np.zeros_like(a) if a is not None and k in keep else None)
                           for k, a in self._w.items()}
        g = self._grads
        ga = _lib.Weights(*(_ptr(g[k]) for k in ("w1", "b1", "v", "bv", "w2", "b2")))
        x = self._last_x
        dx = np.empty_like(x)
        T = x.size // self._cfg.d_model
        _check(_lib.backward_host(self._handle, T, _ptr(x), x.size, _ptr(dy), dy.size, _ptr(dx),
                                  dx.size, ctypes.byref(ga), int(bool(accumulate))),
               "backward pass")
        names, layout = self._names()
        grads = {names[k]: (a.T if layout == "in_out" and a.ndim == 2 else a).copy()
                 for k, a in g.items() if a is not None}
        return dx, grads

    _HIDDEN = {"w1": 0, "pre": 0, "v": 1, "gate": 1, "out": 2, "h": 2}

    def hidden(self, which="out"):
        """A hidden tensor of the last forward, [..., d_ff]: "w1" (or "pre") x·W1 + b1, "v" (or
        "gate") x·V + bv for gated FFNs, "out" (or "h") what enters W2, after activation, gate
        and dropout."""
        if which not in self._HIDDEN:
            raise ArgumentError(INVALID_ARGUMENT, f"hidden() takes one of {list(self._HIDDEN)}, "
                                f"not {which!r}")
        if self._last_shape is None:
            raise ArgumentError(NO_FORWARD, "hidden() needs a forward() first")
        shape = self._last_shape[:-1] + (self._cfg.d_ff,)
        out = np.empty(shape, np.float32)
        _check(_lib.read_hidden(self._handle, self._HIDDEN[which], _ptr(out), out.size, None),
               f"reading hidden '{which}'")
        return out


def _parse_dtype(name):
    if not isinstance(name, str) or name.lower() not in _lib.DTYPES:
        raise ArgumentError(INVALID_ARGUMENT, f"weight_dtype must be one of "
                                              f"{', '.join(_lib.DTYPES)}, not {name!r}")
    return _lib.DTYPES.index(name.lower())


def _encode(dtype, a, dtype_name, name):
    """An f32 matrix [out, in] (None: none) as (uint8 bytes, shape) in dtype."""
    if a is None:
        return None
    a = np.ascontiguousarray(a, dtype=np.float32)
    n = ctypes.c_size_t()
    st = _lib.dtype_bytes(dtype, a.size, ctypes.byref(n))
    if st == 0 and dtype >= 3 and a.shape[-1] % 32:
        st = INVALID_ARGUMENT
    if st != 0:
        raise ArgumentError(st, f"{name}: {dtype_name} weights need the input dimension "
                                f"({a.shape[-1]}) to be a multiple of 32")
    out = np.empty(n.value, np.uint8)
    st = _lib.convert_weights(dtype, _ptr(a), a.size, out.ctypes.data, out.size)
    if st != 0:
        raise ArgumentError(st, f"{name}: cannot convert to {dtype_name} (a value that is not "
                                f"finite?)")
    return out, a.shape


def _decode(dtype, raw, shape):
    """(bytes, shape) in dtype back to the float32 values they hold."""
    out = np.empty(shape, np.float32)
    _check(_lib.convert_to_f32(dtype, raw.ctypes.data, raw.size, out.size, _ptr(out), out.size),
           "decoding weights")
    return out


def _find_layer(path, preset, layer):
    """The preset's tensors of one layer in a checkpoint, read once: ({"w1": array, …}, the
    name prefix they were found under). W1 and W2 must be there."""
    if preset not in PRESETS:
        raise ArgumentError(INVALID_ARGUMENT, f"unknown preset {preset!r} ({', '.join(PRESETS)})")
    tensors = _read_safetensors(os.fspath(path), _preset_names(preset, layer))
    p = PRESETS[preset]
    found, prefix = {}, ""
    for k in ("w1", "b1", "v", "bv", "w2", "b2"):
        for pre in p["prefixes"] if p[k] else ():
            name = pre + p[k].format(L=layer)
            if name in tensors:
                found[k], prefix = tensors[name], pre
                break
    for k in ("w1", "w2"):
        if k not in found:
            raise ArgumentError(INVALID_ARGUMENT, f"{path}: no tensor "
                                f"'{p['prefixes'][0] + p[k].format(L=layer)}' (preset {preset}, "
                                f"layer {layer})")
    if found["w1"].ndim != 2:
        raise ArgumentError(INVALID_ARGUMENT, f"{path}: '{p['w1'].format(L=layer)}' is not a "
                                              f"matrix")
    return found, prefix


_GGML_KEPT = {0: 0, 1: 1, 30: 2, 8: 3, 2: 4}  # ggml's type numbers to clffn_dtype's


def _is_gguf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _read_gguf_layer(path, layer):
    """A GGUF file's FFN tensors of one layer, read by libclffn_io (clffn-run's reader: the file
    mapped, every offset and size checked): {"w1": (dtype, bytes, shape), …} for the matrices as
    stored ([out, in]), float32 arrays for the biases; gated when the layer has ffn_gate."""
    io, f, err = _open_checkpoint(path, _lib.GgufFile, "clffn_gguf_open")
    try:
        tensors = {f.tensors[i].name.decode(errors="replace"): f.tensors[i]
                   for i in range(f.count)}
        gated = f"blk.{layer}.ffn_gate.weight" in tensors
        names = dict(w1="ffn_gate" if gated else "ffn_up", v="ffn_up" if gated else None,
                     w2="ffn_down")
        found = {}
        for k, base in names.items():
            if base is None:
                continue
            for part, key in (("weight", k), ("bias", "b" + k[1:] if k != "v" else "bv")):
                t = tensors.get(f"blk.{layer}.{base}.{part}")
                if t is None:
                    if part == "weight":
                        raise ArgumentError(INVALID_ARGUMENT, f"{path}: no tensor "
                                            f"'blk.{layer}.{base}.weight' (GGUF, layer {layer})")
                    continue
                if t.type not in _GGML_KEPT:
                    name = io.clffn_gguf_type_name(t.type)
                    raise ArgumentError(INVALID_ARGUMENT, f"{path}: tensor "
                                        f"'blk.{layer}.{base}.{part}' is "
                                        f"{name.decode() if name else t.type}, which clffn does "
                                        f"not read (F32, F16, BF16, Q8_0 and Q4_0 are)")
                raw = np.frombuffer(ctypes.string_at(f.data + t.offset, t.bytes), np.uint8).copy()
                shape = tuple(t.ne[d] for d in range(t.rank))[::-1]
                dtype = _GGML_KEPT[t.type]
                found[key] = (dtype, raw, shape) if part == "weight" else \
                    _decode(dtype, raw, shape).reshape(-1)
        return found, gated
    finally:
        io.clffn_gguf_close(ctypes.byref(f))


def _load_gguf(path, layer, activation, device, weight_dtype, options):
    found, gated = _read_gguf_layer(path, layer)
    F, D = found["w1"][2]
    stored = {found[k][0] for k in ("w1", "v", "w2") if k in found}
    if weight_dtype == "stored":
        dtype = stored.pop() if len(stored) == 1 else 0
    else:
        dtype = _parse_dtype(weight_dtype)
    ffn = FFN(D, F, activation=activation or ("silu" if gated else "gelu_tanh"), gated=gated,
              bias1="b1" in found, bias2="b2" in found, bias_gate="bv" in found, device=device,
              weight_dtype=_lib.DTYPES[dtype], _init_weights=False, **options)
    mats = {k: found.get(k) for k in ("w1", "v", "w2")}
    if all(m is None or m[0] == dtype for m in mats.values()):  # the file's bytes as they are
        ffn._set_stored(dtype, *(m[1:] if m else None for m in mats.values()),
                        found.get("b1"), found.get("bv"), found.get("b2"))
    else:  # the values, converted to the type asked for
        vals = {k: _decode(*m) if m else None for k, m in mats.items()}
        ffn._set(vals["w1"], found.get("b1"), vals["w2"], found.get("b2"), vals["v"],
                 found.get("bv"))
    ffn.preset, ffn._layer, ffn._prefix = "gguf" if gated else "gguf_plain", layer, ""
    return ffn


def load(path, preset="annotated", layer=0, activation=None, device=None, weight_dtype="stored",
         **options):
    """An FFN made from a checkpoint: d_model and d_ff from its shapes, the activation and gate
    from the preset (or `activation`), a bias wherever its tensor exists. A GGUF file (found by
    its magic; no preset) gives llama.cpp's layer blk.{layer}: SwiGLU with ffn_gate, else a
    plain FFN of ffn_up and ffn_down (GELU, ggml's tanh form). weight_dtype "stored" keeps the
    weights in the file's type where clffn keeps it (F16, BF16, Q8_0, Q4_0; else f32); "f32",
    "f16", "bf16", "q8_0" or "q4_0" converts them on the host."""
    if _is_gguf(os.fspath(path)):
        return _load_gguf(os.fspath(path), layer, activation, device, weight_dtype, options)
    layer_found = _find_layer(path, preset, layer)
    found, p = layer_found[0], PRESETS[preset]
    F, D = found["w1"].shape if p["layout"] == "out_in" else found["w1"].shape[::-1]
    gated = p["gated"] if p["gated"] is not None else "v" in found
    ffn = FFN(D, F, activation=activation or p["activation"], gated=gated,
              bias1="b1" in found, bias2="b2" in found, bias_gate="bv" in found, device=device,
              weight_dtype="f32" if weight_dtype == "stored" else weight_dtype, **options)
    return ffn._use(layer_found, preset, layer)
