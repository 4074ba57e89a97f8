"""Triton matmul with fused epilogues (bias, ReLU, GELU), batched matmul and a Linear module, forward and backward.

Public API (fp32/fp16/bf16, fp32 accumulation):
- matmul(x, w, bias=None, activation=None, *, allow_tf32=None): act(x @ w + bias), x (..., n), w (n, k).
- bmm(a, b, bias=None, activation=None, *, allow_tf32=None): per batch, a (B, m, n), b (B, n, k).
- Linear(in_features, out_features, bias=True, activation=None): drop-in nn.Linear subclass.
- mlp(x, w1, b1, w2, b2, activation="gelu"): act(x @ w1 + b1) @ w2 + b2, the activation's backward fused
  into the second product's input gradient.
- MLP(d_model, d_hidden, activation="gelu", bias=True): fc1 + activation + fc2, through mlp.
activation: None, "relu", "gelu", "gelu_tanh".
"""

from .modules import MLP, Linear
from .ops.matmul import GemmFunction, bmm, matmul
from .ops.mlp import MLPFunction, mlp

__version__ = "0.3.0"

__all__ = ["MLP", "GemmFunction", "Linear", "MLPFunction", "bmm", "matmul", "mlp", "__version__"]
