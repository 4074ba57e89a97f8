"""SwiGLU in Triton with the gate and up matmuls and the activation fused, forward and backward.

Public API (each function, Function and module also takes activation="silu" or, for GeGLU as in
Gemma's MLP, activation="gelu_tanh"):
- swiglu(x, w_gate, w_up, b_gate=None, b_up=None) and the autograd Functions
  FusedSwiGLU.apply(x, w_gate, w_up) and FastAccumFusedSwiGLU.apply(x, w_gate, w_up,
  fp16_accumulate=False) (fp16, optional fp16 accumulation);
- swiglu_mlp(x, w_gate, w_up, w_down, ...) / FusedSwiGLUMLP: the LLaMA-style MLP with the down
  projection's backward fused with the SwiGLU backward;
- modules SwiGLU(d_model, d_intermediate, bias=False) and SwiGLUMLP(d_model, d_intermediate, bias=False).
"""

from .modules import SwiGLU, SwiGLUMLP
from .ops.mlp import FusedSwiGLUMLP, swiglu_mlp
from .ops.swiglu import FastAccumFusedSwiGLU, FusedSwiGLU, swiglu

__version__ = "0.3.0"

__all__ = [
    "FastAccumFusedSwiGLU",
    "FusedSwiGLU",
    "FusedSwiGLUMLP",
    "SwiGLU",
    "SwiGLUMLP",
    "__version__",
    "swiglu",
    "swiglu_mlp",
]
