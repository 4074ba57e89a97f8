"""Forward and backward of c = act(a @ b + bias) over (batch, M, K) x (batch, K, N) operands.

Backward, with Z = a @ b + bias and dZ = dc * act'(Z):
    dZ, d(bias)   one elementwise pass (kernels.grad) when there is an activation or a bias:
                  reads dc and what the forward saved, writes dZ, sums it over tokens
    da = dZ @ b^T       plain matmuls of dZ, at the plain matmul's speed (the TMA kernel
    db^T = dZ^T @ a     where it runs); db reduces over every token (all leading dims of x are
                        flattened into M) inside its one launch
What the forward saves for act'(Z): for GELU (exact or tanh) the pre-activation Z, stored by
the forward's epilogue next to the output (one extra M x N store: the memory a torch forward
spends on Z too), from which the elementwise pass computes act'(Z) in fp32, as torch's
gelu_backward does. For ReLU the output holds the mask (act'(Z) = [Y > 0]), so the output is
saved and nothing extra is stored. Under torch.no_grad nothing is saved.

Why a separate pass (three M x N memory passes, ~0.27 ms at 16384 x 8192 on an H100) rather
than forming dZ inside both matmuls' main loops: there the A operand passes through registers,
which Triton's Hopper pipeline cannot overlap with wgmma (on an H100, Triton 3.6, such a fused
backward runs at half the plain backward's speed, 4.7 vs 2.6 ms).

GemmFunction (ops.matmul) calls gemm_forward / gemm_backward directly, or gemm_fwd / gemm_bwd (the
same with placeholders for absent outputs) as the custom ops of ops.custom_ops (with the fake
versions beside them) while torch.compile traces.
"""

import inspect
from typing import Optional, Tuple

import torch

from ..kernels.common import ACTIVATION_CODES
from .launch import launch_activation_grad, launch_matmul

SAVES_Z = ("gelu", "gelu_tanh")


def _empty(like: torch.Tensor) -> torch.Tensor:
    """The placeholder a custom op returns for an output it does not compute."""
    return torch.empty(0, dtype=like.dtype, device=like.device)


def gemm_forward(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: Optional[str],
    save_z: bool,
    allow_tf32: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(c, z): c = act(a @ b + bias) (batch, M, N) contiguous; z = a @ b + bias (like c) when save_z
    and the activation is a GELU, else None."""
    batch, m, _ = a.shape
    c = torch.empty((batch, m, b.shape[2]), dtype=a.dtype, device=a.device)
    z = torch.empty_like(c) if save_z and activation in SAVES_Z else None
    launch_matmul(a, b, c, bias=bias, activation=ACTIVATION_CODES[activation], z=z, allow_tf32=allow_tf32)
    return c, z


def gemm_fwd(*args) -> Tuple[torch.Tensor, torch.Tensor]:
    """gemm_forward as a custom op returns it: an empty placeholder where z is not stored."""
    c, z = gemm_forward(*args)
    return c, _empty(c) if z is None else z


def gemm_fwd_fake(a, b, bias, activation, save_z, allow_tf32):
    batch, m, _ = a.shape
    c = torch.empty((batch, m, b.shape[2]), dtype=a.dtype, device=a.device)
    return c, torch.empty_like(c) if save_z and activation in SAVES_Z else _empty(a)


def _grad_buffer(dc: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """db's buffer (shape from dc (batch, M, N) and b (batch, K, N)) in `dtype`, in b's layout
    (row-major, or the transpose of row-major as for an nn.Linear weight passed as weight.t()),
    so the weight's .grad needs no copy."""
    batch, _, n = dc.shape
    k = b.shape[1]
    if b.stride(1) == 1 and b.stride(2) != 1:
        return torch.empty((batch, n, k), dtype=dtype, device=b.device).transpose(1, 2)
    return torch.empty((batch, k, n), dtype=dtype, device=b.device)


def gemm_backward(
    dc: torch.Tensor,
    a: Optional[torch.Tensor],
    b: torch.Tensor,
    saved: Optional[torch.Tensor],
    activation: Optional[str],
    need_da: bool,
    need_db: bool,
    need_dbias: bool,
    allow_tf32: bool,
    da_dtype: torch.dtype,
    db_dtype: torch.dtype,
    dbias_dtype: torch.dtype,
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(da, db, dbias) of c = act(a @ b + bias) for the upstream gradient dc (batch, M, N), any strides.

    a: the forward's a, needed (and saved) only for db. saved: what the forward kept for act'(Z)
    (see the module docstring), None without activation. Gradients not asked for are None. Each
    gradient is written in its dtype by the kernel that computes it (fp32 for an fp32 parameter
    under autocast: no cast kernel between the matmul and .grad).
    """
    code = ACTIVATION_CODES[activation]
    dz, dbias = dc, None
    if code or need_dbias:
        dz, dbias = launch_activation_grad(
            dc, saved, code, bool(code) and (need_da or need_db), need_dbias, dbias_dtype
        )
    da = db = None
    if need_da:
        batch, m, _ = dc.shape
        da = torch.empty((batch, m, b.shape[1]), dtype=da_dtype, device=dc.device)
        launch_matmul(dz, b.transpose(1, 2), da, allow_tf32=allow_tf32)
    if need_db:
        db = _grad_buffer(dc, b, db_dtype)
        launch_matmul(dz.transpose(1, 2), a, db.transpose(1, 2), allow_tf32=allow_tf32)
    return da, db, dbias


def _or_empty(like: torch.Tensor, *tensors: Optional[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
    """`tensors` with an empty placeholder for each None (a custom op returns tensors)."""
    return tuple(_empty(like) if t is None else t for t in tensors)


def gemm_bwd(*args) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """gemm_backward as a custom op returns it: empty placeholders for the gradients not asked for."""
    return _or_empty(args[0], *gemm_backward(*args))


def _op_signature(launcher, op, outputs: int) -> None:
    """`op` takes `launcher`'s arguments (the custom op's schema is read from its signature) and
    returns `outputs` tensors."""
    returns = Tuple[(torch.Tensor,) * outputs]
    op.__signature__ = inspect.signature(launcher).replace(return_annotation=returns)


_op_signature(gemm_forward, gemm_fwd, 2)
_op_signature(gemm_backward, gemm_bwd, 3)


def gemm_bwd_fake(dc, a, b, saved, activation, need_da, need_db, need_dbias, allow_tf32, da_dtype, db_dtype,
                  dbias_dtype):  # fmt: skip
    batch, m, n = dc.shape
    da = torch.empty((batch, m, b.shape[1]), dtype=da_dtype, device=dc.device) if need_da else _empty(dc)
    db = _grad_buffer(dc, b, db_dtype) if need_db else _empty(dc)
    dbias = torch.empty((n,), dtype=dbias_dtype, device=dc.device) if need_dbias else _empty(dc)
    return da, db, dbias
