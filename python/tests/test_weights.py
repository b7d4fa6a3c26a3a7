"""Weights kept in their stored type from Python: FFN(weight_dtype=…) converts as GGUF's
reference does (checked against reference.py's numpy ports of quantize_row_q8_0_ref and
q4_0_ref), the forward and dx match the numpy reference on the dequantized weights, and
clffn.load() reads a GGUF file written here."""
import struct

import numpy as np
import pytest

import clffn
import reference as ref
from reference import DEQUANT, bf16, q8_0

D, F = 64, 96


def weights(seed=1, gated=True):
    rng = np.random.default_rng(seed)
    w = {"w1": rng.uniform(-0.3, 0.3, (F, D)), "w2": rng.uniform(-0.2, 0.2, (D, F)),
         "b1": rng.uniform(-0.5, 0.5, F), "b2": rng.uniform(-0.5, 0.5, D)}
    if gated:
        w["v"] = rng.uniform(-0.3, 0.3, (F, D))
    return {k: a.astype(np.float32) for k, a in w.items()}


@pytest.mark.parametrize("dtype", list(DEQUANT))
def test_types_convert_as_gguf_and_match_the_reference(dtype):
    w = weights()
    ffn = clffn.FFN(D, F, activation="swiglu", bias_gate=False, weight_dtype=dtype)
    ffn.set_weights(w["w1"], w["b1"], w["w2"], w["b2"], v=w["v"])
    assert ffn.weight_dtype == dtype
    dq = {k: (DEQUANT[dtype](a) if a.ndim == 2 else a) for k, a in w.items()}
    sd = ffn.state_dict()
    np.testing.assert_array_equal(sd["layer1.weight"], dq["w1"])  # bit for bit
    np.testing.assert_array_equal(sd["layer2.weight"], dq["w2"])
    np.testing.assert_array_equal(sd["linear_v.weight"], dq["v"])
    wd = {k: a.astype(np.float64) for k, a in dq.items()}
    for T in (1, 3, 40):  # both sides of the few-token crossover
        x = np.random.default_rng(T).uniform(-1, 1, (T, D)).astype(np.float32)
        yr, keep = ref.forward(x, wd, "silu", True)
        ref.close(ffn(x), yr)
        dy = np.random.default_rng(T + 1).uniform(-1, 1, (T, D)).astype(np.float32)
        dx, g = ffn.backward(dy)
        dxr, gr = ref.backward(dy, wd, "silu", True, False, keep)
        ref.close(dx, dxr)
        if dtype == "f32":
            assert "layer1.weight" in g
        else:  # weights kept compressed: the biases' gradients only
            assert set(g) == {"layer1.bias", "layer2.bias"}
        ref.close(g["layer1.bias"], gr["b1"])


def test_bytes_and_refusals():
    assert clffn.FFN(D, F, weight_dtype="q4_0").weight_bytes == 2 * F * D // 32 * 18
    assert clffn.FFN(D, F, weight_dtype="F16").weight_bytes == 2 * F * D * 2
    with pytest.raises(clffn.ArgumentError, match="multiple of 32"):
        clffn.FFN(12, 20, weight_dtype="q8_0")
    with pytest.raises(clffn.ArgumentError, match="weight_dtype"):
        clffn.FFN(D, F, weight_dtype="q5_k")


def _gguf(path, tensors, version=3):
    """A GGUF file of (name, ggml type, ne list, bytes), data aligned to 32."""
    s = lambda t: struct.pack("<Q", len(t.encode())) + t.encode()
    kv = s("general.architecture") + struct.pack("<I", 8) + s("llama")
    infos, data = b"", b""
    for name, t, ne, raw in tensors:
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", t, len(data))
        data += raw + bytes(-len(raw) % 32)
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), 1) + kv + infos
    with open(path, "wb") as f:
        f.write(head + bytes(-len(head) % 32) + data)


def _q8_0_bytes(w):
    """GGUF's q8_0 blocks of an [out, in] matrix, from the reference above."""
    b = w.astype(np.float32).reshape(-1, 32)
    d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float32)
    idv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (b * idv[:, None]).astype(np.float32).astype(np.float64)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)
    out = bytearray()
    for di, qi in zip(d.astype(np.float16), q):
        out += di.tobytes() + qi.tobytes()
    return bytes(out)


def test_load_gguf(tmp_path):
    w = weights(7)
    path = tmp_path / "m.gguf"
    _gguf(path, [("blk.0.ffn_gate.weight", 8, [D, F], _q8_0_bytes(w["w1"])),
                 ("blk.0.ffn_up.weight", 8, [D, F], _q8_0_bytes(w["v"])),
                 ("blk.0.ffn_down.weight", 8, [F, D], _q8_0_bytes(w["w2"])),
                 ("blk.0.ffn_down.bias", 0, [D], w["b2"].tobytes())])
    ffn = clffn.load(path)
    assert ffn.weight_dtype == "q8_0" and ffn.gated and ffn.activation == "silu"
    assert ffn.weight_bytes == 3 * F * D // 32 * 34
    sd = ffn.state_dict()
    assert set(sd) == {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
                       "blk.0.ffn_down.bias"}
    np.testing.assert_array_equal(sd["blk.0.ffn_up.weight"], q8_0(w["v"]))
    x = np.random.default_rng(8).uniform(-1, 1, (2, D)).astype(np.float32)
    wd = {"w1": q8_0(w["w1"]), "v": q8_0(w["v"]), "w2": q8_0(w["w2"]), "b2": w["b2"]}
    yr, _ = ref.forward(x, {k: a.astype(np.float64) for k, a in wd.items()}, "silu", True)
    ref.close(ffn(x), yr)
    f32 = clffn.load(path, weight_dtype="f32")  # the file's values, kept as f32
    assert f32.weight_dtype == "f32"
    ref.close(f32(x), yr)
    with pytest.raises(clffn.ArgumentError, match="no tensor 'blk.3.ffn_up.weight'"):
        clffn.load(path, layer=3)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0", "bf16"])
def test_quantized_inputs(dtype):
    """quantized_inputs=True: the hidden layer is the reference's on x rounded to q8_0
    (reference.py's port of GGUF's rounding; bf16 for bf16 weights), y the second product over
    the device's own hidden layer rounded so; the rounding moves y well past the tolerance; an FFN
    without it on the same device keeps x exact."""
    rounded = bf16 if dtype == "bf16" else q8_0
    w = weights(5)
    x = np.random.default_rng(6).uniform(-1, 1, (3, D)).astype(np.float32)
    ffn = clffn.FFN(D, F, activation="silu", gated=True, bias_gate=False, weight_dtype=dtype,
                    quantized_inputs=True)
    exact = clffn.FFN(D, F, activation="silu", gated=True, bias_gate=False, weight_dtype=dtype)
    assert ffn.quantized_inputs and not exact.quantized_inputs
    for f in (ffn, exact):
        f.set_weights(w["w1"], w["b1"], w["w2"], w["b2"], w["v"])
    dq = {k: (DEQUANT[dtype](a) if a.ndim == 2 else a).astype(np.float64) for k, a in w.items()}
    y = ffn(x)
    h = ffn.hidden("out")
    ref.close(h, ref.forward(rounded(x), dq, "silu", True)[1]["h"])
    yref = rounded(h).astype(np.float64) @ dq["w2"].T + dq["b2"]
    ref.close(y, yref)
    plain = ref.forward(x, dq, "silu", True)[0]
    ref.close(exact(x), plain)
    margin = 10 if dtype == "bf16" else 100  # bf16's rounding is 16 times finer than q8_0's
    assert np.abs(yref - plain).max() > margin * 1e-5 * np.abs(plain).max()


def test_shared_scratch():
    """Layers made with shared_scratch=True (compressed, past the few-token kernels, so their
    products dequantize into the scratch) run forward, forward, backward, backward as a model's
    layers do, each matching the reference and the same layers with scratch of their own, bit
    for bit; the others on the device keep theirs."""
    T = 300
    made = {}
    for shared in (False, True):
        made[shared] = []
        for i, dtype in enumerate(("q8_0", "f16")):
            w = weights(20 + i)
            f = clffn.FFN(D, F, activation="swiglu", bias_gate=False, weight_dtype=dtype,
                          shared_scratch=shared)
            f.set_weights(w["w1"], w["b1"], w["w2"], w["b2"], v=w["v"])
            made[shared].append((f, w, dtype))
    assert all(f.shared_scratch for f, _, _ in made[True])
    assert not any(f.shared_scratch for f, _, _ in made[False])
    rng = np.random.default_rng(30)
    xs = [rng.uniform(-1, 1, (T, D)).astype(np.float32) for _ in range(2)]
    dys = [rng.uniform(-1, 1, (T, D)).astype(np.float32) for _ in range(2)]
    out = {}
    for shared, layers in made.items():
        ys = [f(x) for (f, _, _), x in zip(layers, xs)]
        dxs = [f.backward(dy)[0] for (f, _, _), dy in zip(layers, dys)]
        out[shared] = (ys, dxs)
    for i, (f, w, dtype) in enumerate(made[True]):
        wd = {k: (DEQUANT[dtype](a) if a.ndim == 2 else a).astype(np.float64) for k, a in w.items()}
        yr, keep = ref.forward(xs[i], wd, "silu", True)
        ref.close(out[True][0][i], yr)
        ref.close(out[True][1][i], ref.backward(dys[i], wd, "silu", True, False, keep)[0])
        np.testing.assert_array_equal(out[True][0][i], out[False][0][i])
        np.testing.assert_array_equal(out[True][1][i], out[False][1][i])
