"""The API around the kernels: both autograd paths, torch.compile, autocast, modules, empty inputs."""

import pytest
import torch

from fused_attention import (
    FlashAttention,
    FlashAttentionFunction,
    MultiheadSelfAttention,
    alibi_slopes,
    flash_attention,
    flash_attention_varlen,
)
from fused_attention._runtime.compat import HAS_CUSTOM_OP
from fused_attention.ops.attention import AttentionOpFunction, _addressable, dropout_rng
from fused_attention.ops.launch import MAX_POSITION_STRIDE, AttentionSpec, forward_plan

pytestmark = pytest.mark.kernels

BF16 = torch.bfloat16


def _outputs_and_grads(fn, q, k, v, dout, dlse):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(q, k, v)
    grads = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse))
    return (out, lse, *grads)


def _assert_identical(actual, expected):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch.library.custom_op needs torch >= 2.4")
@pytest.mark.torch_dynamo  # a custom op's autograd path imports torch._dynamo
def test_autograd_function_paths_match_the_custom_op(attn, device):
    """The eager Function on a plan (what flash_attention runs), the custom ops' Function (torch <
    2.4 under torch.compile) and the custom op itself (what torch.compile traces) run the same
    launchers: identical results, through both outputs (deterministic backward: the default one's
    dQ may differ in the last bits from run to run on a GPU), softcap and dropout (its words passed
    along) included."""
    q, k, v = attn.random_qkv(2, 23, 30, 4, 2, 64, BF16, device)
    slopes = alibi_slopes(4, device=device)
    dout = torch.randn(q.shape, device=device).to(BF16)
    dlse = torch.randn(2, 4, 23, device=device)
    spec = AttentionSpec(2, 4, 2, 64, 23, 30, 0.125, -1, 0, True, False, False, True, 2.0, 0.25)
    rng = dropout_rng(q.device, 7, 3)

    def through_function(q, k, v):
        return FlashAttentionFunction.apply(q, k, v, slopes, None, None, rng, forward_plan(q, k, v, slopes, spec))

    def through_op_function(q, k, v):
        return AttentionOpFunction.apply(q, k, v, slopes, None, None, rng, *spec.to_op_args())

    def through_custom_op(q, k, v):
        return torch.ops.fused_attention.attention_fwd(q, k, v, slopes, None, None, rng, *spec.to_op_args())

    def through_api(q, k, v):
        return flash_attention(
            q, k, v, causal=True, alibi_slopes=slopes, return_lse=True, deterministic=True, softcap=2.0,
            dropout_p=0.25, seed=7, seed_offset=3,
        )  # fmt: skip

    expected = _outputs_and_grads(through_api, q, k, v, dout, dlse)
    for path in (through_function, through_op_function, through_custom_op):
        _assert_identical(_outputs_and_grads(path, q, k, v, dout, dlse), expected)


def test_double_backward_raises(attn, device):
    """The kernels' gradients are not differentiable: a backward with create_graph=True hands back
    gradients whose own backward raises, rather than gradients that silently lack that dependence."""
    q, k, v = (t.requires_grad_(True) for t in attn.random_qkv(1, 9, 9, 2, 2, 32, BF16, device))
    dout = torch.randn(q.shape, device=device).to(BF16).requires_grad_(True)
    (dq,) = torch.autograd.grad(flash_attention(q, k, v), q, dout, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.float().sum().backward()


@pytest.mark.torch_compile
@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch.library.custom_op needs torch >= 2.4")
def test_torch_compile_fullgraph(attn, device):
    """No graph break: the kernels are custom ops with fake implementations and registered autograd
    (the varlen call with softcap and a seeded dropout: its words reach both kernels)."""
    q, k, v = attn.random_qkv(2, 19, 19, 2, 1, 32, BF16, device)
    dout = torch.randn(q.shape, device=device).to(BF16)
    dlse = torch.randn(2, 2, 19, device=device)

    slopes = alibi_slopes(2, device=device)

    def dense(q, k, v):
        return flash_attention(
            q, k, v, causal=True, window_size=(5, 0), alibi_slopes=slopes, return_lse=True, deterministic=True
        )

    expected = _outputs_and_grads(dense, q, k, v, dout, dlse)  # eager first: the checks' cache holds this call
    compiled = torch.compile(dense, backend="eager", fullgraph=True)
    _assert_identical(_outputs_and_grads(compiled, q, k, v, dout, dlse), expected)

    cu = attn.cu_seqlens([7, 12], device)

    def packed(q, k, v):
        return flash_attention_varlen(
            q, k, v, cu, cu, 12, 12, causal=True, return_lse=True, deterministic=True, softcap=5.0, dropout_p=0.2,
            seed=3,
        )  # fmt: skip

    flat = [t.flatten(0, 1)[:19] for t in (q, k, v)]
    compiled = torch.compile(packed, backend="eager", fullgraph=True)
    dout_flat, dlse_flat = dout.flatten(0, 1)[:19], torch.randn(2, 19, device=device)
    _assert_identical(
        _outputs_and_grads(compiled, *flat, dout_flat, dlse_flat),
        _outputs_and_grads(packed, *flat, dout_flat, dlse_flat),
    )


def test_autocast_casts_fp32_inputs(attn, device):
    """Under torch.autocast, fp32 q/k/v run in the autocast dtype (as SDPA); their grads come back fp32."""
    q, k, v = attn.random_qkv(1, 17, 17, 2, 2, 64, torch.float32, device)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    with torch.autocast(device_type=device, dtype=BF16):
        out = flash_attention(q, k, v, causal=True)
    assert out.dtype == BF16
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and torch.isfinite(q.grad).all()
    expected = flash_attention(*(t.detach().to(BF16) for t in (q, k, v)), causal=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_empty_inputs(attn, device):
    """Zero queries, zero keys or zero batch: the right shapes, no launch errors; no keys gives 0 and -inf."""
    q, k, v = attn.random_qkv(2, 0, 5, 2, 2, 64, BF16, device)
    out, lse = flash_attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 2, 0)
    q, k, v = (t.requires_grad_(True) for t in attn.random_qkv(2, 6, 0, 2, 2, 64, BF16, device))
    out, lse = flash_attention(q, k, v, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -float("inf"))
    (out.float().sum() + 0 * lse.sum()).backward()
    assert torch.all(q.grad == 0) and k.grad.shape == k.shape
    q, k, v = attn.random_qkv(0, 4, 4, 2, 2, 64, BF16, device)
    assert flash_attention(q, k, v).shape == q.shape


def test_far_apart_positions_are_copied(attn, device):
    """The kernels add a tile's row offsets in int32: an input whose positions lie more than 2^24
    elements apart (where 127 rows pass 2^31) is copied to a packed layout first; others are not."""
    _, k, v = attn.random_qkv(1, 2, 2, 1, 1, 16, BF16, device)
    stride = MAX_POSITION_STRIDE + 16
    buffer = torch.randn(stride + 16, device=device).to(BF16)  # two rows, one per end
    far = buffer.as_strided((1, 2, 1, 16), (2 * stride, stride, 16, 1))
    near = buffer.as_strided((1, 2, 1, 16), (2 * stride, stride - 16, 16, 1))
    assert _addressable(near, 1) is near
    copied = _addressable(far, 1)
    assert copied.is_contiguous() and torch.equal(copied, far)
    expected = flash_attention(far.contiguous(), k, v, causal=True)
    torch.testing.assert_close(flash_attention(far, k, v, causal=True), expected, rtol=0, atol=0)


def test_flash_attention_module(attn, device):
    q, k, v = attn.random_qkv(2, 9, 12, 4, 4, 32, BF16, device, layout="bhsd")
    module = FlashAttention(causal=True, window_size=(3, 0), layout="bhsd")
    assert list(module.parameters()) == []
    expected = flash_attention(q, k, v, causal=True, window_size=(3, 0), layout="bhsd")
    torch.testing.assert_close(module(q, k, v), expected, rtol=0, atol=0)
    assert "causal=True" in repr(module) and "layout='bhsd'" in repr(module) and "deterministic=False" in repr(module)


def test_module_dropout_only_in_training(attn, device):
    """The modules' dropout follows train()/eval(): eval gives the undropped attention, training the
    drawn mask (repeated by torch.manual_seed)."""
    q, k, v = attn.random_qkv(1, 16, 16, 2, 2, 32, BF16, device)
    module = FlashAttention(causal=True, dropout=0.5)
    plain = flash_attention(q, k, v, causal=True)
    torch.testing.assert_close(module.eval()(q, k, v), plain, rtol=0, atol=0)
    torch.manual_seed(1)
    dropped = module.train()(q, k, v)
    torch.manual_seed(1)
    torch.testing.assert_close(flash_attention(q, k, v, causal=True, dropout_p=0.5), dropped, rtol=0, atol=0)
    assert not torch.equal(dropped, plain) and "dropout=0.5" in repr(module)
    block = MultiheadSelfAttention(64, 2, dropout=0.5, device=device, dtype=BF16)
    x = torch.randn(1, 16, 64, device=device).to(BF16)
    torch.testing.assert_close(block.eval()(x), block.eval()(x), rtol=0, atol=0)
    assert not torch.equal(block.train()(x), block.eval()(x))


@pytest.mark.parametrize("n_kv_head, alibi", [(None, False), (2, True)], ids=["mha", "gqa-alibi"])
def test_multihead_self_attention(n_kv_head, alibi, device):
    """The module is the projections around flash_attention: same result as composing them by hand."""
    module = MultiheadSelfAttention(
        128, 4, n_kv_head, bias=True, causal=True, alibi=alibi, deterministic=True, device=device, dtype=BF16
    )
    assert [name for name, _ in module.named_parameters()] == [
        f"{proj}.{p}" for proj in ("q_proj", "k_proj", "v_proj", "out_proj") for p in ("weight", "bias")
    ]
    assert module.k_proj.weight.shape == ((n_kv_head or 4) * 32, 128)
    x = torch.randn(2, 21, 128, device=device).to(BF16).requires_grad_(True)
    seen = []

    def rotate(q, k):
        seen.append((q.shape, k.shape))
        return q.flip(-1), k.flip(-1)

    y = module(x, qk_transform=rotate)
    assert seen == [((2, 21, 4, 32), (2, 21, n_kv_head or 4, 32))]
    q = module.q_proj(x).view(2, 21, 4, 32).flip(-1)
    k = module.k_proj(x).view(2, 21, -1, 32).flip(-1)
    v = module.v_proj(x).view(2, 21, -1, 32)
    slopes = alibi_slopes(4, device=device) if alibi else None
    attention = flash_attention(q, k, v, causal=True, alibi_slopes=slopes, deterministic=True)
    expected = module.out_proj(attention.reshape(2, 21, 128))
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    dy = torch.randn_like(y)
    params = [x, *module.parameters()]
    for got, want in zip(torch.autograd.grad(y, params, dy), torch.autograd.grad(expected, params, dy)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    if alibi:
        module.to(torch.float16)  # casts the slopes buffer too; forward restores fp32 slopes
        assert module(x.detach().to(torch.float16)).dtype == torch.float16
