"""An AMP-ready GPT built from the Tritonformer kernel packages, with its PyTorch twin, train and bench commands.

- `TransformerConfig` (options, checks, presets: `TransformerConfig.preset("tiny")`).
- `TorchTransformer(config)`: the model in plain PyTorch (cuBLAS, SDPA, torch norms).
- `Transformer(config)`: the same model on the kernel packages' public APIs; the same state_dict.
- `GraphedModel(model)`: training steps whose forward and backward replay CUDA graphs.

Both: `logits, loss = model(idx, targets)`, `model.generate(idx, max_new_tokens)`.
"""

from . import positions
from .config import PRESETS, TransformerConfig
from .cuda_graph import GraphedModel
from .model import Transformer
from .torch_model import TorchTransformer

__version__ = "0.3.0"

__all__ = [
    "PRESETS",
    "GraphedModel",
    "TorchTransformer",
    "Transformer",
    "TransformerConfig",
    "__version__",
    "positions",
]
