"""Bad input to softmax raises a clear error naming the argument, before any launch."""

import pytest
import torch

from fused_norm_xent import log_softmax, softmax


@pytest.mark.parametrize("fn", [softmax, log_softmax])
def test_rejects_integer_dtype(fn):
    with pytest.raises(TypeError, match=r"^x has dtype torch.int64"):
        fn(torch.ones(2, 3, dtype=torch.int64))


@pytest.mark.parametrize("fn", [softmax, log_softmax])
def test_rejects_non_tensor(fn):
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor"):
        fn([1.0, 2.0])


@pytest.mark.parametrize("dim", [2, -3])
def test_rejects_dim_out_of_range(dim):
    with pytest.raises(ValueError, match=rf"^dim={dim} is out of range"):
        softmax(torch.ones(2, 3), dim)


def test_rejects_non_int_dim():
    with pytest.raises(TypeError, match=r"^dim must be an int"):
        softmax(torch.ones(2, 3), 1.0)


def test_rejects_wrong_device():
    """On a CPU tensor while kernels run on CUDA (or a meta tensor under the interpreter)."""
    x = torch.ones(2, 3, device="meta")
    with pytest.raises(ValueError, match=r"^x is on meta"):
        softmax(x)
