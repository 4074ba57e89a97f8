"""torch.compile(fullgraph=True) traces the public functions without a graph break.

The launchers are torch custom operators (fake implementations give the output metadata), so
Dynamo traces the autograd Functions around them; "aot_eager" also runs AOTAutograd's
functionalization on fake tensors, which checks the fake implementations and the mutation of
the in-place operator. Results must equal eager bit for bit (the same kernels run).
"""

import pytest
import torch

from fused_rope import RotaryEmbedding, _compat, apply_rotary_pos_emb, apply_rotary_qk
from fused_rope.ops import rope as rope_ops
from fused_rope.ops import rope_qk as rope_qk_ops

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.torch_compile,
    pytest.mark.skipif(not _compat.HAS_CUSTOM_OP, reason="torch.library.custom_op needs torch >= 2.4"),
]

BACKENDS = ["eager", "aot_eager"]


def _grads(fn, inputs):
    inputs = [x.detach().requires_grad_(True) for x in inputs]
    outputs = fn(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    grads = torch.autograd.grad(outputs, inputs, [torch.ones_like(o) * 0.5 for o in outputs])
    return [o.detach() for o in outputs], list(grads)


def _assert_same(compiled, eager):
    for got, want in zip(compiled, eager):
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_rotary_pos_emb(backend, device):
    torch._dynamo.reset()
    freqs = torch.randn(6, 1, 1, 8, device=device)
    cu_seqlens = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)

    def fn(t_sbhd, t_thd):
        return apply_rotary_pos_emb(t_sbhd, freqs, "sbhd", True), apply_rotary_pos_emb(
            t_thd, freqs, "thd", cu_seqlens=cu_seqlens
        )

    inputs = [torch.randn(4, 2, 3, 16, device=device), torch.randn(5, 3, 16, device=device)]
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for got, want in zip(_grads(compiled, inputs), _grads(fn, inputs)):
        _assert_same(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_rotary_qk(backend, device):
    torch._dynamo.reset()
    cos, sin = torch.randn(1, 5, 16, device=device), torch.randn(1, 5, 16, device=device)

    def fn(q, k):
        return apply_rotary_qk(q, k, cos, sin)

    inputs = [torch.randn(2, 4, 5, 16, device=device), torch.randn(2, 2, 5, 16, device=device)]
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for got, want in zip(_grads(compiled, inputs), _grads(fn, inputs)):
        _assert_same(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_rotary_qk_in_place(backend, device):
    torch._dynamo.reset()
    cos, sin = torch.randn(5, 16, device=device), torch.randn(5, 16, device=device)

    def fn(qkv):
        # q and k as views of a fused projection, rotated in place; v untouched.
        qkv = qkv * 1.0
        q, k = qkv[:, :, :4].transpose(1, 2), qkv[:, :, 4:6].transpose(1, 2)
        apply_rotary_qk(q, k, cos, sin, inplace=True)
        return qkv

    inputs = [torch.randn(2, 5, 8, 16, device=device)]
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    for got, want in zip(_grads(compiled, inputs), _grads(fn, inputs)):
        _assert_same(got, want)
    with torch.no_grad():
        _assert_same([compiled(inputs[0])], [fn(inputs[0])])


def test_traced_in_place_with_autograd_needs_no_mark_dirty(device):
    """Traced with autograd, the in-place update is the functional operator plus copy_ into q and k.

    Dynamo before torch 2.13 drops an autograd.Function's ctx.mark_dirty (pytorch/pytorch#184113):
    the eager path (mark_dirty on the views) then compiled to a graph whose gradient skipped the
    rotation (test_apply_rotary_qk_in_place failed on torch 2.11). This pins the traced form on
    any torch: no mutating operator, no dirty inputs.
    """
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    cos, sin = torch.randn(5, 16, device=device), torch.randn(5, 16, device=device)

    def fn(qkv):
        qkv = qkv * 1.0
        apply_rotary_qk(qkv[:, :, :4].transpose(1, 2), qkv[:, :, 4:6].transpose(1, 2), cos, sin, inplace=True)
        return qkv

    torch.compile(fn, backend=backend, fullgraph=True)(torch.randn(2, 5, 8, 16, device=device, requires_grad=True))
    code = "\n".join(m.code for gm in graphs for m in gm.modules() if isinstance(m, torch.fx.GraphModule))
    assert "fused_rope.rope_qk_fwd.default" in code and "rope_qk_fwd_.default" not in code
    assert code.count(".copy_(") == 2 and "dirty_idx" not in code


def test_rotary_embedding_inside_a_compiled_block(device):
    """The module's tables are built inside a fullgraph-compiled block (in the graph: nothing
    cached there, so an in-place edit of inv_freq between calls is seen)."""
    torch._dynamo.reset()
    rope = RotaryEmbedding(16, rotary_percent=0.5).to(device)

    def block(q, k):
        cos, sin = rope.cos_sin(q.shape[1])
        q_out, k_out = apply_rotary_qk(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out, k_out, apply_rotary_pos_emb(q, rope(q.shape[1]), "bshd")

    inputs = [torch.randn(2, 5, 3, 16, device=device), torch.randn(2, 5, 1, 16, device=device)]
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    for step in range(3):
        if step == 2:
            rope.inv_freq.mul_(0.5)
        for got, want in zip(_grads(compiled, inputs), _grads(block, inputs)):
            _assert_same(got, want)


@pytest.mark.parametrize(
    "op, args",
    [
        ("rope_fwd", lambda d: (torch.randn(3, 2, 2, 8, device=d), torch.randn(4, 1, 1, 6, device=d), None, None,
                                "sbhd", False)),
        ("rope_bwd", lambda d: (torch.randn(2, 3, 2, 8, device=d), torch.randn(4, 1, 1, 8, device=d), None, None,
                                "bshd", True)),
        # a transposed input: the real and the fake results are both contiguous
        ("rope_fwd", lambda d: (torch.randn(3, 2, 2, 8, device=d).transpose(0, 1), torch.randn(4, 1, 1, 8, device=d),
                                None, None, "bshd", False)),
        ("rope_qk_fwd", lambda d: (torch.randn(2, 2, 3, 8, device=d), torch.randn(2, 1, 3, 8, device=d),
                                   torch.randn(1, 3, 8, device=d), torch.randn(1, 3, 8, device=d), None)),
        ("rope_qk_fwd_", lambda d: (torch.randn(2, 2, 3, 8, device=d), torch.randn(2, 1, 3, 8, device=d),
                                    torch.randn(3, 8, device=d), torch.randn(3, 8, device=d), None)),
        ("rope_qk_bwd_one", lambda d: (torch.randn(2, 2, 3, 8, device=d), torch.randn(3, 8, device=d),
                                       torch.randn(3, 8, device=d), None)),
    ],
)  # fmt: skip
def test_custom_op_registrations(op, args, device):
    """torch.library.opcheck: schema, fake implementation and dispatch of each operator."""
    module = rope_ops if op in ("rope_fwd", "rope_bwd") else rope_qk_ops
    torch.library.opcheck(getattr(module, op).op, args(device), test_utils=("test_schema", "test_faketensor"))
