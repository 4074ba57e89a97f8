"""Triton matmul with fused epilogues (bias, ReLU, GELU), batched matmul and a Linear module, forward and backward."""

__version__ = "0.1.0"
