"""The package imports and carries one version, the one its metadata reports."""

import importlib.metadata

import pytest

import fused_gemm


def test_version_is_the_single_source():
    assert isinstance(fused_gemm.__version__, str) and fused_gemm.__version__.count(".") >= 2
    try:
        installed = importlib.metadata.version("fused-gemm")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fused-gemm is not installed: running from the source tree, no metadata to compare")
    assert installed == fused_gemm.__version__
