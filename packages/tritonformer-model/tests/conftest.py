"""Fixtures of this package's tests: twin models that share one state_dict."""

from __future__ import annotations

import pytest

from tritonformer import TorchTransformer, Transformer, TransformerConfig
from tritonformer.model import check_kernel_apis


def require_kernel_apis(config: TransformerConfig) -> None:
    """Skip, with the exact missing kernel APIs as the reason, when Transformer cannot run the config."""
    try:
        check_kernel_apis(config)
    except NotImplementedError as error:
        pytest.skip(str(error))


@pytest.fixture
def twins(device):
    """make(config) -> (Transformer, TorchTransformer) on the kernel device, one state_dict."""

    def make(config: TransformerConfig):
        require_kernel_apis(config)
        ours = Transformer(config).to(device)
        reference = TorchTransformer(config).to(device)
        reference.load_state_dict(ours.state_dict())
        return ours, reference

    return make
