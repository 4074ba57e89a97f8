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

GemmFunction (ops.matmul) calls these directly, or as the custom ops of ops.custom_ops (with the
fake versions beside them) while torch.compile traces.
"""

from typing import Optional, Tuple

import torch

from ..kernels.common import ACTIVATION_CODES
from .launch import launch_activation_grad, launch_matmul

SAVES_Z = ("gelu", "gelu_tanh")


def _empty(like: torch.Tensor) -> torch.Tensor:
    """The placeholder a custom op returns for an output it does not compute."""
    return torch.empty(0, dtype=like.dtype, device=like.device)


def _fwd_outputs(a: torch.Tensor, b: torch.Tensor, activation: Optional[str], save_z: bool):
    batch, m, _ = a.shape
    c = torch.empty((batch, m, b.shape[2]), dtype=a.dtype, device=a.device)
    z = torch.empty_like(c) if save_z and activation in SAVES_Z else _empty(a)
    return c, z


def gemm_fwd(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: Optional[str],
    save_z: bool,
    allow_tf32: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(c, z): c = act(a @ b + bias) (batch, M, N) contiguous; z = a @ b + bias (like c) when save_z
    and the activation is a GELU, else an empty placeholder."""
    c, z = _fwd_outputs(a, b, activation, save_z)
    launch_matmul(
        a, b, c, bias=bias, activation=ACTIVATION_CODES[activation], z=z if z.numel() else None, allow_tf32=allow_tf32
    )
    return c, z


def gemm_fwd_fake(a, b, bias, activation, save_z, allow_tf32):
    return _fwd_outputs(a, b, activation, save_z)


def _bwd_outputs(dc: torch.Tensor, b: torch.Tensor, need_da: bool, need_db: bool, da_dtype, db_dtype):
    """Gradient buffers (shapes from dc (batch, M, N) and b (batch, K, N)) in the given dtypes: db
    takes b's layout (row-major, or the transpose of row-major as for an nn.Linear weight passed as
    weight.t()), so the weight's .grad needs no copy."""
    batch, m, n = dc.shape
    k = b.shape[1]
    da = torch.empty((batch, m, k), dtype=da_dtype, device=dc.device) if need_da else _empty(dc)
    if not need_db:
        return da, _empty(dc)
    if b.stride(1) == 1 and b.stride(2) != 1:
        db = torch.empty((batch, n, k), dtype=db_dtype, device=b.device).transpose(1, 2)
    else:
        db = torch.empty((batch, k, n), dtype=db_dtype, device=b.device)
    return da, db


def gemm_bwd(
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
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(da, db, dbias) of c = act(a @ b + bias) for the upstream gradient dc (batch, M, N), any strides.

    a: the forward's a, needed (and saved) only for db. saved: what the forward kept for act'(Z)
    (see the module docstring), None without activation. Gradients not asked for come back as
    empty placeholders. Each gradient is written in its dtype by the kernel that computes it (fp32
    for an fp32 parameter under autocast: no cast kernel between the matmul and .grad).
    """
    code = ACTIVATION_CODES[activation]
    dz, dbias = dc, None
    if code or need_dbias:
        dz, dbias = launch_activation_grad(
            dc, saved, code, bool(code) and (need_da or need_db), need_dbias, dbias_dtype
        )
    da, db = _bwd_outputs(dc, b, need_da, need_db, da_dtype, db_dtype)
    if need_da:
        launch_matmul(dz, b.transpose(1, 2), da, allow_tf32=allow_tf32)
    if need_db:
        launch_matmul(dz.transpose(1, 2), a, db.transpose(1, 2), allow_tf32=allow_tf32)
    return da, db, dbias if dbias is not None else _empty(dc)


def gemm_bwd_fake(dc, a, b, saved, activation, need_da, need_db, need_dbias, allow_tf32, da_dtype, db_dtype,
                  dbias_dtype):  # fmt: skip
    da, db = _bwd_outputs(dc, b, need_da, need_db, da_dtype, db_dtype)
    dbias = torch.empty((b.shape[2],), dtype=dbias_dtype, device=dc.device) if need_dbias else _empty(dc)
    return da, db, dbias
