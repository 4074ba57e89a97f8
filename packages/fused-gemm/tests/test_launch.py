"""The launchers on their own: both matmul kernels forced one at a time on every operand layout and
epilogue option, and the backward's elementwise pass on every activation and dy layout.

matmul/bmm pick the kernel themselves (TMA on Hopper where it can run, the portable kernel
elsewhere and under the interpreter); here each path runs the same cases, so the TMA kernel is
checked on each transpose, on 3-D (batched) descriptors and on its split epilogue, also on a CPU
(the interpreter emulates tensor descriptors). Reference: the contract in float64, bound by the
same computation in torch's low precision (the project's tolerance rule).
"""

import pytest
import torch
import triton
from tritonformer_testkit import assert_close_to_reference, poisoned_allocations

from fused_gemm._compat import supports_tma
from fused_gemm._runtime.compat import HAS_TENSOR_DESCRIPTORS, INTERPRETING
from fused_gemm.kernels.common import ACTIVATION_CODES
from fused_gemm.kernels.configs import tma_configs
from fused_gemm.kernels.matmul_tma import _matmul_tma_kernel
from fused_gemm.ops import launch
from fused_gemm.ops.launch import launch_activation_grad, launch_matmul, tma_plan
from fused_gemm.reference import activation_reference

pytestmark = pytest.mark.kernels


def _layout(plan):
    """A TMA plan's (A_TRANS, B_TRANS, C_TRANS, BATCHED)."""
    return plan.a_trans, plan.b_trans, plan.c_trans, plan.batched


def _matrix(batch, rows, cols, transposed, device, dtype, scale=1.0):
    """(batch, rows, cols) with row-major matrices, or the transpose of row-major ones."""
    if transposed:
        return (scale * torch.randn(batch, cols, rows, device=device)).to(dtype).transpose(1, 2)
    return (scale * torch.randn(batch, rows, cols, device=device)).to(dtype)


def _empty_matrix(batch, rows, cols, transposed, device, dtype):
    if transposed:
        return torch.empty(batch, cols, rows, device=device, dtype=dtype).transpose(1, 2)
    return torch.empty(batch, rows, cols, device=device, dtype=dtype)


def _contract(a, b, bias, activation):
    """What the matmul kernels compute, with torch ops in a's dtype: (c, z)."""
    z = torch.bmm(a, b)
    if bias is not None:
        z = z + bias
    return activation_reference(z, activation), z


CASES = [
    # name: batch, m, a_t, b_t, c_t, bias, activation, z
    ("fwd-linear-weight-gelu-z", 1, 40, False, True, False, True, "gelu", True),
    ("fwd-row-major-gelu-tanh", 1, 40, False, False, False, True, "gelu_tanh", False),
    ("fwd-relu", 1, 40, False, True, False, False, "relu", False),
    ("fwd-bias", 1, 40, False, True, False, True, None, False),
    ("fwd-bias-relu", 1, 40, False, True, False, True, "relu", False),  # the TMA kernel prefetches the bias
    ("transposed-out-gelu-z", 1, 40, True, True, True, True, "gelu", True),
    ("dx", 1, 40, False, False, False, False, None, False),
    ("dw", 1, 40, True, False, False, False, None, False),
    ("dw-transposed-out", 1, 40, True, False, True, False, None, False),
    ("bmm-fwd-gelu-z", 3, 40, False, True, False, True, "gelu", True),
    ("bmm-odd-rows", 3, 37, False, False, False, False, None, False),
    ("bmm-db-transposed-out", 3, 40, True, False, True, False, None, False),
]


def _check_contract(a, b, bias, activation, c, z):
    """c (and z) against the float64 contract, bound by the same computation in c's dtype (bf16
    operands upcast for an fp32 output)."""

    def operands(dtype):
        return [t.to(dtype) if t is not None else None for t in (a, b, bias)]

    ref = _contract(*operands(torch.float64), activation)
    low = _contract(*operands(c.dtype), activation)
    assert_close_to_reference(c, ref[0], low[0], name="c")
    if z is not None:
        assert_close_to_reference(z, ref[1], low[1], name="z")


def _run_case(case, path, device, out_dtype):
    """One CASES entry on one kernel, c (and z) in out_dtype, against the float64 contract; the
    bound is the contract in out_dtype's precision (bf16 operands upcast for an fp32 output)."""
    if path == "tma" and not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs Triton >= 3.4 and a Hopper GPU (or the Triton 3.x interpreter)")
    _, batch, m, a_t, b_t, c_t, with_bias, activation, with_z = case
    k, n, dtype = 48, 24, torch.bfloat16
    a = _matrix(batch, m, k, a_t, device, dtype)
    b = _matrix(batch, k, n, b_t, device, dtype, scale=k**-0.5)
    bias = torch.randn(n, device=device, dtype=dtype) if with_bias else None
    with poisoned_allocations():
        c = _empty_matrix(batch, m, n, c_t, device, out_dtype)
        z = torch.empty_like(c) if with_z else None
    ran = launch_matmul(a, b, c, bias=bias, activation=ACTIVATION_CODES[activation], z=z, path=path)
    assert ran == path
    _check_contract(a, b, bias, activation, c, z)


@pytest.mark.parametrize("path", ["portable", "tma"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_both_kernels_on_every_layout_and_option(case, path, device):
    _run_case(case, path, device, torch.bfloat16)


FP32_OUT_CASES = [c for c in CASES if c[0] in ("fwd-bias", "dw", "dw-transposed-out", "bmm-db-transposed-out")]


@pytest.mark.parametrize("path", ["portable", "tma"])
@pytest.mark.parametrize("case", FP32_OUT_CASES, ids=[c[0] for c in FP32_OUT_CASES])
def test_fp32_output_of_16_bit_operands(case, path, device):
    """An fp32 c (an fp32 parameter's gradient under autocast) gets the accumulator uncast: held to
    fp32's precision, which a bf16 rounding on the way would miss by far. The TMA kernel stages
    an fp32 tile in halves."""
    _run_case(case, path, device, torch.float32)


SPLIT_CASES = [
    # name: batch, m, k, a_t, c_t, split
    ("dw-3-slices-ragged", 1, 40, 100, True, False, 3),
    ("bmm-2-slices-transposed-out", 2, 37, 64, False, True, 2),
    ("more-slices-than-k-steps", 1, 20, 32, False, False, 4),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_split_k(case, device):
    """The TMA kernel with K in slices (fp32 partial sums, added by the launcher): slices of unequal
    depth (K = 100 in steps of 16 when interpreting: 3 + 3 + 1), batches, a transposed output,
    and more slices than K steps (empty slices add zeros)."""
    if not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs Triton >= 3.4 and a Hopper GPU (or the Triton 3.x interpreter)")
    _, batch, m, k, a_t, c_t, split = case
    n, dtype = 24, torch.bfloat16
    a = _matrix(batch, m, k, a_t, device, dtype)
    b = _matrix(batch, k, n, False, device, dtype, scale=k**-0.5)
    with poisoned_allocations():
        c = _empty_matrix(batch, m, n, c_t, device, dtype)
        c32 = _empty_matrix(batch, m, n, c_t, device, torch.float32)
        assert launch_matmul(a, b, c, path="tma", split=split) == "tma"
        assert launch_matmul(a, b, c32, path="tma", split=split) == "tma"  # summed without a cast
    ref = torch.bmm(a.double(), b.double())
    assert_close_to_reference(c, ref, torch.bmm(a, b), name="c")
    assert_close_to_reference(c32, ref, torch.bmm(a.float(), b.float()), name="c fp32")


def _grad_contract(dy, saved, activation, dtype):
    """dz = dy * act'(z) and its column sums, with torch in `dtype` (gelu_backward / threshold_backward)."""
    dy = dy.to(dtype)
    if activation in ("gelu", "gelu_tanh"):
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        dz = torch.ops.aten.gelu_backward(dy, saved.to(dtype), approximate=approximate)
    elif activation == "relu":
        dz = dy.masked_fill(saved.to(dtype) <= 0, 0)
    else:
        dz = dy
    return dz, dz.sum((0, 1))


DY_LAYOUTS = ["contiguous", "transposed", "expanded"]


@pytest.mark.parametrize("dy_layout", DY_LAYOUTS)
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
def test_activation_grad_pass(activation, dy_layout, device):
    """dz and d(bias) over batches and rows that span several programs (and row tiles within each),
    columns that are not a multiple of the tile, any dy strides."""
    batch, m, n, dtype = 2, 75, 37, torch.bfloat16
    if dy_layout == "transposed":
        dy = torch.randn(batch, n, m, device=device, dtype=dtype).transpose(1, 2)
    elif dy_layout == "expanded":
        dy = torch.randn(1, 1, n, device=device, dtype=dtype).expand(batch, m, n)
    else:
        dy = torch.randn(batch, m, n, device=device, dtype=dtype)
    saved = 2 * torch.randn(batch, m, n, device=device, dtype=dtype) if activation else None
    code = ACTIVATION_CODES[activation]
    with poisoned_allocations():
        dz, dbias = launch_activation_grad(dy, saved, code, write_dz=activation is not None, column_sum=True)
    ref_dz, ref_dbias = _grad_contract(dy, saved, activation, torch.float64)
    low_dz, low_dbias = _grad_contract(dy, saved, activation, dtype)
    if activation is None:
        assert dz is dy
    else:
        assert dz.is_contiguous() and dz.dtype == dtype
        assert_close_to_reference(dz, ref_dz, low_dz, name="dz")
    assert dbias.shape == (n,) and dbias.dtype == dtype
    assert_close_to_reference(dbias, ref_dbias, low_dbias, name="dbias")


def test_activation_grad_pass_without_column_sums_or_rows(device):
    """dz alone (no bias): no sums; no rows at all: d(bias) is zeros."""
    dy = torch.randn(1, 9, 16, device=device)
    saved = torch.randn(1, 9, 16, device=device)
    dz, dbias = launch_activation_grad(dy, saved, ACTIVATION_CODES["relu"], write_dz=True, column_sum=False)
    assert dbias is None and torch.equal(dz, dy.masked_fill(saved <= 0, 0))
    empty = torch.randn(2, 0, 16, device=device)
    dz, dbias = launch_activation_grad(empty, None, 0, write_dz=False, column_sum=True)
    assert torch.equal(dbias, torch.zeros(16, device=device))


@pytest.mark.skipif(
    not HAS_TENSOR_DESCRIPTORS, reason="this Triton has no tensor descriptors: only the portable kernel"
)
def test_tma_layout_rules(device):
    """Which operands a tensor descriptor can address: 16-byte aligned base and strides, one unit stride."""
    if not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs a Hopper GPU (or the Triton 3.x interpreter)")
    x = torch.randn(1, 32, 48, device=device, dtype=torch.bfloat16)
    w = torch.randn(1, 24, 48, device=device, dtype=torch.bfloat16).transpose(1, 2)
    y = torch.empty(1, 32, 24, device=device, dtype=torch.bfloat16)
    assert _layout(tma_plan(x, w, y)) == (False, True, False, False)
    assert tma_plan(x[:, :, 1:], w[:, 1:], y) is None  # base not 16-byte aligned
    assert tma_plan(x[:, :, ::2], w[:, ::2], y) is None  # no unit stride
    assert tma_plan(x.float(), w.float(), y.float()) is None  # fp32: the portable kernel
    shared = torch.randn(1, 48, 24, device=device, dtype=torch.bfloat16).expand(3, 48, 24)  # batch stride 0
    assert tma_plan(x.expand(3, 32, 48).contiguous(), shared, y.expand(3, 32, 24).contiguous()) is None
    odd = torch.randn(1, 32, 47, device=device, dtype=torch.bfloat16)
    assert tma_plan(odd, torch.randn(1, 47, 24, device=device, dtype=torch.bfloat16), y) is None  # 94-byte rows
    assert tma_plan(x, w, y, torch.empty(1, 24, 32, device=device, dtype=torch.bfloat16).transpose(1, 2)) is None
    batched = tma_plan(
        x.expand(3, 32, 48).contiguous(), w.expand(3, 48, 24).contiguous(), y.expand(3, 32, 24).contiguous()
    )
    assert _layout(batched) == (False, False, False, True)


def test_one_plan_and_one_tuned_choice_per_problem(device):
    """tma_plan gives the plan launch_matmul ran for the same operands (the tuned choice is keyed by
    the plan: two plans of one problem would each tune), and a second launch reuses the choice."""
    if not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs Triton >= 3.4 and a Hopper GPU (or the Triton 3.x interpreter)")
    a = torch.randn(1, 24, 32, device=device, dtype=torch.bfloat16)
    b = torch.randn(1, 16, 32, device=device, dtype=torch.bfloat16).transpose(1, 2)
    bias = torch.randn(16, device=device, dtype=torch.bfloat16)
    c, z = (
        torch.empty(1, 24, 16, device=device, dtype=torch.bfloat16),
        torch.empty(1, 24, 16, device=device, dtype=torch.bfloat16),
    )
    for with_z in (False, True):
        assert launch_matmul(a, b, c, bias=bias, activation=2, z=z if with_z else None, path="tma") == "tma"
        plan = tma_plan(a, b, c, z if with_z else None, bias, 2)
        tuned = launch._TUNED.get(launch._tuned_key(plan, _matmul_tma_kernel.configs))
        assert tuned is not None and tuned.plan is plan
        launch_matmul(a, b, c, bias=bias, activation=2, z=z if with_z else None, path="tma")
        assert launch._TUNED.get(launch._tuned_key(plan, _matmul_tma_kernel.configs)) is tuned


GEMV_CASES = [
    # name: batch, k, n, dtype, bias, activation, z, out dtype, a's K stride, W's row padding
    ("one-block-uneven-k", 1, 48, 24, torch.bfloat16, True, "gelu", True, None, 1, 0),
    ("two-blocks-ragged-k", 1, 1000, 37, torch.float16, False, "relu", False, None, 1, 0),
    ("even-k-tall", 1, 512, 4097, torch.bfloat16, True, "gelu_tanh", False, None, 1, 0),
    ("batched-strided", 3, 96, 50, torch.bfloat16, True, None, True, None, 2, 8),
    ("fp32-out", 1, 640, 33, torch.bfloat16, True, None, False, torch.float32, 1, 0),
    ("single-column", 2, 20, 1, torch.float16, False, "gelu", False, None, 1, 0),
    ("empty-k", 1, 0, 5, torch.bfloat16, True, "gelu", True, None, 1, 0),
]


@pytest.mark.parametrize("case", GEMV_CASES, ids=[c[0] for c in GEMV_CASES])
def test_gemv_kernel(case, device):
    """One row times W^T (W's rows contiguous in K): K in one block or several, with a ragged
    last block; N past one program's rows; batches; a strided row and padded weight rows; every
    epilogue option; an fp32 output. Against the float64 contract, bound by torch's low precision."""
    _, batch, k, n, dtype, with_bias, activation, with_z, out_dtype, a_step, pad = case
    out_dtype = out_dtype or dtype
    a = torch.randn(batch, 1, k * a_step, device=device).to(dtype)[:, :, ::a_step]
    w = (max(k, 1) ** -0.5 * torch.randn(batch, n, k + pad, device=device)).to(dtype)[:, :, :k]
    b = w.transpose(1, 2)
    bias = torch.randn(n, device=device, dtype=dtype) if with_bias else None
    with poisoned_allocations():
        c = torch.empty(batch, 1, n, device=device, dtype=out_dtype)
        z = torch.empty_like(c) if with_z else None
    assert launch_matmul(a, b, c, bias=bias, activation=ACTIVATION_CODES[activation], z=z) == "gemv"
    _check_contract(a, b, bias, activation, c, z)


def test_gemv_takes_no_more_batches_than_its_grid_holds(device, monkeypatch):
    monkeypatch.setattr(launch, "GEMV_MAX_BATCH", 2)
    launch._matmul_plan.cache_clear()
    a = torch.randn(3, 1, 8, device=device, dtype=torch.bfloat16)
    b = torch.randn(3, 4, 8, device=device, dtype=torch.bfloat16).transpose(1, 2)
    c = torch.empty(3, 1, 4, device=device, dtype=torch.bfloat16)
    try:
        assert launch_matmul(a, b, c) == "portable"
        assert launch_matmul(a[:2], b[:2], c[:2]) == "gemv"
    finally:
        launch._matmul_plan.cache_clear()


def test_gemv_is_forced_only_where_it_runs(device):
    a = torch.randn(1, 2, 32, device=device, dtype=torch.bfloat16)
    b = torch.randn(1, 32, 16, device=device, dtype=torch.bfloat16)  # N contiguous: K stride 16
    c = torch.empty(1, 2, 16, device=device, dtype=torch.bfloat16)
    for a_, b_, c_ in ((a, b.transpose(1, 2).contiguous().transpose(1, 2), c), (a[:, :1], b, c[:, :1])):
        with pytest.raises(ValueError, match="GEMV kernel needs one row"):
            launch_matmul(a_, b_, c_, path="gemv")


def test_kernel_choice(device):
    """The launcher's own choice: the GEMV kernel for one 16-bit row times an nn.Linear weight; the
    portable kernel under the interpreter (the emulated TMA kernel is several times slower there;
    tests force it with path="tma") and for small products (less host time per launch,
    ops.launch.SMALL_MACS); compiled, the TMA kernel on Hopper with Triton >= 3.4 for larger
    aligned 16-bit operands, the portable one for misaligned or fp32 operands."""
    a = torch.randn(1, 64, 48, device=device, dtype=torch.bfloat16)
    b = torch.randn(1, 32, 48, device=device, dtype=torch.bfloat16).transpose(1, 2)
    c = torch.empty(1, 64, 32, device=device, dtype=torch.bfloat16)
    assert launch_matmul(a, b, c) == "portable"
    # One row: the GEMV kernel where W's rows are contiguous in K, the portable kernel otherwise.
    assert launch_matmul(a[:, :1], b, c[:, :1]) == "gemv"
    assert launch_matmul(a[:, :1], b.contiguous(), c[:, :1]) == "portable"
    assert launch_matmul(a[:, :1].float(), b.float(), c[:, :1].float()) == "portable"
    if INTERPRETING:
        return  # larger products are slow to interpret, and take the portable kernel all the same
    m = k = n = 512
    assert m * k * n >= launch.SMALL_MACS
    a = torch.randn(1, m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(1, n, k, device=device, dtype=torch.bfloat16).transpose(1, 2)
    c = torch.empty(1, m, n, device=device, dtype=torch.bfloat16)
    assert launch_matmul(a, b, c) == ("tma" if supports_tma(torch.device(device)) else "portable")
    assert launch_matmul(a[:, :, 1:], b[:, 1:], c) == "portable"  # 16-byte misaligned rows
    assert launch_matmul(a.float(), b.float(), c.float()) == "portable"


def test_tma_split_epilogue_without_activation(device, monkeypatch):
    """A config whose epilogue is staged in halves (EPILOGUE_SPLIT) on plain outputs: 2-D and 3-D,
    row-major and transposed. Interpreted: the interpreter's tile with the split; compiled: each
    config that has it (the four-stage cooperative one and the ping-pong ones)."""
    if not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs Triton >= 3.4 and a Hopper GPU (or the Triton 3.x interpreter)")
    configs = [c for c in _matmul_tma_kernel.configs if INTERPRETING] or [
        c for c in tma_configs(interpreting=False) if c.kwargs["EPILOGUE_SPLIT"]
    ]
    m, k, n, dtype = 40, 48, 24, torch.bfloat16
    for config in configs:
        split = triton.Config(dict(config.kwargs, EPILOGUE_SPLIT=True), num_warps=config.num_warps,
                              num_stages=config.num_stages, pre_hook=config.pre_hook)  # fmt: skip
        monkeypatch.setattr(_matmul_tma_kernel, "configs", [split])
        for batch, c_t in [(1, False), (1, True), (3, False), (3, True)]:
            a = _matrix(batch, m, k, False, device, dtype)
            b = _matrix(batch, k, n, True, device, dtype, scale=k**-0.5)
            with poisoned_allocations():
                c = _empty_matrix(batch, m, n, c_t, device, dtype)
            assert launch_matmul(a, b, c, path="tma") == "tma"
            reference, low = torch.bmm(a.double(), b.double()), torch.bmm(a, b)
            assert_close_to_reference(c, reference, low, name=f"c {config} {batch} {c_t}")
