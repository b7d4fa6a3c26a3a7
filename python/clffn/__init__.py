"""clffn from Python: the Transformer's position-wise feed-forward network on any OpenCL device.

A thin layer over the C library (libclffn, through ctypes): the C library computes, this package
checks what it is given and converts arrays.

    import numpy as np, clffn
    print(clffn.devices())
    ffn = clffn.FFN(512, 2048, activation="gelu")        # nn.Linear-style random weights
    y = ffn(np.random.rand(64, 10, 512).astype(np.float32))

Mixture of experts: clffn.MoE(d_model, d_ff, experts, top_k=2) (Mixtral's block by default).

PyTorch: clffn.torch.FeedForward, clffn.torch.MoE (Mixtral's block) and clffn.torch.Qwen2MoE
(Qwen2-MoE's), nn.Modules whose forward and backward run on clffn.
"""
from ._ffn import (ACTIVATIONS, PRESETS, ArgumentError, Error, FFN, devices, load, version)
from ._moe import MoE

__all__ = ["FFN", "MoE", "Error", "ArgumentError", "devices", "load", "version", "ACTIVATIONS",
           "PRESETS"]
__version__ = version()
