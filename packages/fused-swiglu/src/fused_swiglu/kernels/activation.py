"""The gated MLP's pointwise math, and the backward tile step shared by the elementwise gradient
kernel and the down-projection backward epilogue.

    h  = act(g) * u
    dg = dh * u * act'(g)
    du = dh * act(g)

act is the ACTIVATION constexpr's: SILU (SwiGLU, LLaMA), silu(g) = g * sigmoid(g), or GELU_TANH
(GeGLU, Gemma's gelu_pytorch_tanh), gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
All in fp32 whatever the storage dtype, from basic ops (no libdevice): sigmoid is 1 / (1 + exp(-g)),
which saturates to 0 or 1 without NaN for any finite g, and the GELU's tanh is written through
exp(-2|y|) <= 1 (_gelu_tanh_gate), which never overflows.
"""

import triton
import triton.language as tl

from .matmul import _store

# The values of the ACTIVATION constexpr, and the public names that select them.
SILU = tl.constexpr(0)
GELU_TANH = tl.constexpr(1)
ACTIVATION_CODES = {"silu": SILU.value, "gelu_tanh": GELU_TANH.value}

# |g| from which the tanh-GELU's gate is saturated in fp32: exp(-2|y|) underflows to 0 from
# |g| = 11 on, so clamping there changes nothing, and keeps g^2 and g^3 from overflowing.
_GELU_SATURATED = tl.constexpr(16.0)


@triton.jit
def _sigmoid(g):
    return 1.0 / (1.0 + tl.exp(-g))


@triton.jit
def _gelu_tanh_gate(g):
    """(s, ds) with gelu(g) = g s and gelu'(g) = s + g ds, fp32.

    With y = sqrt(2/pi) (g + 0.044715 g^3), t = tanh(y) and e = exp(-2|y|): s = 0.5 (1 + t) is
    1 / (1 + e) for g >= 0 and e / (1 + e) below, and 0.5 (1 - t^2) = 2 e / (1 + e)^2 has no
    cancellation; ds = 0.5 (1 - t^2) y' / g = 2 sqrt(2/pi) e / (1 + e)^2 (1 + 3 * 0.044715 g^2).
    """
    gc = tl.minimum(tl.maximum(g, -_GELU_SATURATED), _GELU_SATURATED)
    g2 = gc * gc
    e = tl.exp(tl.abs(gc * (1.0 + 0.044715 * g2)) * -1.5957691216057308)  # -2 sqrt(2/pi)
    r = 1.0 / (1.0 + e)
    s = tl.where(g >= 0.0, r, e * r)
    return s, 1.5957691216057308 * (e * r * r) * (1.0 + 0.134145 * g2)


@triton.jit
def _swiglu(g, u, ACTIVATION: tl.constexpr):
    """act(g) * u, fp32 in and out."""
    if ACTIVATION == GELU_TANH:
        s, _ = _gelu_tanh_gate(g)
        h = g * s * u
    else:
        h = g * _sigmoid(g) * u
    return h


@triton.jit
def _swiglu_grads(dh, g, u, ACTIVATION: tl.constexpr):
    """(d_gate, d_up, h) from fp32 dh, g, u, in fp32."""
    if ACTIVATION == GELU_TANH:
        s, ds = _gelu_tanh_gate(g)
        act = g * s
        d_gate = dh * u * (s + g * ds)
    else:
        sig = _sigmoid(g)
        act = g * sig
        d_gate = dh * u * sig * (1.0 + g * (1.0 - sig))
    return d_gate, dh * act, act * u


@triton.jit
def _swiglu_backward_store(
    dh, g, u, g_ptrs, u_ptrs, h_ptrs, mask, STORE_H: tl.constexpr, UPCAST: tl.constexpr, ACTIVATION: tl.constexpr
):
    """d_gate over g, d_up over u (and h = act(g) * u when STORE_H), from loaded dh, g, u tiles."""
    d_gate, d_up, h = _swiglu_grads(dh.to(tl.float32), g.to(tl.float32), u.to(tl.float32), ACTIVATION)
    _store(g_ptrs, d_gate, mask, UPCAST)
    _store(u_ptrs, d_up, mask, UPCAST)
    if STORE_H:
        _store(h_ptrs, h, mask, UPCAST)


@triton.jit
def _swiglu_backward_tile(
    dh_ptr,
    g_ptr,
    u_ptr,
    h_ptr,
    stride_dhm,
    stride_dhn,
    stride_gm,
    offs_m,
    offs_n,
    size_m,
    size_n,
    STORE_H: tl.constexpr,
    UPCAST: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """One (rows, cols) tile of the backward.

    Loads dh (any strides), g and u (contiguous rows of stride stride_gm); overwrites g with dg
    and u with du, in place; stores h = act(g) * u too when STORE_H (the down projection's
    weight gradient needs it; h may share dh's memory: each element is read before it is written,
    by the same thread).
    """
    mask = (offs_m[:, None] < size_m) & (offs_n[None, :] < size_n)
    rows = offs_m.to(tl.int64)[:, None]
    cols = offs_n.to(tl.int64)[None, :]
    dh = tl.load(dh_ptr + rows * stride_dhm + cols * stride_dhn, mask=mask, other=0.0)
    offs = rows * stride_gm + offs_n[None, :]
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0)
    _swiglu_backward_store(dh, g, u, g_ptr + offs, u_ptr + offs, h_ptr + offs, mask, STORE_H, UPCAST, ACTIVATION)
