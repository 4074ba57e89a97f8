"""RoPE of q and k, bf16, rotate-half: ours against torch eager, torch.compile and Liger-Kernel.

Layout: q, k of (batch, seq, heads, head_dim) memory (what a fused qkv projection gives),
handed over as the (batch, heads, seq, head_dim) views that HF / Liger take (no copy) and as
bshd to the TransformerEngine-style API. Providers:
- tritonformer: apply_rotary_qk, q and k in one launch from cos/sin tables, new tensors;
- tritonformer inplace (forward only: it overwrites its inputs): the same, in place;
- tritonformer TE-style: apply_rotary_pos_emb on q then k (two launches, angles `freqs`,
  cos/sin computed in the kernel);
- tritonformer TE-style, q|k one tensor: q and k as the two halves of one (batch, seq,
  2 heads, head_dim) tensor (as a fused projection lays them out), one apply_rotary_pos_emb;
- torch: TransformerEngine's unfused formula (reference.py) in bf16 on q and k;
- torch.compile: the same function compiled (after the second shape, one dynamic-shape graph);
- liger: liger_kernel.transformers.rope.liger_rotary_pos_emb (in place; whole heads only);
- autograd floor (no kernels): an autograd.Function whose forward and backward only allocate
  their outputs, timed the same way: what any single-op fwd+bwd pays on this host before
  launching anything (Function.apply, torch.autograd.grad, the engine's hand-off to its
  device thread and back), so `ms` of a host-bound row minus this row is the provider's own.
The fwd+bwd headline is timed twice: as PyTorch runs it by default, and with the backward on
the calling thread (torch.autograd.set_multithreading_enabled(False)), which removes the
engine's two thread hand-offs per torch.autograd.grad call (a training step pays them once
for the whole model, a single-op benchmark once per op).
Memory-bound: bytes = q and k read once and written once, 4 * (q + k) bytes per direction
(fwd+bwd: twice that); the cos/sin or angle tables (< 0.5 %) are not counted.

Headline: q, k (4, 32, 4096, 128) fwd and fwd+bwd for every provider. Then sweeps,
one axis at a time from the headline (seq length 512-2048, head dim 256 and 512, rotary
percent 0.5, batch 2-16, heads 8-64, margin 10-77: extra rows of angles beyond the sequence),
fwd and fwd+bwd, ours against Liger (the floor to beat at every point), torch and
torch.compile, timed in turn (five interleaved do_bench windows each, median of medians: many
sweep rows are host-bound, and the host's speed drifts between one provider's window and the
next); the headline's providers are timed in turn likewise. With Liger as the only anchor the
file takes about a minute on an H100; the torch providers add their compiles and slower rows.
"""

import pytest
import torch
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, measure_paired

from fused_rope import apply_rotary_pos_emb, apply_rotary_qk
from fused_rope.reference import apply_rotary_pos_emb_reference

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

HEADLINE = dict(seq=4096, head_dim=128, rotary_percent=1.0, batch=4, heads=32, margin=0)
# The sweep axes, each value other than the headline's (head_dim 512 and 64 heads give
# 1 GiB bf16 tensors).
SWEEP = [
    *(("seq", v) for v in (512, 1024, 2048)), *(("head_dim", v) for v in (256, 512)), ("rotary_percent", 0.5),
    *(("batch", v) for v in (2, 8, 16)), *(("heads", v) for v in (8, 16, 64)), *(("margin", v) for v in (10, 33, 77)),
]  # fmt: skip
TE_FUSED = "tritonformer TE-style, q|k one tensor"
FLOOR = "autograd floor (no kernels)"
HEADLINE_PROVIDERS = [OURS, "tritonformer inplace", "tritonformer TE-style", TE_FUSED, "torch", "torch.compile",
                      "liger", FLOOR]  # fmt: skip
SWEEP_PROVIDERS = [OURS, "liger", "torch", "torch.compile"]
CALLING_THREAD_PROVIDERS = [OURS, "tritonformer TE-style", "torch.compile", "liger", FLOOR]
COMPILED = {}


def _torch_rope(q, k, freqs):
    return apply_rotary_pos_emb_reference(q, freqs, "bshd"), apply_rotary_pos_emb_reference(k, freqs, "bshd")


class _HostFloor(torch.autograd.Function):
    """Allocates the outputs a RoPE Function would, launches nothing."""

    @staticmethod
    def forward(ctx, q, k):
        return torch.empty_like(q), torch.empty_like(k)

    @staticmethod
    def backward(ctx, dq, dk):
        return torch.empty_like(dq), torch.empty_like(dk)


def _inputs(point, provider, grad):
    """Leaves (what fwd+bwd differentiates) and fn() -> outputs of `provider` at `point`, or skip."""
    batch, seq, heads, head_dim = point["batch"], point["seq"], point["heads"], point["head_dim"]
    d2, n_positions = int(head_dim * point["rotary_percent"]), seq + point["margin"]
    theta = torch.arange(n_positions, device="cuda")[:, None] * 10000 ** (-torch.arange(0, d2, 2, device="cuda") / d2)
    freqs = torch.cat((theta, theta), -1).view(n_positions, 1, 1, d2)
    cos = freqs.view(1, n_positions, d2).cos().to(torch.bfloat16)
    sin = freqs.view(1, n_positions, d2).sin().to(torch.bfloat16)

    def new(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=grad)

    if provider == TE_FUSED:
        qk = new(batch, seq, 2 * heads, head_dim)
        return (qk,), lambda: (apply_rotary_pos_emb(qk, freqs, "bshd"),)
    q, k = new(batch, seq, heads, head_dim), new(batch, seq, heads, head_dim)
    qv, kv = q.transpose(1, 2), k.transpose(1, 2)  # (batch, heads, seq, head_dim) views

    if provider == OURS:
        return (q, k), lambda: apply_rotary_qk(qv, kv, cos, sin)
    if provider == "tritonformer inplace":
        if grad:
            pytest.skip("in place is timed forward only: it overwrites its inputs")
        return (q, k), lambda: apply_rotary_qk(qv, kv, cos, sin, inplace=True)
    if provider == "tritonformer TE-style":
        return (q, k), lambda: (apply_rotary_pos_emb(q, freqs, "bshd"), apply_rotary_pos_emb(k, freqs, "bshd"))
    if provider == "torch":
        return (q, k), lambda: _torch_rope(q, k, freqs)
    if provider == "torch.compile":
        if triton_version() < (3, 0):
            pytest.skip("torch.compile's Inductor needs Triton 3.x; this run has Triton 2.x first on the path")
        compiled = COMPILED.setdefault(grad, torch.compile(_torch_rope))
        return (q, k), lambda: compiled(q, k, freqs)
    if provider == FLOOR:
        if not grad:
            pytest.skip("the autograd floor is a fwd+bwd measurement")
        return (q, k), lambda: _HostFloor.apply(qv, kv)
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError as error:
        pytest.skip(f"liger_kernel is not importable here: {error}")
    if point["rotary_percent"] < 1.0:
        pytest.skip("Liger rotates whole heads: no partial rotary (rotary_percent < 1)")
    cos, sin = cos[:, :seq], sin[:, :seq]
    return (q, k), lambda: liger_rotary_pos_emb(qv, kv, cos, sin)


def _shape(point):
    return (
        f"B{point['batch']} S{point['seq']} H{point['heads']} D{point['head_dim']} rot{point['rotary_percent']} "
        f"margin{point['margin']}"
    )


def _timed(point, provider, mode):
    """(fn, bytes): what one timed call of `provider` runs at `point` (fwd under no_grad, or
    forward + torch.autograd.grad), and the bytes it must move (None for the floor)."""
    grad = mode != "fwd"
    leaves, fn = _inputs(point, provider, grad)
    one_direction = 2 * sum(x.numel() for x in leaves) * leaves[0].element_size()  # read once, written once
    if not grad:

        def fwd():
            with torch.no_grad():
                return fn()

        return fwd, one_direction
    grads = [torch.randn_like(y) for y in fn()]  # in each output's own layout, as a consumer would give them

    def fwd_bwd():
        return torch.autograd.grad(fn(), leaves, grads)

    return fwd_bwd, None if provider == FLOOR else 2 * one_direction


def _measure_in_turn(benchmark, point, providers, mode, group):
    """Every provider of `providers` that runs at `point`, timed in turn (measure_paired)."""
    fns, sizes = {}, {}
    for provider in providers:
        try:
            fns[provider], sizes[provider] = _timed(point, provider, mode)
        except pytest.skip.Exception as reason:
            print(f"{provider} skipped at {_shape(point)}: {reason}")
    measure_paired(benchmark, group=group, shape=_shape(point), fns=fns, bytes=sizes)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_headline(benchmark, mode):
    _measure_in_turn(benchmark, HEADLINE, HEADLINE_PROVIDERS, mode, f"rope q,k bf16 headline {mode}")


def test_headline_backward_on_the_calling_thread(benchmark):
    with torch.autograd.set_multithreading_enabled(False):
        group = "rope q,k bf16 headline fwd+bwd, backward on the calling thread"
        _measure_in_turn(benchmark, HEADLINE, CALLING_THREAD_PROVIDERS, "fwd+bwd", group)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("axis, value", SWEEP, ids=[f"{axis}={value}" for axis, value in SWEEP])
def test_sweep(benchmark, axis, value, mode):
    """Ours and the anchors timed in turn: many of these rows are host-bound."""
    _measure_in_turn(benchmark, {**HEADLINE, axis: value}, SWEEP_PROVIDERS, mode, f"rope q,k bf16 {axis} sweep {mode}")
