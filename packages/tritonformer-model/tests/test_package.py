"""The package imports and carries one version, the one its metadata reports."""

import importlib.metadata

import pytest

import tritonformer


def test_version_is_the_single_source():
    assert isinstance(tritonformer.__version__, str) and tritonformer.__version__.count(".") >= 2
    try:
        installed = importlib.metadata.version("tritonformer-model")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tritonformer-model is not installed: running from the source tree, no metadata to compare")
    assert installed == tritonformer.__version__
