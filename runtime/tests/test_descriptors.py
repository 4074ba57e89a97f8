"""TMA descriptor templates: what a plan builds once must equal what the descriptor classes' own
constructors build (their checks skipped), so that descriptor_like's per-call copy launches the
same kernel specialization."""

from __future__ import annotations

import pytest
import torch

from kernel_runtime.compat import HAS_GLUON_HOPPER, TRITON_VERSION, descriptor_like, gluon_descriptor_template


@pytest.mark.skipif(
    not HAS_GLUON_HOPPER,
    reason=f"Gluon's Hopper API as the kernels use it: Triton 3.6, compiled (installed {TRITON_VERSION})",
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, block", [((300, 520), (128, 64)), ((4, 70, 3, 64), (1, 64, 1, 64))], ids=["2d", "4d"]
)  # fmt: skip
def test_gluon_template_matches_the_constructor(dtype, shape, block):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    tensor = torch.zeros(shape, dtype=dtype)
    element = gl.float16 if dtype == torch.float16 else gl.bfloat16
    layout = gl.NVMMASharedLayout.get_default_for(list(block), element)
    expected = TensorDescriptor.from_tensor(tensor, list(block), layout)
    template = gluon_descriptor_template(tensor.shape, tensor.stride(), block, dtype)
    assert template.base is None
    made = descriptor_like(template, tensor)
    assert made.base is tensor and type(made) is type(expected)
    for name in ("shape", "strides", "block_shape"):  # lists here, torch.Size / tuples there
        assert list(getattr(made, name)) == list(getattr(expected, name)), name
    assert made.layout == expected.layout and made.padding == expected.padding
    assert set(vars(made)) == set(vars(expected))
