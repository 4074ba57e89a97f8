"""The package imports and carries one version, the one its metadata reports."""

import importlib.metadata

import pytest

import fused_attention


def test_version_is_the_single_source():
    assert isinstance(fused_attention.__version__, str) and fused_attention.__version__.count(".") >= 2
    try:
        installed = importlib.metadata.version("fused-attention")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fused-attention is not installed: running from the source tree, no metadata to compare")
    assert installed == fused_attention.__version__
