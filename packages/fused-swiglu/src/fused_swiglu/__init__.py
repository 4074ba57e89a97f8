"""SwiGLU in Triton with the gate and up matmuls and the activation fused, forward and backward."""

__version__ = "0.1.0"
