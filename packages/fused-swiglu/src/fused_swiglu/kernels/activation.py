"""SwiGLU's pointwise math, and the backward tile step shared by the elementwise gradient kernel
and the down-projection backward epilogue.

    h  = silu(g) * u,  silu(g) = g * sigmoid(g)
    dg = dh * u * sigmoid(g) * (1 + g * (1 - sigmoid(g)))
    du = dh * silu(g)

All in fp32 whatever the storage dtype. sigmoid is 1 / (1 + exp(-g)) from basic ops (no
libdevice), which saturates to 0 or 1 without NaN for any finite g.
"""

import triton
import triton.language as tl

from .matmul import _store


@triton.jit
def _sigmoid(g):
    return 1.0 / (1.0 + tl.exp(-g))


@triton.jit
def _swiglu(g, u):
    """silu(g) * u, fp32 in and out."""
    return g * _sigmoid(g) * u


@triton.jit
def _swiglu_grads(dh, g, u):
    """(d_gate, d_up, h) from fp32 dh, g, u, in fp32."""
    sig = _sigmoid(g)
    silu = g * sig
    return dh * u * sig * (1.0 + g * (1.0 - sig)), dh * silu, silu * u


@triton.jit
def _swiglu_backward_store(dh, g, u, g_ptrs, u_ptrs, h_ptrs, mask, STORE_H: tl.constexpr, UPCAST: tl.constexpr):
    """d_gate over g, d_up over u (and h = silu(g) * u when STORE_H), from loaded dh, g, u tiles."""
    d_gate, d_up, h = _swiglu_grads(dh.to(tl.float32), g.to(tl.float32), u.to(tl.float32))
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
):
    """One (rows, cols) tile of the SwiGLU backward.

    Loads dh (any strides), g and u (contiguous rows of stride stride_gm); overwrites g with dg
    and u with du, in place; stores h = silu(g) * u too when STORE_H (the down projection's
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
    _swiglu_backward_store(dh, g, u, g_ptr + offs, u_ptr + offs, h_ptr + offs, mask, STORE_H, UPCAST)
