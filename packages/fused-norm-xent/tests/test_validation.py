"""Bad input to the norms, add_dropout_norm, cross_entropy and linear_cross_entropy raises a clear
error naming the argument, before any launch (these tests launch nothing unless marked)."""

import pytest
import torch
import torch.nn.functional as F

from fused_norm_xent import (
    AddDropoutNorm,
    CrossEntropyLoss,
    LinearCrossEntropyLoss,
    add_dropout_norm,
    cross_entropy,
    layer_norm,
    linear_cross_entropy,
    rms_norm,
)


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


# Norms -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [layer_norm, rms_norm])
def test_norm_rejects_bad_x(fn):
    with pytest.raises(TypeError, match=r"^x has dtype torch.int64"):
        fn(torch.ones(2, 3, dtype=torch.int64), 3)
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor"):
        fn([1.0, 2.0], 2)


@pytest.mark.parametrize("fn", [layer_norm, rms_norm])
def test_norm_rejects_mismatched_shapes(fn):
    with pytest.raises(ValueError, match=r"^x has shape \(2, 3\), which does not end with normalized_shape \(4,\)"):
        fn(_x(2, 3), 4)
    with pytest.raises(ValueError, match=r"^weight has shape \(4,\) but must have shape \(3,\)"):
        fn(_x(2, 3), 3, _x(4))
    with pytest.raises(ValueError, match=r"^normalized_shape=\(\) must be"):
        fn(_x(2, 3), ())


def test_norm_rejects_bad_parameters():
    with pytest.raises(TypeError, match=r"^bias has dtype torch.int32"):
        layer_norm(_x(2, 3), 3, _x(3), torch.ones(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^eps=-1.0 must be a finite number in \[0.0, inf\]"):
        layer_norm(_x(2, 3), 3, eps=-1.0)


def test_norm_rejects_wrong_device():
    with pytest.raises(ValueError, match=r"^x is on meta"):
        layer_norm(torch.ones(2, 3, device="meta"), 3)


def test_add_dropout_norm_rejects_bad_input():
    x = _x(4, 8)
    with pytest.raises(ValueError, match=r"^residual has shape \(4, 9\) but must have shape \(4, 8\)"):
        add_dropout_norm(x, _x(4, 9), None, None, 0.1)
    with pytest.raises(ValueError, match=r"^p=1.5 must be a finite number in \[0.0, 1.0\]"):
        add_dropout_norm(x, None, None, None, 1.5)
    with pytest.raises(ValueError, match=r"^norm='batchnorm' is not one of 'layernorm', 'rmsnorm'"):
        add_dropout_norm(x, None, None, None, 0.1, norm="batchnorm")
    with pytest.raises(ValueError, match=r"^seed=-3 must be >= 0"):
        add_dropout_norm(x, None, None, None, 0.1, seed=-3)
    with pytest.raises(TypeError, match=r"^residual has dtype torch.int64"):
        add_dropout_norm(x, torch.ones(4, 8, dtype=torch.int64), None, None, 0.1)
    with pytest.raises(ValueError, match=r"^norm='groupnorm'"):
        AddDropoutNorm(8, norm="groupnorm")


# Cross-entropy ---------------------------------------------------------------------------------


def test_cross_entropy_rejects_wrong_target_dtype():
    logits = _x(3, 5)
    with pytest.raises(TypeError, match=r"^target has dtype torch.float32: class probabilities are not supported"):
        cross_entropy(logits, torch.rand(3, 5))
    with pytest.raises(TypeError, match=r"^target has dtype torch.int16; supported: int64, int32"):
        cross_entropy(logits, torch.ones(3, dtype=torch.int16))
    with pytest.raises(TypeError, match=r"^logits has dtype torch.int64"):
        cross_entropy(torch.ones(3, 5, dtype=torch.int64), torch.ones(3, dtype=torch.int64))


def test_cross_entropy_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"^target has shape \(4,\) but must have shape \(3,\)"):
        cross_entropy(_x(3, 5), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^logits has shape \(2, 3, 5\); expected \(N, V\) or \(V,\)"):
        cross_entropy(_x(2, 3, 5), torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^logits has shape \(3, 0\)"):
        cross_entropy(_x(3, 0), torch.zeros(3, dtype=torch.int64))


def test_cross_entropy_rejects_bad_options():
    logits, target = _x(3, 5), torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^reduction='avg' is not one of 'mean', 'sum', 'none'"):
        cross_entropy(logits, target, reduction="avg")
    with pytest.raises(ValueError, match=r"^label_smoothing=1.5 must be a finite number in \[0.0, 1.0\]"):
        cross_entropy(logits, target, label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"^lse_square_scale=-0.1 must be a finite number in \[0.0, inf\)"):
        cross_entropy(logits, target, lse_square_scale=-0.1)
    with pytest.raises(ValueError, match=r"^weight: class weights are not supported"):
        cross_entropy(logits, target, torch.ones(5))
    with pytest.raises(TypeError, match=r"^ignore_index must be an int"):
        cross_entropy(logits, target, ignore_index=1.0)
    with pytest.raises(ValueError, match=r"^weight: class weights are not supported"):
        CrossEntropyLoss(weight=torch.ones(5))
    with pytest.raises(ValueError, match=r"^size_average and reduce are deprecated"):
        CrossEntropyLoss(reduce=False)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_softcap_must_be_finite_and_non_negative(bad):
    """Checked with the other options, before any launch (and before the device check: these are
    CPU tensors, which only the interpreter runs)."""
    message = rf"^softcap={bad} must be a finite number in \[0.0, inf\)$"
    logits, target = _x(3, 5), torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match=message):
        cross_entropy(logits, target, softcap=bad)
    with pytest.raises(ValueError, match=message):
        CrossEntropyLoss(softcap=bad)(logits, target)
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(_x(6, 4), _x(10, 4), torch.zeros(6, dtype=torch.int64), softcap=bad)
    with pytest.raises(TypeError, match=r"^softcap must be a float, got str"):
        cross_entropy(logits, target, softcap="30")


def test_cross_entropy_rejects_wrong_device():
    with pytest.raises(ValueError, match=r"^logits is on meta"):
        cross_entropy(torch.ones(3, 5, device="meta"), torch.zeros(3, dtype=torch.int64, device="meta"))


@pytest.mark.kernels
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # interpreted padding rows
@pytest.mark.parametrize("bad", [5, 7, -1, -101])
def test_cross_entropy_rejects_labels_out_of_range(bad, device):
    """With check_targets, checked before anything is launched: with inplace_backward the logits
    stay as they were."""
    logits = torch.randn(4, 5, device=device)
    before = logits.clone()
    target = torch.tensor([0, -100, bad, 4], device=device)
    with pytest.raises(
        ValueError, match=rf"^target holds class index {bad}, outside \[0, 5\) and not ignore_index=-100"
    ):
        cross_entropy(logits, target, inplace_backward=True, check_targets=True)
    assert torch.equal(logits, before)
    with pytest.raises(ValueError, match=rf"^target holds class index {bad}, outside \[0, 5\)"):
        linear_cross_entropy(
            torch.randn(4, 3, device=device), torch.randn(5, 3, device=device), target, check_targets=True
        )


@pytest.mark.kernels
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # interpreted padding rows
def test_ignore_index_is_the_only_exception(device):
    """-100 is a bad label when ignore_index is something else."""
    with pytest.raises(ValueError, match=r"^target holds class index -100, outside \[0, 5\) and not ignore_index=2"):
        cross_entropy(
            torch.randn(2, 5, device=device), torch.tensor([2, -100], device=device), ignore_index=2, check_targets=True
        )


def test_check_targets_must_be_a_bool():
    with pytest.raises(TypeError, match=r"^check_targets must be a bool, got int"):
        cross_entropy(_x(2, 5), torch.zeros(2, dtype=torch.int64), check_targets=1)


@pytest.mark.kernels
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # interpreted padding rows
@pytest.mark.parametrize("bad", [5, -1])
def test_unchecked_labels_out_of_range_give_nan_rows(bad, device):
    """Without check_targets nothing is read back: the row of an out-of-range label gets a NaN loss
    and a NaN gradient (so a mean or a sum is NaN); the other rows are as torch computes them."""
    logits = torch.randn(4, 5, device=device, requires_grad=True)
    target = torch.tensor([0, -100, bad, 4], device=device)
    loss = cross_entropy(logits, target, reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    good = torch.tensor([0, 1, 3], device=device)
    expected = F.cross_entropy(logits.detach()[good], target[good], reduction="none")
    assert loss[2].isnan() and grad[2].isnan().all()
    torch.testing.assert_close(loss.detach()[good], expected)
    (expected_grad,) = torch.autograd.grad(F.cross_entropy(logits[good], target[good], reduction="none").sum(), logits)
    torch.testing.assert_close(grad[good], expected_grad[good])
    assert cross_entropy(logits, target).isnan() and cross_entropy(logits, target, reduction="sum").isnan()
    hidden, weight = torch.randn(4, 3, device=device), torch.randn(5, 3, device=device)
    assert linear_cross_entropy(hidden, weight, target).isnan()


# Linear + cross-entropy ------------------------------------------------------------------------


def test_linear_cross_entropy_rejects_mismatched_shapes():
    hidden, weight, target = _x(6, 4), _x(10, 4), torch.zeros(6, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^weight has shape \(10, 5\) but must have shape \(10, 4\)"):
        linear_cross_entropy(hidden, _x(10, 5), target)
    with pytest.raises(ValueError, match=r"^bias has shape \(9,\) but must have shape \(10,\)"):
        linear_cross_entropy(hidden, weight, target, _x(9))
    with pytest.raises(ValueError, match=r"^target has shape \(5,\) but must have shape \(6,\)"):
        linear_cross_entropy(hidden, weight, torch.zeros(5, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^hidden has shape \(6, 4\) and weight \(10,\)"):
        linear_cross_entropy(hidden, _x(10), target)


def test_linear_cross_entropy_rejects_bad_dtypes_and_options():
    hidden, weight, target = _x(6, 4), _x(10, 4), torch.zeros(6, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"^weight has dtype torch.bfloat16 but hidden has torch.float32"):
        linear_cross_entropy(hidden, weight.bfloat16(), target)
    with pytest.raises(TypeError, match=r"^target has dtype torch.float32: class probabilities"):
        linear_cross_entropy(hidden, weight, target.float())
    with pytest.raises(ValueError, match=r"^chunk_size=0 must be >= 1"):
        linear_cross_entropy(hidden, weight, target, chunk_size=0)
    with pytest.raises(ValueError, match=r"^reduction='max'"):
        linear_cross_entropy(hidden, weight, target, reduction="max")
    with pytest.raises(ValueError, match=r"^weight_grad='bf16' is not one of 'exact', 'fp32', 'chunked'$"):
        linear_cross_entropy(hidden, weight, target, weight_grad="bf16")
    with pytest.raises(ValueError, match=r"^weight_grad=True is not one of"):
        LinearCrossEntropyLoss(weight_grad=True)
    with pytest.raises(ValueError, match=r"^hidden is on meta"):
        linear_cross_entropy(hidden.to("meta"), weight.to("meta"), target.to("meta"))
