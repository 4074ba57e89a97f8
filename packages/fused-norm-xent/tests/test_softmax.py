"""softmax / log_softmax against the float64 reference, forward and backward."""

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, poisoned_allocations
from tritonformer_testkit.dtypes import dtype_name

from fused_norm_xent import LogSoftmax, Softmax, log_softmax, softmax
from fused_norm_xent.reference import softmax_reference

pytestmark = pytest.mark.kernels

FUNCTIONS = [pytest.param(False, id="softmax"), pytest.param(True, id="log_softmax")]


def _run(x: torch.Tensor, dim: int, log: bool):
    """Kernel output and input gradient for a random upstream gradient, outputs poisoned."""
    x = x.detach().requires_grad_(True)
    with poisoned_allocations():
        y = (log_softmax if log else softmax)(x, dim)
    dy = torch.randn_like(y)
    with poisoned_allocations():
        (dx,) = torch.autograd.grad(y, x, dy)
    return y, dx, dy


def _torch_lowp(x: torch.Tensor, dim: int, log: bool, dy: torch.Tensor):
    x = x.detach().requires_grad_(True)
    y = (torch.log_softmax if log else torch.softmax)(x, dim)
    (dx,) = torch.autograd.grad(y, x, dy)
    return y, dx


def _reference(x: torch.Tensor, dim: int, log: bool, dy: torch.Tensor):
    x64 = x.detach().double().requires_grad_(True)
    y = softmax_reference(x64, dim, log)
    (dx,) = torch.autograd.grad(y, x64, dy.double())
    return y, dx


def check(x: torch.Tensor, dim: int, log: bool):
    y, dx, dy = _run(x, dim, log)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert dx.dtype == x.dtype and dx.shape == x.shape
    y_ref, dx_ref = _reference(x, dim, log, dy)
    y_torch, dx_torch = _torch_lowp(x, dim, log, dy)
    assert_close_to_reference(y, y_ref, y_torch, name="y")
    assert_close_to_reference(dx, dx_ref, dx_torch, name="dx")


# Every width, row count, dtype and function, not their cross product (each combination compiles
# its own kernels on a GPU): (rows, cols, dtype, log).
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
WIDTH_CASES = [(1, 1, FP32, False), (37, 1, BF16, True), (37, 7, FP16, False), (1, 127, BF16, False),
               (37, 127, FP32, True), (37, 1000, BF16, False), (1, 1000, FP16, True), (37, 4097, FP32, False),
               (1, 4097, BF16, True)]  # fmt: skip
WIDE_CASES = [(16385, FP32, False), (16385, BF16, True), (65536, FP16, True), (65536, BF16, False)]


def _case_id(*case):
    return "-".join(dtype_name(v) if isinstance(v, torch.dtype) else ("log" if v is True else str(v)) for v in case)


@pytest.mark.parametrize("n_rows, n_cols, dtype, log", [pytest.param(*c, id=_case_id(*c)) for c in WIDTH_CASES])
def test_widths_and_rows(n_rows, n_cols, dtype, log, device):
    check(3 * torch.randn(n_rows, n_cols, device=device, dtype=dtype), -1, log)


@pytest.mark.parametrize("n_cols, dtype, log", [pytest.param(*c, id=_case_id(*c)) for c in WIDE_CASES])
def test_rows_wider_than_a_block(n_cols, dtype, log, device):
    check(3 * torch.randn(3, n_cols, device=device, dtype=dtype), -1, log)


@pytest.mark.parametrize("log", FUNCTIONS)
@pytest.mark.parametrize("dim", [-1, 1, 0])
def test_leading_dims_and_other_dims(dim, log, device):
    check(torch.randn(2, 3, 5, 33, device=device), dim, log)


@pytest.mark.parametrize("log", FUNCTIONS)
@pytest.mark.parametrize("n_cols", [100, 20000])
def test_non_contiguous_input(n_cols, log, device):
    strided_cols = torch.randn(5, 2 * n_cols, device=device)[:, ::2]
    check(strided_cols, -1, log)
    transposed = torch.randn(n_cols, 5, device=device).t()
    check(transposed, -1, log)


@pytest.mark.parametrize("log", FUNCTIONS)
@pytest.mark.parametrize("n_cols", [64, 20000])
def test_non_finite_rows_match_torch(n_cols, log, device):
    """All -inf rows, +inf and NaN entries: NaN/inf where torch puts them, finite rows exact."""
    x = torch.randn(6, n_cols, device=device)
    x[1] = -float("inf")  # all -inf: NaN, as torch
    x[2, 3] = -float("inf")  # one -inf: a zero probability
    x[3, 5] = float("inf")
    x[4, 7] = float("nan")
    y, _, _ = _run(x, -1, log)
    expected = (torch.log_softmax if log else torch.softmax)(x.cpu().double(), -1)
    assert_close_to_reference(y, expected, name="y")


def test_empty_tensors(device):
    for shape in [(0, 5), (4, 0)]:
        x = torch.randn(shape, device=device)
        assert softmax(x).shape == shape


def test_modules_are_drop_ins(device):
    x = torch.randn(4, 10, 3, device=device)
    for ours, theirs in [(Softmax(1), torch.nn.Softmax(1)), (LogSoftmax(-1), torch.nn.LogSoftmax(-1))]:
        assert_close_to_reference(ours(x), theirs(x.double()), theirs(x), name=type(ours).__name__)
        assert repr(ours).endswith(repr(theirs).split("(", 1)[1])


@pytest.mark.gpu(reason="a 2^31+ element tensor needs 4 GiB of GPU memory")
@pytest.mark.parametrize("log", FUNCTIONS)
def test_int64_offsets_past_2_31_elements(log):
    n_cols = 65536
    n_rows = 2**31 // n_cols + 2
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16)
    y = (log_softmax if log else softmax)(x)
    tail = slice(n_rows - 3, n_rows)
    expected = softmax_reference(x[tail], -1, log)
    assert_close_to_reference(y[tail], expected, (torch.log_softmax if log else torch.softmax)(x[tail], -1), name="y")


@pytest.mark.gpu(reason="autocast runs on CUDA")
def test_autocast_keeps_input_dtype():
    x = torch.randn(8, 300, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = softmax(x)
    y.sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
