"""The package imports and carries one version, the one its metadata reports."""

import importlib.metadata

import pytest

import fused_rope


def test_version_is_the_single_source():
    assert isinstance(fused_rope.__version__, str) and fused_rope.__version__.count(".") >= 2
    try:
        installed = importlib.metadata.version("fused-rope")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("fused-rope is not installed: running from the source tree, no metadata to compare")
    assert installed == fused_rope.__version__
