"""An AMP-ready GPT built from the Tritonformer kernel packages, with its PyTorch twin, train and bench commands."""

__version__ = "0.1.0"
