"""The package imports and carries one version, the one its metadata reports."""

import importlib.metadata

import pytest

import fused_norm_xent


def test_version_is_the_single_source():
    assert isinstance(fused_norm_xent.__version__, str) and fused_norm_xent.__version__.count(".") >= 2
    try:
        installed = importlib.metadata.version("fused-norm-xent")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fused-norm-xent is not installed: running from the source tree, no metadata to compare")
    assert installed == fused_norm_xent.__version__
