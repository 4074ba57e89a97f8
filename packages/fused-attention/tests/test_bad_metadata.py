"""flash_attention_varlen with offsets it cannot trust (check_seqlens=False): memory-safe.

Offsets past the packed tokens, decreasing or negative, and max_seqlen below or far above the real
lengths give unspecified values in the rows they describe, but every kernel keeps its reads and
writes inside its tensors (a sequence outside the packed rows is empty), and the sequences whose
offsets are valid come out right.

Two witnesses: every allocation of a call sits between guard bands whose bytes must be unchanged
afterwards (any device); and under the interpreter each load, store and atomic of every launch is
checked, before it runs, to touch only elements of that launch's tensor arguments (a compiled
kernel reading past a tensor shows no trace; an interpreted one reads garbage or crashes).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import pytest
import torch
from tritonformer_testkit import interpreting

from fused_attention import alibi_slopes, flash_attention_varlen

pytestmark = pytest.mark.kernels

BF16 = torch.bfloat16
GUARD_BYTES = 1 << 16  # each side of every allocation: farther than any stray row of these shapes
GUARD_BYTE = 0xA5


def _extent(t: torch.Tensor):
    """[first byte, end byte) of the elements a tensor view addresses (None when empty)."""
    if t.numel() == 0:
        return None
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _tensor_args(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (tuple, list)):
            yield from _tensor_args(value)
        elif hasattr(value, "base") and isinstance(getattr(value, "base", None), torch.Tensor):
            yield value.base  # a TMA descriptor


class _AccessChecker:
    """The interpreter's loads, stores and atomics, each checked against the extents of the tensor
    arguments of the launch that runs it. A violation raises before the access happens."""

    def __init__(self):
        self.starts = self.ends = np.zeros(0, dtype=np.uint64)
        self.checked = 0

    def launch(self, args, kwargs):
        extents = sorted(e for t in _tensor_args([*args, *kwargs.values()]) if (e := _extent(t)) is not None)
        merged = []
        for start, end in extents:  # overlapping views (q, k, v of one buffer) merge
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = np.array([s for s, _ in merged], dtype=np.uint64)
        self.ends = np.array([e for _, e in merged], dtype=np.uint64)

    def check(self, what, ptrs, mask):
        addresses = ptrs.data if mask is None else ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)]
        addresses = np.asarray(addresses, dtype=np.uint64).ravel()
        if addresses.size == 0:
            return
        size = np.uint64(ptrs.get_element_ty().primitive_bitwidth // 8)
        index = np.searchsorted(self.starts, addresses, side="right") - 1
        inside = (index >= 0) & (addresses + size <= self.ends[np.maximum(index, 0)])
        self.checked += addresses.size
        if not inside.all():
            bad = addresses[~inside]
            raise AssertionError(
                f"{what} of {bad.size} of {addresses.size} elements outside the launch's tensors, e.g. at "
                f"{int(bad[0]):#x}; tensors at {[(hex(int(s)), int(e - s)) for s, e in zip(self.starts, self.ends)]}"
            )


@contextlib.contextmanager
def _checked_accesses():
    """Under the interpreter, every memory access of every launch checked (see _AccessChecker)."""
    if not interpreting():
        yield None
        return
    from triton.runtime import interpreter

    checker = _AccessChecker()
    builder = interpreter.InterpreterBuilder
    init_args = interpreter.GridExecutor._init_args_hst
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def init_args_checked(self, args_dev, kwargs):
        args, kwargs_hst = init_args(self, args_dev, kwargs)
        checker.launch(args, kwargs_hst)
        return args, kwargs_hst

    def load_checked(self, ptrs, mask, *rest):
        checker.check("load", ptrs, mask)
        return load(self, ptrs, mask, *rest)

    def store_checked(self, ptrs, value, mask, *rest):
        checker.check("store", ptrs, mask)
        return store(self, ptrs, value, mask, *rest)

    def rmw_checked(self, op, ptr, val, mask, *rest):
        checker.check("atomic", ptr, mask)
        return rmw(self, op, ptr, val, mask, *rest)

    def cas_checked(self, ptr, *rest):
        checker.check("atomic_cas", ptr, None)
        return cas(self, ptr, *rest)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(interpreter.GridExecutor, "_init_args_hst", init_args_checked))
        for name, patched in [
            ("create_masked_load", load_checked),
            ("create_masked_store", store_checked),
            ("create_atomic_rmw", rmw_checked),
            ("create_atomic_cas", cas_checked),
        ]:
            stack.enter_context(mock.patch.object(builder, name, patched))
        yield checker


@contextlib.contextmanager
def _guarded_allocations():
    """Every torch.empty / empty_like / empty_strided inside returns NaN-poisoned memory between two
    guard bands of GUARD_BYTE; on exit the bands must be intact (nothing wrote next to a tensor)."""
    factories = {name: getattr(torch, name) for name in ("empty", "empty_like", "empty_strided")}
    guarded = []

    def guarding(factory):
        def allocate(*args, **kwargs):
            plain = factory(*args, **kwargs)  # the layout to reproduce
            nbytes = plain.untyped_storage().nbytes()
            raw = torch.full((2 * GUARD_BYTES + nbytes,), GUARD_BYTE, dtype=torch.uint8, device=plain.device)
            raw[GUARD_BYTES : GUARD_BYTES + nbytes] = 0xFF  # NaN in every float format, -1 in every int one
            t = torch.tensor([], dtype=plain.dtype, device=plain.device)
            t.set_(raw.untyped_storage(), GUARD_BYTES // plain.element_size(), plain.shape, plain.stride())
            guarded.append((raw, nbytes))
            return t.requires_grad_(plain.requires_grad)

        return allocate

    with contextlib.ExitStack() as stack:
        for name, factory in factories.items():
            stack.enter_context(mock.patch.object(torch, name, guarding(factory)))
        yield
    for raw, nbytes in guarded:
        for band in (raw[:GUARD_BYTES], raw[GUARD_BYTES + nbytes :]):
            written = int((band != GUARD_BYTE).sum())
            assert written == 0, f"{written} bytes written beside a {nbytes}-byte allocation"


def _guarded_copy(t: torch.Tensor) -> torch.Tensor:
    """t in guarded memory (call inside _guarded_allocations)."""
    return torch.empty_like(t).copy_(t)


def _offsets(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


# name: (rows of q, rows of k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, the valid sequences)
# The valid sequences' rows are disjoint from the other sequences' (those within the packed rows
# run), so their results are defined.
CASES = {
    "end-past-tokens": (30, 30, [0, 10, 25, 4000], None, 20, 20, [0, 1]),
    "end-near-int32-max": (30, 30, [0, 10, 25, 2**31 - 1], None, 20, 20, [0, 1]),
    "start-past-tokens": (30, 34, [0, 10, 25, 30, 5000, 6000], [0, 12, 25, 34, 900, 100000], 20, 20, [0, 1, 2]),
    "end-before-start": (30, 30, [0, 10, 25, 20], None, 20, 20, [0, 1]),
    "decreasing-past-tokens": (30, 30, [0, 10, 35, 30], None, 20, 20, [0]),
    "negative-end": (30, 30, [0, 10, 25, -3], None, 20, 20, [0, 1]),
    "negative-start": (30, 30, [-8, 10, 25, 30], None, 20, 20, [1, 2]),
    "int32-min-start": (30, 30, [-(2**31), 10, 25, 30], None, 20, 20, [1, 2]),
    "only-k-past-tokens": (30, 26, [0, 10, 25, 30], [0, 11, 19, 70000], 20, 20, [0, 1]),
    "max-seqlen-too-small": (30, 33, [0, 10, 25, 30], [0, 12, 28, 33], 12, 13, [0, 2]),
    "max-seqlen-huge": (30, 33, [0, 10, 25, 30], [0, 12, 28, 33], 2**40, 2**33, [0, 1, 2]),
}


def _expected_rows(attn, q, k, v, dout, dlse, rows_q, rows_k, **options):
    """Outputs and gradients of one sequence alone: (fp64 reference, low-precision twin), with
    the sequence as a batch of one in the (B, S, H, D) layout."""
    args = [t[rows].unsqueeze(0) for t, rows in ((q, rows_q), (k, rows_k), (v, rows_k), (dout, rows_q))]
    dlse_b = dlse[None, :, rows_q]
    return attn.reference(*args, dlse_b, **options), attn.lowp_twin(*args, dlse_b, **options)


def _ours_rows(ours, rows_q, rows_k):
    out = {name: ours[name][rows].unsqueeze(0) for name, rows in (("out", rows_q), ("dq", rows_q))}
    out.update({name: ours[name][rows_k].unsqueeze(0) for name in ("dk", "dv")})
    out["lse"] = ours["lse"][None, :, rows_q]
    return out


@pytest.mark.parametrize("deterministic", [False, True], ids=["default-bwd", "deterministic-bwd"])
@pytest.mark.parametrize("case", list(CASES))
def test_unchecked_offsets_stay_in_bounds(case, deterministic, attn, device):
    """Forward and backward (every kernel: with the default backward the interpreter takes the
    atomic dQ path, pre-pass, dK/dV and dQ conversion; deterministic takes the dQ kernel), causal
    with GQA and per-sequence ALiBi slopes."""
    total_q, total_k, offsets_q, offsets_k, max_q, max_k, valid = CASES[case]
    offsets_k = offsets_q if offsets_k is None else offsets_k
    batch = len(offsets_q) - 1
    q0 = torch.randn(total_q, 4, 32, device=device).to(BF16)
    k0 = torch.randn(total_k, 2, 32, device=device).to(BF16)
    v0 = torch.randn(total_k, 2, 32, device=device).to(BF16)
    dout = torch.randn(q0.shape, device=device).to(BF16)
    dlse = torch.randn(4, total_q, device=device)
    slopes = alibi_slopes(4, device=device).repeat(batch, 1) * torch.rand(batch, 1, device=device)
    options = dict(causal=True, deterministic=deterministic)
    with _checked_accesses() as checker, _guarded_allocations():
        q, k, v = (_guarded_copy(t).requires_grad_(True) for t in (q0, k0, v0))
        cu_q, cu_k = _guarded_copy(_offsets(offsets_q, device)), _guarded_copy(_offsets(offsets_k, device))
        out, lse = flash_attention_varlen(
            q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes=_guarded_copy(slopes), return_lse=True,
            check_seqlens=False, **options,
        )  # fmt: skip
        dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse))
    if checker is not None:
        assert checker.checked > 0  # the hooks saw the kernels' accesses
    ours = dict(out=out, lse=lse, dq=dq, dk=dk, dv=dv)
    options.pop("deterministic")
    for b in valid:
        rows_q = slice(offsets_q[b], offsets_q[b + 1])
        rows_k = slice(offsets_k[b], offsets_k[b + 1])
        ref, twin = _expected_rows(attn, q0, k0, v0, dout, dlse, rows_q, rows_k, alibi_slopes=slopes[b], **options)
        attn.compare(_ours_rows(ours, rows_q, rows_k), ref, twin)


def test_guards_see_a_stray_write(device):
    """The guard bands catch a write one element past a tensor (the witness can fail)."""
    with pytest.raises(AssertionError, match="bytes written beside"):
        with _guarded_allocations():
            t = torch.empty(10, device=device)
            torch.tensor([], device=device).set_(t.untyped_storage(), 0, (11,), (1,)).fill_(1.0)


@pytest.mark.skipif(not interpreting(), reason="the access checker hooks Triton's interpreter")
def test_checker_sees_a_stray_read():
    """The access checker rejects a load one element past a kernel's tensor (the witness can fail)."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n - 1)

    src, dst = torch.ones(8), torch.zeros(8)
    with _checked_accesses():
        copy[(1,)](src, dst, 8, BLOCK=16)  # in bounds
        with pytest.raises(Exception, match="load of 1 of 9 elements outside"):
            copy[(1,)](src, dst, 9, BLOCK=16)
    assert torch.equal(dst[:7], src[:7])
