"""The real sizes, compiled on a CUDA GPU: sizes 1..4097 in every dim, the issue's shapes, int64
offsets, TF32 opt-in, autocast, and the kernel choice on Hopper."""

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference

from fused_gemm import Linear, bmm, matmul
from fused_gemm._compat import HAS_TENSOR_DESCRIPTORS
from fused_gemm.ops.launch import launch_matmul
from fused_gemm.reference import bmm_reference, matmul_reference

NAMES = ("x", "w", "bias")


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
@pytest.mark.parametrize("size", [1, 7, 127, 1000, 4097])
@pytest.mark.parametrize("dim", ["m", "k", "n"])
def test_real_sizes_in_every_dim(dim, size, check):
    dims = {"m": 1000, "k": 1024, "n": 768}
    dims[dim] = size
    check(_ours("gelu"), _reference("gelu"), _operands(dims["m"], dims["k"], dims["n"], torch.bfloat16), NAMES)


@pytest.mark.gpu(reason="every epilogue and dtype at a size where the tiles are full-sized")
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_every_epilogue_and_dtype_compiled(activation, dtype, check):
    check(_ours(activation), _reference(activation), _operands(1031, 520, 4097, dtype), NAMES)
    check(_ours(activation), _reference(activation), _operands(2048, 1024, 1536, dtype, bias=False), NAMES)


@pytest.mark.gpu(reason="the issue's shapes (16384 tokens) need a GPU")
@pytest.mark.parametrize("k, n", [(2048, 8192), (8192, 2048), (2048, 6144)])
def test_issue_shapes_bias_gelu(k, n, check):
    x, w, b = _operands(16384, k, n, torch.bfloat16)
    check(_ours("gelu"), _reference("gelu"), (x.view(4, 4096, k), w, b), NAMES)


@pytest.mark.gpu(reason="bmm of the issue's size needs a GPU")
def test_bmm_issue_shape(check):
    a = torch.randn(64, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = (torch.randn(64, 2048, 128, device="cuda") / 128**0.5).to(torch.bfloat16).transpose(1, 2).requires_grad_()
    check(lambda a, b, bias: bmm(a, b, bias), bmm_reference, (a, b, None), ("a", "b", "bias"))


@pytest.mark.gpu(reason="tensors past 2^31 elements need 4+ GiB each on a GPU")
def test_int64_offsets_past_2_31_elements():
    """x, y, the saved derivative, dy and dx of (2^21 + 8) x 1024 (> 2^31 elements each); dW and d(bias)
    reduce over all 2^21 + 8 tokens. References in fp32 (TF32 off), bounds from torch in bf16."""
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
    del y, dx, x64, y64

    x32 = x.detach().float()
    z32 = torch.addmm(b.detach().float(), x32, w.detach().float())
    dz32 = torch.ops.aten.gelu_backward(dy.float(), z32)
    del z32
    dz_low = dz32.to(torch.bfloat16)
    assert_close_to_reference(db, dz32.sum(0), dz_low.float().sum(0).to(torch.bfloat16), name="dbias")
    dw32 = x32.t() @ dz32
    del x32, dz32
    assert_close_to_reference(dw, dw32, x.detach().t() @ dz_low, name="dw")


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
        expected = torch.nn.functional.gelu(torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and layer.weight.grad.is_contiguous()
    reference = matmul_reference(x.double(), layer.weight.detach().double().t(), layer.bias.detach().double(), "gelu")
    assert_close_to_reference(y, reference, expected, name="y")


@pytest.mark.gpu(reason="the kernel choice depends on the GPU")
def test_hopper_runs_the_tma_kernel_where_it_can():
    a = torch.randn(1, 4096, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, 8192, 2048, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    c = torch.empty(1, 4096, 8192, device="cuda", dtype=torch.bfloat16)
    hopper = torch.cuda.get_device_capability()[0] == 9 and HAS_TENSOR_DESCRIPTORS
    assert launch_matmul(a, b, c) == ("tma" if hopper else "portable")
    assert launch_matmul(a[:, :, 1:], b[:, 1:], c) == "portable"  # 16-byte misaligned rows
    assert launch_matmul(a.float(), b.float(), c.float()) == "portable"
