"""Rotary position embeddings in Triton, TransformerEngine-compatible, forward and backward."""

__version__ = "0.1.0"
