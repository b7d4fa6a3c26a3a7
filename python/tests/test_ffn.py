"""clffn.FFN against the numpy reference: every activation, plain and gated, both layouts, the
residual, any input rank, dropout's mask (the C library's own), backward and accumulation,
loading checkpoints by preset, and the errors."""
import ctypes
import json
import os
import struct

import numpy as np
import pytest

import clffn
from clffn import _lib
import reference as ref

D, F = 12, 20


def weights(gated, seed=1, D=D, F=F):
    rng = np.random.default_rng(seed)
    w = {"w1": rng.uniform(-0.5, 0.5, (F, D)), "b1": rng.uniform(-0.5, 0.5, F),
         "w2": rng.uniform(-0.5, 0.5, (D, F)), "b2": rng.uniform(-0.5, 0.5, D)}
    if gated:
        w["v"] = rng.uniform(-0.5, 0.5, (F, D))
        w["bv"] = rng.uniform(-0.5, 0.5, F)
    return w


def make(activation, gated, layout="out_in", residual=False, dropout=0.0, seed=1):
    w = weights(gated, seed)
    ffn = clffn.FFN(D, F, activation=activation, gated=gated, residual=residual, dropout=dropout)
    t = (lambda a: a.T) if layout == "in_out" else (lambda a: a)
    ffn.set_weights(t(w["w1"]), w["b1"], t(w["w2"]), w["b2"], v=t(w["v"]) if gated else None,
                    bv=w.get("bv"), layout=layout)
    return ffn, w


@pytest.mark.parametrize("activation", clffn.ACTIVATIONS)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("layout", ["out_in", "in_out"])
def test_forward_backward_match_reference(activation, gated, layout):
    residual = layout == "in_out"
    ffn, w = make(activation, gated, layout, residual)
    x = np.random.default_rng(2).uniform(-1, 1, (3, 5, D)).astype(np.float32)
    y = ffn(x)
    assert y.shape == x.shape and y.dtype == np.float32
    yr, keep = ref.forward(x, w, activation, gated, residual)
    ref.close(y, yr)
    dy = np.random.default_rng(3).uniform(-1, 1, x.shape).astype(np.float32)
    dx, g = ffn.backward(dy)
    dxr, gr = ref.backward(dy, w, activation, gated, residual, keep)
    ref.close(dx, dxr)
    names = {"w1": "w_1.weight", "b1": "w_1.bias", "w2": "w_2.weight", "b2": "w_2.bias",
             "v": "linear_v.weight", "bv": "linear_v.bias"}
    if gated:
        names.update(w1="layer1.weight", b1="layer1.bias", w2="layer2.weight", b2="layer2.bias")
    assert set(g) == {names[k] for k in gr}
    for k, r in gr.items():
        ref.close(g[names[k]], r)


def test_any_rank_and_conversions():
    ffn, w = make("gelu", False)
    rng = np.random.default_rng(4)
    x64 = rng.uniform(-1, 1, (2, 3, 4, D))  # float64: converted with a copy
    ref.close(ffn(x64), ref.forward(x64, w, "gelu", False)[0])
    x1 = x64[0, 0, 0]  # one vector
    assert ffn(x1).shape == (D,)
    strided = np.asfortranarray(rng.uniform(-1, 1, (7, D)))  # not C-contiguous
    ref.close(ffn(strided), ref.forward(strided, w, "gelu", False)[0])
    assert ffn(np.zeros((0, D), np.float32)).shape == (0, D)


def test_hidden_tensors():
    ffn, w = make("relu", True)
    x = np.random.default_rng(5).uniform(-1, 1, (2, 3, D)).astype(np.float32)
    ffn(x)
    X = x.reshape(-1, D).astype(np.float64)
    ref.close(ffn.hidden("w1").reshape(-1, F), X @ w["w1"].T + w["b1"])
    ref.close(ffn.hidden("gate").reshape(-1, F), X @ w["v"].T + w["bv"])
    assert ffn.hidden("out").shape == (2, 3, F)


def test_dropout_mask_is_the_c_librarys():
    p = 0.4
    ffn, w = make("identity", False, dropout=p)
    ffn.train()
    ffn.seed(1234, 17)
    x = np.random.default_rng(6).uniform(-1, 1, (4, D)).astype(np.float32)
    y = ffn(x)
    h = ffn.hidden("out").reshape(-1)
    keep = np.array([_lib.dropout_keep(p, 1234, 17, i) for i in range(h.size)], np.float64)
    assert 0.2 < 1 - keep.mean() < 0.6
    assert np.array_equal(h != 0, keep == 1)
    yr, _ = ref.forward(x, w, "identity", False, mask=keep.reshape(4, F), p=p)
    ref.close(y, yr)
    # the next training forward draws past this one's blocks; eval() stops dropping
    assert ffn.rng_state() == (1234, 17 + (4 * F + 3) // 4)
    ffn.eval()
    ref.close(ffn(x), ref.forward(x, w, "identity", False)[0])


def test_backward_accumulates():
    ffn, w = make("silu", True)
    x = np.random.default_rng(7).uniform(-1, 1, (3, D)).astype(np.float32)
    dy = np.ones_like(x)
    ffn(x)
    _, g1 = ffn.backward(dy)
    ffn(x)
    _, g2 = ffn.backward(dy, accumulate=True)
    for k in g1:
        ref.close(g2[k], 2 * g1[k].astype(np.float64))


def test_state_dict_round_trip_and_defaults():
    ffn = clffn.FFN(D, F)
    sd = ffn.state_dict()
    assert set(sd) == {"w_1.weight", "w_1.bias", "w_2.weight", "w_2.bias"}
    assert sd["w_1.weight"].shape == (F, D)
    bound = 1 / np.sqrt(D)
    assert np.abs(sd["w_1.weight"]).max() <= bound  # nn.Linear's initialisation
    sd["w_1.weight"][:] = 0  # a copy: the FFN is unchanged
    assert np.abs(ffn.state_dict()["w_1.weight"]).max() > 0
    assert "relu" in repr(ffn) and ffn.dropout == 0.0


def save_safetensors(path, tensors, dtype="F32"):
    header, blobs, off = {}, [], 0
    np_type = {"F32": np.float32, "F16": np.float16, "I64": np.int64}[dtype]
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, np_type).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_load_presets(tmp_path):
    w = weights(False, 8)
    path = tmp_path / "gpt2.safetensors"  # Conv1D: [in, out]
    save_safetensors(path, {"transformer.h.2.mlp.c_fc.weight": w["w1"].T,
                            "transformer.h.2.mlp.c_fc.bias": w["b1"],
                            "transformer.h.2.mlp.c_proj.weight": w["w2"].T,
                            "transformer.h.2.mlp.c_proj.bias": w["b2"]})
    ffn = clffn.load(path, preset="gpt2", layer=2)
    assert ffn.activation == "gelu_tanh" and ffn.d_model == D and ffn.d_ff == F
    x = np.random.default_rng(9).uniform(-1, 1, (3, D)).astype(np.float32)
    ref.close(ffn(x), ref.forward(x, w, "gelu_tanh", False)[0])
    sd = ffn.state_dict()
    assert sd["transformer.h.2.mlp.c_fc.weight"].shape == (D, F)
    g = tmp_path / "llama.safetensors"
    wg = weights(True, 9)
    save_safetensors(g, {"model.layers.0.mlp.gate_proj.weight": wg["w1"],
                         "model.layers.0.mlp.up_proj.weight": wg["v"],
                         "model.layers.0.mlp.down_proj.weight": wg["w2"]})
    llama = clffn.load(g, preset="llama")
    assert llama.gated and llama.activation == "silu"
    for k in ("b1", "bv", "b2"):
        wg[k] = None
    ref.close(llama(x), ref.forward(x, wg, "silu", True)[0])
    with pytest.raises(clffn.Error, match="no .*layer 3"):
        clffn.load(g, preset="llama", layer=3)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(g.read_bytes()[:100])
    with pytest.raises(clffn.Error, match="bad.safetensors: "):
        clffn.load(bad, preset="llama")
    # F16 weights are converted by the library's loader (clffn-run's), exactly
    half = tmp_path / "half.safetensors"
    w16 = {k: (a.astype(np.float16) if a is not None else None) for k, a in wg.items()}
    save_safetensors(half, {"model.layers.0.mlp.gate_proj.weight": w16["w1"],
                            "model.layers.0.mlp.up_proj.weight": w16["v"],
                            "model.layers.0.mlp.down_proj.weight": w16["w2"]}, dtype="F16")
    w64 = {k: (a.astype(np.float64) if a is not None else None) for k, a in w16.items()}
    ref.close(clffn.load(half, preset="llama")(x), ref.forward(x, w64, "silu", True)[0])
    ints = tmp_path / "ints.safetensors"
    save_safetensors(ints, {"w_1.weight": np.ones((F, D)), "w_2.weight": np.ones((D, F))},
                     dtype="I64")
    with pytest.raises(clffn.Error, match="I64; only F32"):
        clffn.load(ints)


def test_errors():
    with pytest.raises(clffn.Error) as e:
        clffn.FFN(0, 4)
    assert e.value.name == "CLFFN_ERROR_INVALID_SIZE" and isinstance(e.value, ValueError)
    with pytest.raises(clffn.Error, match="unknown activation"):
        clffn.FFN(4, 4, activation="tanh")
    with pytest.raises(clffn.Error) as e:
        clffn.FFN(4, 4, dropout=1.5)
    assert e.value.name == "CLFFN_ERROR_INVALID_DROPOUT" and e.value.status == -4100
    ffn = clffn.FFN(4, 8)
    with pytest.raises(clffn.Error, match=r"\[\.\.\., 4\]"):
        ffn(np.ones((2, 5), np.float32))
    with pytest.raises(clffn.Error, match="float array"):
        ffn(np.ones((2, 4), np.int32))
    with pytest.raises(clffn.Error, match="forward"):
        clffn.FFN(4, 8).backward(np.ones((1, 4), np.float32))
    ffn(np.ones((2, 4), np.float32))
    with pytest.raises(clffn.Error, match="dy has shape"):
        ffn.backward(np.ones((3, 4), np.float32))
    with pytest.raises(clffn.Error, match="expected"):
        ffn.set_weights(np.ones((8, 5)), np.ones(8), np.ones((4, 8)), np.ones(4))
    with pytest.raises(clffn.Error, match="not gated"):
        ffn.set_weights(np.ones((8, 4)), np.ones(8), np.ones((4, 8)), np.ones(4), v=np.ones((8, 4)))
    with pytest.raises(clffn.Error, match="layout"):
        ffn.set_weights(np.ones((8, 4)), np.ones(8), np.ones((4, 8)), np.ones(4), layout="rows")
    with pytest.raises(clffn.Error) as e:
        clffn.FFN(4, 8, device="no such device")
    assert e.value.name == "CLFFN_ERROR_DEVICE_NOT_FOUND"


def test_devices_fields():
    ds = clffn.devices()
    assert ds, "no OpenCL device"
    want = {"index", "platform", "name", "vendor", "type", "driver_version", "device_version",
            "opencl_c_version", "compute_units", "clock_mhz", "global_mem_bytes",
            "local_mem_bytes", "max_alloc_bytes", "max_work_group_size", "fp16", "fp64",
            "supported", "denormals", "software", "default", "tuning"}
    assert set(ds[0]) == want
    assert any(d["supported"] for d in ds)
    assert sum(d["default"] for d in ds) == 1
    # the default is the device an FFN gets when none is named
    default = next(d for d in ds if d["default"])
    if "CLFFN_DEVICE" not in os.environ:
        assert clffn.FFN(4, 8).device_name() == default["name"]
    ffn = clffn.FFN(4, 8, device=ds[0]["index"])
    assert ffn.device_name() == ds[0]["name"]


def test_device_info_layout_matches_the_library():
    size = _lib.lib.clffn_device_info_size
    size.restype = ctypes.c_size_t
    assert ctypes.sizeof(_lib.DeviceInfo) == size()
