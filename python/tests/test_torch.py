"""clffn.torch: the module's forward and its gradients against autograd of the same PyTorch
module, gradcheck-style finite differences of the loss, from_module, and a training loop whose
loss falls. Skipped where python3-torch is not installed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import clffn.torch as ct  # noqa: E402

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


def test_training_loop_loss_falls():
    torch.manual_seed(3)
    teacher = Positionwise(D, FF, 0.0).eval()
    ff = ct.FeedForward(D, FF, dropout=0.0)
    opt = torch.optim.Adam(ff.parameters(), lr=1e-2)
    x = torch.rand(64, D)
    with torch.no_grad():
        target = teacher(x)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = F.mse_loss(ff(x), target)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.2 * losses[0], losses[::10]


def test_state_dict_names_are_the_references():
    assert set(ct.FeedForward(D, FF).state_dict()) == set(Positionwise(D, FF).state_dict())
    assert set(ct.FeedForward(D, FF, activation="swiglu").state_dict()) == set(
        Gated(D, FF).state_dict())
