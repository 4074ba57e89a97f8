"""The real sizes, compiled on a CUDA GPU: sizes 1..4097 in every dim, every epilogue and dtype, a
1.4B model's linear shapes, every autotune config, int64 offsets, TF32 opt-in and autocast.

Few distinct shapes (each new specialization compiles), one pinned config per kernel except in
test_every_config (conftest), and float64 references only where they are cheap.
"""

import pytest
import torch
import torch.nn.functional as F
import triton
from tritonformer_testkit import assert_close_to_reference

from fused_gemm import Linear, bmm, matmul, mlp
from fused_gemm._compat import supports_tma
from fused_gemm._runtime.compat import HAS_GLUON_HOPPER
from fused_gemm._runtime.launch import DIRECT_LAUNCH
from fused_gemm.kernels.common import ACTIVATION_CODES
from fused_gemm.kernels.configs import portable_configs, tma_configs
from fused_gemm.kernels.matmul import _matmul_kernel
from fused_gemm.kernels.matmul_tma import _matmul_tma_kernel
from fused_gemm.ops import launch
from fused_gemm.ops.launch import launch_matmul, tma_plan
from fused_gemm.reference import bmm_reference, matmul_reference

NAMES = ("x", "w", "bias")
SIZES = [1, 7, 127, 1000, 4097]


def _operands(m, k, n, dtype, bias=True, requires_grad=True):
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(dtype).t()
    b = torch.randn(n, device="cuda", dtype=dtype) if bias else None
    return [t.requires_grad_(requires_grad) if t is not None else None for t in (x, w, b)]


def _ours(activation, **kwargs):
    return lambda x, w, b: matmul(x, w, b, activation, **kwargs)


def _reference(activation):
    return lambda x, w, b: matmul_reference(x, w, b, activation)


@pytest.mark.gpu(reason="sizes up to 4097 in every dim run compiled")
@pytest.mark.parametrize("case", range(len(SIZES)))
def test_real_sizes_in_every_dim(case, check):
    """Five (m, k, n) in which each of 1, 7, 127, 1000, 4097 appears once in every dim (a Latin square)."""
    m, k, n = SIZES[case], SIZES[(case + 2) % 5], SIZES[(case + 4) % 5]
    check(_ours("gelu"), _reference("gelu"), _operands(m, k, n, torch.bfloat16), NAMES)


@pytest.mark.gpu(reason="every epilogue and dtype at a size where the tiles are full-sized")
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_every_epilogue_and_dtype_compiled(activation, dtype, check):
    """(1031, 520, 4104): 16-bit operands take the TMA kernel (rows 16-byte aligned, no dim a multiple
    of its tile), fp32 the portable one (test_real_sizes_in_every_dim runs it on 16-bit operands)."""
    bias = activation in (None, "gelu")
    check(_ours(activation), _reference(activation), _operands(1031, 520, 4104, dtype, bias=bias), NAMES)


@pytest.mark.gpu(reason="a 1.4B model's linear shapes (16384 tokens) need a GPU")
@pytest.mark.parametrize("k, n", [(2048, 8192), (8192, 2048), (2048, 6144)])
def test_model_shapes_bias_gelu(k, n, check):
    x, w, b = _operands(16384, k, n, torch.bfloat16)
    check(_ours("gelu"), _reference("gelu"), (x.view(4, 4096, k), w, b), NAMES)


@pytest.mark.gpu(reason="a GPT-2 410M layer's MLP (16384 tokens) needs a GPU")
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_mlp_at_model_size(activation, check):
    """mlp's fused activation gradient (the TMA kernel's GRAD_Z epilogue on Hopper) at real size."""
    x, w1, b1 = _operands(16384, 1024, 4096, torch.bfloat16)
    _, w2, b2 = _operands(1, 4096, 1024, torch.bfloat16)

    def reference(x, w1, b1, w2, b2):
        return matmul_reference(matmul_reference(x, w1, b1, activation), w2, b2)

    check(lambda *t: mlp(*t, activation), reference, (x.view(8, 2048, 1024), w1, b1, w2, b2),
          ("x", "w1", "b1", "w2", "b2"))  # fmt: skip


@pytest.mark.gpu(reason="timing every candidate config needs a GPU")
def test_first_call_tunes_over_every_candidate(check, monkeypatch):
    """Unpinned: the first call of each product times every candidate the prune keeps (ops.tuning)
    and its result must still be exact. The 410M MLP's fused activation gradient with d(bias) is
    the sharp case: its candidates differ in BLOCK_M (64 to 256), each writes one partial column
    sum per row tile, and the rows a wider tile leaves alone must not keep another candidate's."""
    monkeypatch.setattr(_matmul_tma_kernel, "configs", tma_configs(interpreting=False))  # a fresh list: re-tunes
    monkeypatch.setattr(_matmul_kernel, "configs", portable_configs(interpreting=False))
    x, w1, b1 = _operands(16384, 1024, 4096, torch.bfloat16)
    _, w2, b2 = _operands(1, 4096, 1024, torch.bfloat16)

    def reference(x, w1, b1, w2, b2):
        return matmul_reference(matmul_reference(x, w1, b1, "gelu"), w2, b2)

    check(lambda *t: mlp(*t, "gelu"), reference, (x, w1, b1, w2, b2), ("x", "w1", "b1", "w2", "b2"))
    # fp32 operands take the portable kernel: its candidates are timed the same way.
    x, w, b = _operands(1000, 520, 1032, torch.float32)
    check(_ours("gelu"), _reference("gelu"), (x, w, b), NAMES)


@pytest.mark.gpu(reason="bmm of an attention's size (64 x 2048 x 128 @ 128 x 2048) needs a GPU")
def test_bmm_attention_shape(check):
    a = torch.randn(64, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = (torch.randn(64, 2048, 128, device="cuda") / 128**0.5).to(torch.bfloat16).transpose(1, 2).requires_grad_()
    check(lambda a, b, bias: bmm(a, b, bias), bmm_reference, (a, b, None), ("a", "b", "bias"))


@pytest.mark.gpu(reason="the skinny tiles are timed against each other only compiled")
@pytest.mark.parametrize("m", [2, 5, 16])
def test_decode_rows_take_the_skinny_tiles(m, check, monkeypatch):
    """A decode step's few rows against a 1.4B model's qkv weight (2048 -> 6144), bias and GELU,
    forward and backward: the launcher picks the portable kernel even where the TMA kernel could
    run, and times only the 16-row tiles. (One row takes the GEMV kernel: test_launch.py.)"""
    monkeypatch.setattr(_matmul_kernel, "configs", list(portable_configs(interpreting=False)))
    timed = []
    candidates = launch.portable_candidates
    spy = lambda configs, rows, *args: timed.append((rows, candidates(configs, rows, *args))) or timed[-1][1]  # noqa: E731
    monkeypatch.setattr(launch, "portable_candidates", spy)
    x, w, b = _operands(m, 2048, 6144, torch.bfloat16)
    c = torch.empty(1, m, 6144, device="cuda", dtype=torch.bfloat16)
    assert launch_matmul(x.detach()[None], w.detach()[None], c, bias=b.detach()) == "portable"
    check(_ours("gelu"), _reference("gelu"), (x, w, b), NAMES)
    skinny = [configs for rows, configs in timed if rows == m]  # products of m rows (dW has 2048)
    assert skinny and all(len(configs) > 1 and {c.kwargs["BLOCK_M"] for c in configs} == {16} for configs in skinny)


EVERY_CONFIG = [
    *(pytest.param("tma", i, id=f"tma-{i}") for i in range(len(tma_configs(interpreting=False)))),
    *(pytest.param("portable", i, id=f"portable-{i}") for i in range(len(portable_configs(interpreting=False)))),
]


@pytest.mark.gpu(reason="every autotune config runs compiled once")
@pytest.mark.parametrize("path, index", EVERY_CONFIG)
def test_every_config(path, index, pin, monkeypatch):
    """Each config of each matmul kernel, pinned, on one launch that exercises the most: transposed A,
    B and C (as in dW), bias, GELU and z (the split epilogue), 3-D operands, edges in every dim."""
    if path == "tma" and not supports_tma(torch.device("cuda")):
        pytest.skip("the TMA kernel needs Triton >= 3.4 and a Hopper GPU")
    pin(monkeypatch, _matmul_tma_kernel if path == "tma" else _matmul_kernel, index)
    batch, m, k, n, dtype = 2, 1000, 520, 1032, torch.bfloat16
    a = torch.randn(batch, k, m, device="cuda", dtype=dtype).transpose(1, 2)
    b = (torch.randn(batch, n, k, device="cuda") / k**0.5).to(dtype).transpose(1, 2)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    c = torch.empty(batch, n, m, device="cuda", dtype=dtype).transpose(1, 2)
    z = torch.empty_like(c)  # laid out like c
    assert launch_matmul(a, b, c, bias=bias, activation=ACTIVATION_CODES["gelu"], z=z, path=path) == path
    z64 = torch.bmm(a.double(), b.double()) + bias.double()
    z_low = torch.bmm(a, b) + bias
    assert_close_to_reference(z, z64, z_low, name="z")
    assert_close_to_reference(c, F.gelu(z64), F.gelu(z_low), name="c")


def _chunks(rows: int, size: int):
    return [slice(start, min(start + size, rows)) for start in range(0, rows, size)]


@pytest.mark.gpu(reason="tensors past 2^31 elements need 4+ GiB each on a GPU")
def test_int64_offsets_past_2_31_elements():
    """x, y, the saved z, dy, dz and dx of (2^21 + 8) x 1024 (> 2^31 elements each); dW and d(bias)
    reduce over all 2^21 + 8 tokens. Lean: about 26 GB at the peak (six bf16 tensors of 4 GB during
    the backward); the references are built 2^18 rows at a time, in fp64 sums of fp32 chunks
    (TF32 off), bounds from torch in bf16 over the same chunks."""
    m, k, n = 2**21 + 8, 1024, 1024
    x, w, b = _operands(m, k, n, torch.bfloat16)
    y = matmul(x, w, b, "gelu")
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)

    tail = slice(m - 3, m)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x[tail], w, b))
    y64 = matmul_reference(x64, w64, b64, "gelu")
    (dx64,) = torch.autograd.grad(y64, (x64,), dy[tail].double())
    x_low = x[tail].detach().requires_grad_()
    y_low = matmul_reference(x_low, w.detach(), b.detach(), "gelu")
    (dx_low,) = torch.autograd.grad(y_low, (x_low,), dy[tail])
    assert_close_to_reference(y[tail], y64, y_low, name="y tail")
    assert_close_to_reference(dx[tail], dx64, dx_low, name="dx tail")
    del y, dx

    x, w32, b32 = x.detach(), w.detach().float(), b.detach().float()
    dw_ref = torch.zeros(k, n, device="cuda", dtype=torch.float64)
    db_ref = torch.zeros(n, device="cuda", dtype=torch.float64)
    db_low = torch.zeros(n, device="cuda", dtype=torch.float32)
    dz_low = torch.empty_like(dy)
    for rows in _chunks(m, 2**18):
        dz32 = torch.ops.aten.gelu_backward(dy[rows].float(), torch.addmm(b32, x[rows].float(), w32))
        db_ref += dz32.sum(0, dtype=torch.float64)
        dw_ref += (x[rows].float().t() @ dz32).double()
        dz_low[rows] = dz32
        db_low += dz_low[rows].float().sum(0)
    assert_close_to_reference(db, db_ref, db_low.to(torch.bfloat16), name="dbias")
    assert_close_to_reference(dw, dw_ref, x.t() @ dz_low, name="dw")


@pytest.mark.gpu(reason="TF32 is a tensor-core mode of CUDA GPUs")
def test_tf32_is_opt_in():
    """fp32 is full precision unless asked: by argument, or by torch.backends.cuda.matmul.allow_tf32."""
    x, w, b = _operands(1000, 2048, 1024, torch.float32, requires_grad=False)
    reference = matmul_reference(x.double(), w.double(), b.double(), "gelu")
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        ieee = matmul(x, w, b, "gelu")
        assert_close_to_reference(ieee, reference, matmul_reference(x, w, b, "gelu"), name="fp32")
        tf32 = matmul(x, w, b, "gelu", allow_tf32=True)
        torch.backends.cuda.matmul.allow_tf32 = True
        assert_close_to_reference(tf32, reference, matmul_reference(x, w, b, "gelu"), name="tf32")
        assert torch.equal(matmul(x, w, b, "gelu"), tf32)  # the global opt-in
        assert torch.equal(matmul(x, w, b, "gelu", allow_tf32=False), ieee)  # the argument wins
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    # TF32 keeps 10 mantissa bits: its error is far above full fp32's.
    assert (tf32.double() - reference).abs().max() > 10 * (ieee.double() - reference).abs().max()


@pytest.mark.gpu(reason="autocast on CUDA")
def test_linear_under_cuda_autocast():
    layer = Linear(1024, 4096, activation="gelu", device="cuda")
    x = torch.randn(8, 512, 1024, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
        expected = F.gelu(F.linear(x, layer.weight, layer.bias))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and layer.weight.grad.is_contiguous()
    reference = matmul_reference(x.double(), layer.weight.detach().double().t(), layer.bias.detach().double(), "gelu")
    assert_close_to_reference(y, reference, expected, name="y")


@pytest.mark.gpu(reason="direct launches call compiled kernels (Triton 3.4 to 3.9 on a GPU)")
def test_direct_launches_match_the_jit_and_respect_specializations():
    """A plan's first launch goes through the JIT, the next ones through the compiled kernel's
    launcher (the plan's tuned `_runtime.launch.Launch`): the same bits, forward and backward. A bias
    that is not 16-byte aligned, or strided, is another compiled kernel (the JIT specializes on both)
    or another plan."""
    if not DIRECT_LAUNCH:
        pytest.skip(f"direct launches need Triton 3.4 to 3.9 (installed: {triton.__version__})")
    x, w, b = _operands(1031, 520, 4104, torch.bfloat16)
    dy = torch.randn(1031, 4104, device="cuda", dtype=torch.bfloat16)
    runs = []
    for _ in range(3):
        y = matmul(x, w, b, "gelu")
        runs.append((y, *torch.autograd.grad(y, (x, w, b), dy)))
    for name, first, later in zip(("y", "dx", "dw", "dbias"), runs[0], runs[2]):
        assert torch.equal(first, later), name
    c = torch.empty(1, 1031, 4104, device="cuda", dtype=torch.bfloat16)
    a_view, b_view = x.detach().unsqueeze(0), w.detach().unsqueeze(0)
    plan = tma_plan(a_view, b_view, c, torch.empty_like(c), b, ACTIVATION_CODES["gelu"])
    tuned = launch._TUNED.get(launch._tuned_key(plan, _matmul_tma_kernel.configs))
    assert plan is not None and tuned is not None and tuned.launch._compiled, "no compiled kernel kept"
    storage = torch.randn(2 * 4104 + 8, device="cuda", dtype=torch.bfloat16)
    for bias in (storage[1 : 4104 + 1], storage[::2][:4104]):  # 2-byte offset; stride 2
        with torch.no_grad():
            for _ in range(2):  # the second launch is the direct one
                y = matmul(x, w, bias, "gelu")
            expected = F.gelu(x.double() @ w.double() + bias.double())
            assert_close_to_reference(y, expected, F.gelu(x @ w + bias), name="y")


def _require_warp_specialized_kernel():
    if not HAS_GLUON_HOPPER:
        pytest.skip(f"kernels.matmul_ws is written against Triton 3.6's Gluon API (installed: {triton.__version__})")
    if not supports_tma(torch.device("cuda")):
        pytest.skip("kernels.matmul_ws runs on Hopper (sm_90) GPUs")


@pytest.mark.gpu(reason="the warp-specialized Gluon kernel runs compiled on a Hopper GPU")
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_warp_specialized_kernel_every_epilogue(activation, dtype):
    """kernels.matmul_ws forced (path="ws") on (1031, 520, 4104), no dim a multiple of its 128x256x64
    tile: every activation, with a bias where test_every_epilogue_and_dtype_compiled has one. Two
    launches: the first compiles through the JIT, the second is the runtime's direct launch."""
    _require_warp_specialized_kernel()
    bias = activation in (None, "gelu")
    x, w, b = _operands(1031, 520, 4104, dtype, bias=bias, requires_grad=False)
    reference = matmul_reference(x.double(), w.double(), None if b is None else b.double(), activation)
    for _ in range(2):
        c = torch.full((1031, 4104), float("nan"), device="cuda", dtype=dtype)
        ran = launch_matmul(x[None], w[None], c[None], bias=b, activation=ACTIVATION_CODES[activation], path="ws")
        assert ran == "ws"
        assert_close_to_reference(c, reference, matmul_reference(x, w, b, activation), name="c")


@pytest.mark.gpu(reason="the warp-specialized Gluon kernel runs compiled on a Hopper GPU")
def test_launcher_takes_the_warp_specialized_kernel_for_large_forward_epilogues(monkeypatch):
    """A no-grad bias + GELU forward that gives every SM several tiles runs kernels.matmul_ws; the
    training forward, which stores z for the backward, and a bias-only product keep the TMA kernel."""
    _require_warp_specialized_kernel()
    calls = []
    real = launch.run_matmul_ws

    def counting(*args):
        calls.append(args)
        real(*args)

    monkeypatch.setattr(launch, "run_matmul_ws", counting)
    x, w, b = _operands(8192, 1024, 4096, torch.bfloat16, requires_grad=False)
    with torch.no_grad():
        y = matmul(x, w, b, "gelu")
    assert len(calls) == 1
    reference = matmul_reference(x.double(), w.double(), b.double(), "gelu")
    assert_close_to_reference(y, reference, matmul_reference(x, w, b, "gelu"), name="y")
    x.requires_grad_(True)
    matmul(x, w, b, "gelu").sum().backward()
    with torch.no_grad():
        matmul(x, w, b)
    assert len(calls) == 1
