"""Flash attention forward and backward in Triton: causal, ALiBi, GQA/MQA, sliding window, varlen."""

__version__ = "0.1.0"
