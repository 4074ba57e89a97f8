"""Bad input raises a clear TypeError/ValueError naming the argument, before any launch (no kernels needed)."""

import pytest
import torch

from fused_gemm import bmm, matmul


def _ok(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype)


@pytest.mark.parametrize("fn", [matmul, bmm])
def test_rejects_non_tensors(fn):
    first, second = ("x", "w") if fn is matmul else ("a", "b")
    with pytest.raises(TypeError, match=rf"^{first} must be a torch.Tensor, got list"):
        fn([1.0], _ok(1, 2, 2))
    with pytest.raises(TypeError, match=rf"^{second} must be a torch.Tensor, got int"):
        fn(_ok(1, 2, 2), 3)


def test_rejects_integer_dtypes():
    with pytest.raises(TypeError, match=r"^x has dtype torch.int64; supported: float32, float16, bfloat16"):
        matmul(torch.ones(2, 3, dtype=torch.int64), _ok(3, 4))
    with pytest.raises(TypeError, match=r"^bias has dtype torch.int32"):
        matmul(_ok(2, 3), _ok(3, 4), torch.ones(4, dtype=torch.int32))


def test_rejects_mixed_dtypes_outside_autocast():
    with pytest.raises(TypeError, match=r"^w has dtype torch.float16 but x has torch.float32"):
        matmul(_ok(2, 3), _ok(3, 4, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"^bias has dtype torch.bfloat16 but x has torch.float32"):
        matmul(_ok(2, 3), _ok(3, 4), _ok(4, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"^b has dtype torch.bfloat16 but a has torch.float16"):
        bmm(_ok(2, 2, 3, dtype=torch.float16), _ok(2, 3, 4, dtype=torch.bfloat16))


def test_rejects_mismatched_inner_dims():
    with pytest.raises(ValueError, match=r"^inner dimensions do not match: x has shape \(2, 5\) \(n = 5\) but w"):
        matmul(_ok(2, 5), _ok(4, 3))
    with pytest.raises(ValueError, match=r"^inner dimensions do not match: a has shape \(2, 2, 5\)"):
        bmm(_ok(2, 2, 5), _ok(2, 4, 3))


def test_rejects_bad_ranks_and_bias_shapes():
    with pytest.raises(ValueError, match=r"^x must have at least 1 dim"):
        matmul(torch.tensor(1.0), _ok(1, 3))
    with pytest.raises(ValueError, match=r"^w must be 2-D \(n, k\), got shape \(3,\)"):
        matmul(_ok(2, 3), _ok(3))
    with pytest.raises(ValueError, match=r"^bias must have shape \(4,\) \(w.shape\[1\]\), got \(3,\)"):
        matmul(_ok(2, 3), _ok(3, 4), _ok(3))
    with pytest.raises(ValueError, match=r"^bias must have shape \(4,\)"):
        matmul(_ok(2, 3), _ok(3, 4), _ok(1, 4))
    with pytest.raises(ValueError, match=r"^a and b must be 3-D"):
        bmm(_ok(2, 3), _ok(3, 4))
    with pytest.raises(ValueError, match=r"^batch sizes do not match: a has 2, b has 3"):
        bmm(_ok(2, 2, 3), _ok(3, 3, 4))


def test_rejects_unknown_options():
    with pytest.raises(ValueError, match=r"^activation='silu' is not supported; choose one of None, 'relu'"):
        matmul(_ok(2, 3), _ok(3, 4), activation="silu")
    with pytest.raises(TypeError, match=r"^activation must be None or a str, got int"):
        bmm(_ok(1, 2, 3), _ok(1, 3, 4), activation=1)
    with pytest.raises(TypeError, match=r"^allow_tf32 must be None, True or False, got str"):
        matmul(_ok(2, 3), _ok(3, 4), allow_tf32="yes")


def test_rejects_wrong_devices_after_the_other_checks():
    """Meta tensors are on no kernel device, interpreted or compiled; the message names the argument."""
    with pytest.raises(ValueError, match=r"^x is on meta"):
        matmul(torch.ones(2, 3, device="meta"), torch.ones(3, 4, device="meta"))
    with pytest.raises(TypeError, match=r"^w has dtype torch.float16"):  # dtype errors come first
        matmul(torch.ones(2, 3, device="meta"), torch.ones(3, 4, device="meta", dtype=torch.float16))
    with pytest.raises(ValueError, match=r"^inner dimensions"):  # and shape errors
        matmul(torch.ones(2, 3, device="meta"), torch.ones(2, 4, device="meta"))


@pytest.mark.kernels
def test_rejects_operands_on_different_devices(device):
    x = torch.ones(2, 3, device=device)
    with pytest.raises(ValueError, match=r"^w is on meta"):
        matmul(x, torch.ones(3, 4, device="meta"))
    with pytest.raises(ValueError, match=r"^bias is on meta"):
        matmul(x, torch.ones(3, 4, device=device), torch.ones(4, device="meta"))
