# %% [markdown]
# # clffn from Python
# A notebook in plain Python (cells marked `# %%`, as Jupyter, VS Code and jupytext read them):
# the position-wise FFN on an OpenCL device, from numpy and from PyTorch.

# %%
import numpy as np

import clffn

for d in clffn.devices():
    print(d["index"], d["type"], d["name"], "supported" if d["supported"] else "unsupported")

# %% [markdown]
# ## The Annotated Transformer's FFN: d_model 512, d_ff 2048, ReLU
# Weights start as nn.Linear initialises them; `set_weights` takes your own (nn.Linear's
# [out, in] layout, or layout="in_out" for numpy's x @ W).

# %%
ffn = clffn.FFN(512, 2048, activation="relu", dropout=0.1)
print(ffn)
x = np.random.default_rng(0).standard_normal((64, 10, 512)).astype(np.float32)
y = ffn(x)  # inference mode: dropout is the identity
print(y.shape, y.dtype)

# the same in numpy, from the weights the FFN holds
w = ffn.state_dict()
h = np.maximum(x @ w["w_1.weight"].T + w["w_1.bias"], 0)
print("max difference from numpy:", np.abs(h @ w["w_2.weight"].T + w["w_2.bias"] - y).max())

# %% [markdown]
# ## Training: dropout, a seed, and the backward pass

# %%
ffn.train()
ffn.seed(1234)
y = ffn(x)
print("dropped:", float((ffn.hidden("out") == 0).mean()))  # ≈ 0.1 plus ReLU's zeros
dx, grads = ffn.backward(np.ones_like(y))
print({k: v.shape for k, v in grads.items()})

# %% [markdown]
# ## SwiGLU, and PyTorch (when python3-torch is installed)

# %%
try:
    import torch

    import clffn.torch as ct
except ImportError:
    torch = None
if torch is not None:
    ff = ct.FeedForward(512, 1376, activation="swiglu", dropout=0.0)
    opt = torch.optim.SGD(ff.parameters(), lr=0.1)
    xt = torch.from_numpy(x[:4])
    target = torch.zeros(4, 10, 512)
    for step in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ff(xt), target)
        loss.backward()  # runs clffn's backward, fills .grad
        opt.step()
        print(step, float(loss))
