"""Each kernel package carries this runtime as its `_runtime` (a link in the repository, a copy in
the wheel) and the project's LICENSE: both must stay the one shared version."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime" / "kernel_runtime"
KERNEL_PACKAGES = {
    "fused-attention": "fused_attention",
    "fused-gemm": "fused_gemm",
    "fused-swiglu": "fused_swiglu",
    "fused-rope": "fused_rope",
    "fused-norm-xent": "fused_norm_xent",
}


@pytest.mark.parametrize("package", sorted(KERNEL_PACKAGES))
def test_each_kernel_package_links_the_one_runtime(package):
    link = ROOT / "packages" / package / "src" / KERNEL_PACKAGES[package] / "_runtime"
    assert link.is_symlink(), f"{link} must be a link to runtime/kernel_runtime, not a copy"
    assert link.resolve() == RUNTIME


@pytest.mark.parametrize("package", sorted([*KERNEL_PACKAGES, "tritonformer-model"]))
def test_each_package_ships_the_projects_license(package):
    assert (ROOT / "packages" / package / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
