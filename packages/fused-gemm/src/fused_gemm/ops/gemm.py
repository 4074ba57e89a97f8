"""Forward and backward of c = act(a @ b + bias) over (batch, M, K) x (batch, K, N) operands.

Backward, with Z = a @ b + bias and dZ = dc * act'(Z):
    da = dZ @ b^T                 one launch, dZ formed in the prologue as the dc tiles load
    db^T = dZ^T @ a               one launch, the reduction over every token (all leading dims
                                  of x are flattened into M) inside the kernel; its prologue also
                                  sums dZ over tokens: d(bias) comes out of the same launch
What the forward saves for act'(Z): for GELU (exact or tanh) the derivative itself, written by
the forward's epilogue next to the output (one extra M x N store, the memory a torch forward
spends on Z), scaled by 7/8 so that it stays below 1, where bf16/fp16 are twice as fine as in
[1, 2) (kernels.common.SAVED_GRAD_SCALE: the gradients are then as accurate as torch's, which
computes act'(Z) from a rounded Z). The backward's prologue then needs one multiply per
element. Recomputing act'(Z) from a saved Z instead would cost an erf and an exp per element in
both backward main loops, once per output tile that reads it (K/BLOCK times): the tensor cores
would wait on it. A separate dZ pass would cost three M x N memory passes. For ReLU the output
already holds the mask (act'(Z) = [Y > 0]), so the output is saved and nothing extra is stored.

GemmFunction (ops.matmul) calls these directly, or as the custom ops of ops.custom_ops (with the
fake versions beside them) while torch.compile traces.
"""

from typing import Optional, Tuple

import torch

from ..kernels.common import ACTIVATION_CODES, PRO_MUL, PRO_NONE, PRO_RELU_MASK, SAVED_GRAD_SCALE
from .launch import launch_matmul

SAVES_DERIVATIVE = ("gelu", "gelu_tanh")


def _empty(like: torch.Tensor) -> torch.Tensor:
    """The placeholder a custom op returns for an output it does not compute."""
    return torch.empty(0, dtype=like.dtype, device=like.device)


def _fwd_outputs(a: torch.Tensor, b: torch.Tensor, activation: Optional[str], save_aux: bool):
    batch, m, _ = a.shape
    c = torch.empty((batch, m, b.shape[2]), dtype=a.dtype, device=a.device)
    aux = torch.empty_like(c) if save_aux and activation in SAVES_DERIVATIVE else _empty(a)
    return c, aux


def gemm_fwd(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: Optional[str],
    save_aux: bool,
    allow_tf32: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(c, aux): c = act(a @ b + bias) (batch, M, N) contiguous; aux = act'(a @ b + bias) when
    save_aux and the activation is a GELU, else an empty placeholder."""
    c, aux = _fwd_outputs(a, b, activation, save_aux)
    launch_matmul(
        a, b, c,
        bias=bias, activation=ACTIVATION_CODES[activation], aux=aux if aux.numel() else None, allow_tf32=allow_tf32,
    )  # fmt: skip
    return c, aux


def gemm_fwd_fake(a, b, bias, activation, save_aux, allow_tf32):
    return _fwd_outputs(a, b, activation, save_aux)


def _bwd_outputs(dc: torch.Tensor, b: torch.Tensor, need_da: bool, need_db: bool, need_dbias: bool):
    """Gradient buffers (shapes from dc (batch, M, N) and b (batch, K, N)): db takes b's layout
    (row-major, or the transpose of row-major as for an nn.Linear weight passed as weight.t()), so
    the weight's .grad needs no copy; row sums for d(bias) are written straight in the bias dtype
    for one batch, fp32 per batch otherwise."""
    batch, m, n = dc.shape
    k = b.shape[1]
    da = torch.empty((batch, m, k), dtype=dc.dtype, device=dc.device) if need_da else _empty(dc)
    if not need_db:
        return da, _empty(dc), _empty(dc)
    if b.stride(1) == 1 and b.stride(2) != 1:
        db = torch.empty((batch, n, k), dtype=b.dtype, device=b.device).transpose(1, 2)
    else:
        db = torch.empty((batch, k, n), dtype=b.dtype, device=b.device)
    row_sum_dtype = dc.dtype if batch == 1 else torch.float32
    row_sum = torch.empty((batch, n), dtype=row_sum_dtype, device=dc.device) if need_dbias else _empty(dc)
    return da, db, row_sum


def _prologue(activation: Optional[str], saved: Optional[torch.Tensor]):
    if activation in SAVES_DERIVATIVE:
        return PRO_MUL.value, saved
    if activation == "relu":
        return PRO_RELU_MASK.value, saved
    return PRO_NONE.value, None


def _dz_sum(dc: torch.Tensor, s: Optional[torch.Tensor], prologue: int) -> torch.Tensor:
    """d(bias) = dZ summed over tokens with torch ops, for the rare call that needs it without the
    weight gradient (a frozen weight with a trainable bias), or with no inner dim (K = 0)."""
    dz = dc.float()
    if prologue == PRO_MUL.value:
        dz = dz * (s.float() / SAVED_GRAD_SCALE.value)
    elif prologue == PRO_RELU_MASK.value:
        dz = dz.masked_fill(s <= 0, 0.0)
    return dz.sum((0, 1)).to(dc.dtype)


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
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(da, db, dbias) of c = act(a @ b + bias) for the upstream gradient dc (batch, M, N), any strides.

    a: the forward's a, needed (and saved) only for db. saved: what the forward kept for act'(Z)
    (see the module docstring), None without activation. Gradients not asked for come back as
    empty placeholders.
    """
    prologue, s = _prologue(activation, saved)
    da, db, row_sum = _bwd_outputs(dc, b, need_da, need_db, need_dbias)
    if need_da:
        launch_matmul(dc, b.transpose(1, 2), da, s=s, prologue=prologue, allow_tf32=allow_tf32)
    dbias = _empty(dc)
    if need_db:
        sums = row_sum if need_dbias and b.shape[1] > 0 else None
        launch_matmul(
            dc.transpose(1, 2), a, db.transpose(1, 2),
            s=s.transpose(1, 2) if s is not None else None, prologue=prologue, row_sum=sums, allow_tf32=allow_tf32,
        )  # fmt: skip
        if sums is not None:
            dbias = sums[0] if sums.shape[0] == 1 else sums.sum(0).to(dc.dtype)
    if need_dbias and dbias.numel() != b.shape[2]:
        dbias = _dz_sum(dc, s, prologue)
    return da, db, dbias


def gemm_bwd_fake(dc, a, b, saved, activation, need_da, need_db, need_dbias, allow_tf32):
    da, db, _ = _bwd_outputs(dc, b, need_da, need_db, need_dbias)
    dbias = torch.empty((b.shape[2],), dtype=dc.dtype, device=dc.device) if need_dbias else _empty(dc)
    return da, db, dbias
