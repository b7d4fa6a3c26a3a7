"""clffn.torch: the module's forward and its gradients against autograd of the same PyTorch
module, gradcheck-style finite differences of the loss, from_module, a training loop whose
loss falls, and weights kept compressed (a frozen base under trained adapters and biases).
Skipped where python3-torch is not installed."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import clffn  # noqa: E402
import clffn.torch as ct  # noqa: E402
import reference as ref  # noqa: E402
from reference import DEQUANT  # noqa: E402

D, FF = 10, 24


class Positionwise(nn.Module):
    """The Annotated Transformer's PositionwiseFeedForward (the seed), with an activation."""

    def __init__(self, d_model, d_ff, dropout=0.1, activation=F.relu):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation

    def forward(self, x):
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class Gated(nn.Module):
    """labml's FeedForward, gated."""

    def __init__(self, d_model, d_ff, activation=nn.SiLU()):
        super().__init__()
        self.layer1 = nn.Linear(d_model, d_ff)
        self.layer2 = nn.Linear(d_ff, d_model)
        self.linear_v = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(0.0)
        self.activation = activation
        self.is_gated = True

    def forward(self, x):
        return self.layer2(self.dropout(self.activation(self.layer1(x)) * self.linear_v(x)))


@pytest.mark.parametrize("make,act", [
    (lambda: Positionwise(D, FF, 0.0), None),
    (lambda: Positionwise(D, FF, 0.0, F.gelu), None),
    (lambda: Positionwise(D, FF, 0.0, nn.GELU(approximate="tanh")), None),
    (lambda: Gated(D, FF), None),
    (lambda: Gated(D, FF, nn.ReLU()), None),
])
def test_forward_and_grads_match_autograd(make, act):
    torch.manual_seed(0)
    ref = make().eval()
    ff = ct.from_module(ref)
    x = torch.rand(3, 4, D, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y = ff(x)
    y_ref = ref(x2)
    assert torch.allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    w = torch.rand_like(y)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    assert torch.allclose(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    mine = dict(ff.named_parameters())
    for name, p in ref.named_parameters():
        assert torch.allclose(mine[name].grad, p.grad, rtol=1e-4, atol=1e-5), name


def test_finite_differences():
    """The gradient of a scalar loss against central differences in float64 on the weights,
    computed through the module itself (gradcheck's method, at float32's precision)."""
    torch.manual_seed(1)
    ff = ct.FeedForward(4, 8, dropout=0.0, activation="gelu").eval()
    x = torch.rand(5, 4)
    loss = lambda: float((ff(x) ** 2).sum())
    (ff(x) ** 2).sum().backward()
    p = ff.w_1.weight
    for idx in [(0, 0), (3, 2), (7, 1)]:
        with torch.no_grad():
            old = float(p[idx])
            h = 1e-2
            p[idx] = old + h
            up = loss()
            p[idx] = old - h
            down = loss()
            p[idx] = old
        fd = (up - down) / (2 * h)
        assert abs(fd - float(p.grad[idx])) <= 2e-3 * max(1.0, abs(fd)), (idx, fd, p.grad[idx])


def test_dropout_training_and_backward_after_another_forward():
    torch.manual_seed(2)
    ff = ct.FeedForward(D, FF, dropout=0.5).train()
    ff.seed(5)
    x = torch.rand(6, D, requires_grad=True)
    y1 = ff(x)
    y2 = ff(x)  # a fresh mask
    assert not torch.allclose(y1, y2)
    y1.sum().backward()  # differentiates the first forward, mask and all
    g_first = x.grad.clone()
    x.grad = None
    ff.seed(5)
    ff(x).sum().backward()
    assert torch.allclose(g_first, x.grad, rtol=1e-5, atol=1e-6)
    ff.eval()
    assert torch.allclose(ff(x), ff(x))


def fit(model, params, x, teacher, steps=60):
    """Adam on params, fitting model(x) to teacher(x) by mean squared error: each step's loss."""
    opt = torch.optim.Adam(params, lr=1e-2)
    with torch.no_grad():
        target = teacher(x)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def test_training_loop_loss_falls():
    torch.manual_seed(3)
    teacher = Positionwise(D, FF, 0.0).eval()
    ff = ct.FeedForward(D, FF, dropout=0.0)
    x = torch.rand(64, D)
    losses = fit(ff, list(ff.parameters()), x, teacher)
    assert losses[-1] < 0.2 * losses[0], losses[::10]


def test_state_dict_names_are_the_references():
    assert set(ct.FeedForward(D, FF).state_dict()) == set(Positionwise(D, FF).state_dict())
    assert set(ct.FeedForward(D, FF, activation="swiglu").state_dict()) == set(
        Gated(D, FF).state_dict())


# -- weights kept compressed: a frozen base ------------------------------------------------------
DQ, FQ = 64, 96  # quantized types need input dimensions that are multiples of 32


def rounded_copy(module, dtype):
    """module in float64 with its matrices rounded to dtype as GGUF rounds them (reference.py's
    ports, independent of clffn): the module the device computes."""
    out = copy.deepcopy(module).double()
    with torch.no_grad():
        for m in out.modules():
            if isinstance(m, nn.Linear):
                w = m.weight.detach().float().numpy()
                m.weight.copy_(torch.from_numpy(DEQUANT[dtype](w).astype(np.float64)))
    return out


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0", "q4_0"])
@pytest.mark.parametrize("make", [lambda: Positionwise(DQ, FQ, 0.0, F.gelu),
                                  lambda: Gated(DQ, FQ)])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_compressed_weights_forward_and_grads(dtype, make, tokens):
    """x's gradient and the biases' against autograd of the module with its matrices rounded
    to the type, in float64; the matrices stay frozen, holding the values given."""
    torch.manual_seed(4)
    base = make().eval()
    ff = ct.from_module(base, weight_dtype=dtype)
    assert ff.weight_dtype == dtype
    ref_m = rounded_copy(base, dtype)
    mine = dict(ff.named_parameters())
    for name, p in base.named_parameters():
        if name.endswith("weight"):
            assert not mine[name].requires_grad, name
            assert mine[name].dtype == {"f16": torch.float16, "bf16": torch.bfloat16}.get(
                dtype, torch.float32), name
            np.testing.assert_array_equal(mine[name].float().detach().numpy(),
                                          p.to(mine[name].dtype).float().detach().numpy())
    x = torch.rand(tokens, DQ) * 2 - 1
    xm, xr = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    y, yr = ff(xm), ref_m(xr)
    ref.close(y.detach().numpy(), yr.detach().numpy())
    w = torch.rand(tokens, DQ, dtype=torch.float64)
    (y * w.float()).sum().backward()
    (yr * w).sum().backward()
    ref.close(xm.grad.numpy(), xr.grad.numpy())
    theirs = dict(ref_m.named_parameters())
    for name, p in ff.named_parameters():
        if name.endswith("weight"):
            assert p.grad is None, name
        else:
            ref.close(p.grad.numpy(), theirs[name].grad.numpy(), atol=1e-6)


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_matrices_are_uploaded_again_only_when_changed(dtype):
    torch.manual_seed(5)
    base = Gated(DQ, FQ).eval()
    ff = ct.from_module(base, weight_dtype=dtype)
    x = torch.rand(4, DQ)
    with torch.no_grad():
        y0 = ff(x)
        ff.layer2.weight.mul_(0.5)  # in place under no_grad, as load_state_dict() changes it
        base.layer2.weight.mul_(0.5)
        y1 = ff(x)
        ref.close(y1.numpy(), rounded_copy(base, dtype)(x.double()).numpy())
        assert not torch.allclose(y0, y1)
        b2 = ff.layer2.bias.clone()
        ff.layer2.bias.add_(1.0)  # a bias alone changed: the stored matrices go up again
        base.layer2.bias.add_(1.0)
        ref.close(ff(x).numpy(), rounded_copy(base, dtype)(x.double()).numpy())
        ff.layer2.bias.copy_(b2)
        base.layer2.bias.copy_(b2)
        ff.layer2.weight.data.zero_()  # through .data: not seen until upload()
        np.testing.assert_array_equal(ff(x).numpy(), y1.numpy())
        ff.upload()
        ref.close(ff(x).numpy(), ff.layer2.bias.expand(4, DQ).numpy())
        ff.layer2.weight = nn.Parameter(base.layer2.weight.clone(), requires_grad=False)
        np.testing.assert_array_equal(ff(x).numpy(), y1.numpy())  # a new Parameter is seen


def test_compressed_matrix_asked_for_a_gradient_is_refused():
    ff = ct.FeedForward(DQ, FQ, dropout=0.0, weight_dtype="q4_0")
    ff.w_2.weight.requires_grad_(True)
    x = torch.rand(2, DQ)
    with pytest.raises(clffn.ArgumentError, match="w_2.weight is kept compressed") as e:
        ff(x)
    assert e.value.name == "CLFFN_ERROR_COMPRESSED_WEIGHTS"
    with torch.no_grad():  # no gradient wanted: the forward runs
        assert ff(x).shape == (2, DQ)


def test_adapter_and_biases_trained_on_a_frozen_q4_0_base():
    """A low-rank adapter before the FFN and the FFN's biases trained through a q4_0 base:
    the loss falls, the base's matrices stay as they were, and the biases' steps reach the
    device (uploaded every forward)."""
    torch.manual_seed(6)
    teacher = Positionwise(DQ, FQ, 0.0).eval()
    ff = ct.FeedForward(DQ, FQ, dropout=0.0, weight_dtype="q4_0")
    frozen = {n: p.clone() for n, p in ff.named_parameters() if not p.requires_grad}
    a = nn.Parameter(torch.randn(DQ, 4) * 0.1)
    b = nn.Parameter(torch.zeros(4, DQ))
    x = torch.rand(64, DQ)
    losses = fit(lambda x: ff(x + x @ a @ b), [a, b] + [p for p in ff.parameters()
                                                         if p.requires_grad], x, teacher)
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    assert b.grad.abs().max() > 0
    for n, p in ff.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
