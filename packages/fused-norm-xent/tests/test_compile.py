"""Every kernel specialization the launchers can choose compiles to a cubin (sm_80, sm_90).

A covering set, not the cross product: every launch configuration (block shape and warps) of
each kernel, and every constexpr flag value and dtype, appears at least once. `_spec` turns
launcher-like arguments into a signature the way the JIT does: a tensor becomes a pointer of its
dtype, None and the int 1 become constexprs (not for arguments the kernel does not specialize),
other ints i32, floats fp32.
"""

import itertools

import pytest
from tritonformer_testkit.aot import ARCHS, base_jit_function, compile_to_cubin

from fused_norm_xent._compat import PREFETCH_CHUNKS
from fused_norm_xent.kernels import cross_entropy as ce_kernels
from fused_norm_xent.kernels import norm as norm_kernels
from fused_norm_xent.kernels import softmax as softmax_kernels
from fused_norm_xent.ops.cross_entropy import FINALIZE_BLOCK, SCALE_TILE, cross_entropy_config
from fused_norm_xent.ops.norm import MAX_SINGLE_BLOCK_COLS, PARAM_GRAD_BLOCK, norm_config
from fused_norm_xent.ops.softmax import launch_config

pytestmark = pytest.mark.aot

DTYPES = ["fp32", "fp16", "bf16"]
# One width per launch configuration: every power of two up to the widest single block, then two
# chunked widths (the backward's gradient outputs differ between one program and several).
NORM_WIDTHS = [2**k for k in range(MAX_SINGLE_BLOCK_COLS.bit_length())] + [MAX_SINGLE_BLOCK_COLS + 1, 12289]
CE_WIDTHS = [2**k for k in range(14)] + [50304]
SOFTMAX_WIDTHS = [2**k for k in range(15)] + [65536]


def _spec(kernel, arch, num_warps, constexprs, **args):
    signature, consts = {}, dict(constexprs)
    unspecialized = {param.name for param in base_jit_function(kernel).params if param.do_not_specialize}
    for name, value in args.items():
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 1
                             and name not in unspecialized):  # fmt: skip
            consts[name] = value
        elif isinstance(value, str):
            signature[name] = value if value.startswith("*") else f"*{value}"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    compile_to_cubin(kernel, signature=signature, constexprs=consts, arch=arch, num_warps=num_warps)


def _cycle(values, i):
    return values[i % len(values)]


def _norm_cases():
    for i, width in enumerate(NORM_WIDTHS):
        rms, residual, dropout = i % 2 == 1, (i // 2) % 2 == 1, i % 3 == 0
        dtype, res_dtype = _cycle(DTYPES, i), _cycle(DTYPES, i + 1) if residual else None
        flags = {
            "IS_RMS_NORM": rms, "HAS_RESIDUAL": residual, "HAS_DROPOUT": dropout,
            "STORE_RESIDUAL": residual or dropout or i % 5 == 2, "HAS_WEIGHT": i % 4 != 1,
            "HAS_BIAS": i % 4 in (0, 2), "strided": i % 7 == 3, "one_program": i % 2 == 0,
        }  # fmt: skip
        yield pytest.param(width, dtype, res_dtype or "fp32", flags, id=f"cols{width}-{dtype}-{'rms' if rms else 'ln'}")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("width, dtype, res_dtype, flags", list(_norm_cases()))
def test_norm_kernels_compile(width, dtype, res_dtype, flags, arch):
    flags = dict(flags)
    strided, one_program = flags.pop("strided"), flags.pop("one_program")
    rms, store, has_w, has_b = flags["IS_RMS_NORM"], flags["STORE_RESIDUAL"], flags["HAS_WEIGHT"], flags["HAS_BIAS"]
    residual = res_dtype if flags["HAS_RESIDUAL"] else None
    cfg = norm_config(width, False)
    kernel = norm_kernels._norm_fwd_chunked_kernel if cfg.chunked else norm_kernels._norm_fwd_kernel
    _spec(
        kernel, arch, cfg.num_warps, dict(flags, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n),
        x_ptr=dtype, residual_ptr=residual, weight_ptr=res_dtype if has_w else None, bias_ptr=dtype if has_b else None,
        y_ptr=dtype, residual_out_ptr=res_dtype if store else None, stats_ptr="fp32",
        stride_x_row=width * (3 if strided else 1), stride_x_col=3 if strided else 1, stride_res_row=width,
        stride_res_col=1 if residual else 0, n_rows=64, n_cols=width, eps=1e-5, weight_offset=0.0, dropout_scale=1.25,
        dropout_threshold=123456, rng_ptr="i32" if flags["HAS_DROPOUT"] else None,
    )  # fmt: skip
    cfg = norm_config(width, True)
    kernel = norm_kernels._norm_bwd_chunked_kernel if cfg.chunked else norm_kernels._norm_bwd_kernel
    # Several programs write fp32 partial sums; a single one writes the gradients in their dtype.
    partial_dtype = "bf16" if one_program else "fp32"
    bwd_flags = {
        "IS_RMS_NORM": rms, "HAS_DRES_OUT": store, "STORE_DRES": flags["HAS_RESIDUAL"] and flags["HAS_DROPOUT"],
        "HAS_DROPOUT": flags["HAS_DROPOUT"], "HAS_WEIGHT": has_w, "HAS_BIAS": has_b,
    }  # fmt: skip
    _spec(
        kernel, arch, cfg.num_warps, dict(bwd_flags, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n),
        s_ptr=res_dtype if store else dtype, dy_ptr=dtype, dres_out_ptr=res_dtype if store else None,
        weight_ptr=res_dtype if has_w else None, stats_ptr="fp32", dx_ptr=dtype,
        dres_ptr=res_dtype if bwd_flags["STORE_DRES"] else None, dw_ptr=partial_dtype if has_w else None,
        db_ptr=partial_dtype if has_b else None, stride_s_row=width * (2 if strided else 1),
        stride_s_col=2 if strided else 1, stride_dy_row=width, stride_dy_col=1, stride_dres_out_row=width,
        stride_dres_out_col=1 if store else 0, n_rows=64, n_cols=width, db_offset=width * 3 if has_w else 0,
        weight_offset=1.0 if rms else 0.0, dropout_scale=1.25, dropout_threshold=123456,
    )  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "has_weight, has_bias, dtype", [(True, True, "bf16"), (True, False, "fp32"), (False, True, "fp16")]
)
def test_norm_param_grad_kernel_compiles(has_weight, has_bias, dtype, arch):
    block_p, block_n = PARAM_GRAD_BLOCK
    _spec(
        norm_kernels._norm_param_grad_kernel, arch, 4,
        {"HAS_WEIGHT": has_weight, "HAS_BIAS": has_bias, "BLOCK_P": block_p, "BLOCK_N": block_n},
        partial_ptr="fp32", dw_ptr=dtype if has_weight else None, db_ptr=dtype if has_bias else None, n_partials=528,
        n_cols=4096, db_offset=528 * 4096 if has_weight else 0,
    )  # fmt: skip


def _cross_entropy_cases():
    # forward + grad (mean or sum, reduced), loss only per row (none, z-loss rows), grad from saved lse
    modes = [(True, True, True), (True, False, False), (False, True, False)]  # (compute loss, grad, reduce)
    for i, width in enumerate(CE_WIDTHS):
        compute_loss, compute_grad, reduce = _cycle(modes, i)
        # The launcher prefetches where this Triton allows it; the portable loops compile everywhere.
        prefetch = PREFETCH_CHUNKS and i % 5 != 4
        # The softcap with every mode, with and without smoothing, z-loss and prefetching.
        softcap = i % 4 in (1, 2)
        suffix = ("" if prefetch else "-noprefetch") + ("-softcap" if softcap else "")
        yield pytest.param(
            width, _cycle(DTYPES, i), _cycle(["i64", "i32"], i // 3), compute_loss, compute_grad, reduce,
            i % 2 == 0, i % 4 < 2, softcap, prefetch, id=f"cols{width}-{_cycle(DTYPES, i)}{suffix}",
        )  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "width, dtype, target_dtype, compute_loss, compute_grad, reduce, smoothing, z_loss, softcap, prefetch",
    list(_cross_entropy_cases()),
)
def test_cross_entropy_kernel_compiles(width, dtype, target_dtype, compute_loss, compute_grad, reduce, smoothing,
                                       z_loss, softcap, prefetch, arch):  # fmt: skip
    cfg = cross_entropy_config(width)
    per_row = compute_loss and not reduce
    row_scale = not compute_loss  # the backward of reduction="none"
    mean = reduce and width % 3 == 0
    flags = {
        "COMPUTE_LOSS": compute_loss, "REDUCE": reduce, "STORE_Z_LOSS": per_row and z_loss,
        "COMPUTE_GRAD": compute_grad, "MEAN_SCALE": mean, "HAS_SMOOTHING": smoothing, "HAS_Z_LOSS": z_loss,
        "HAS_SOFTCAP": softcap, "HAS_ROW_SCALE": row_scale, "PREFETCH": prefetch, "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
    }  # fmt: skip
    _spec(
        ce_kernels._cross_entropy_kernel, arch, cfg.num_warps, flags,
        logits_ptr=dtype, target_ptr=target_dtype, grad_ptr=dtype if compute_grad else None,
        loss_ptr=("fp32" if width % 2 else dtype) if per_row else None,
        z_loss_ptr=("fp32" if width % 2 else dtype) if per_row and z_loss else None,
        partial_ptr="fp64" if reduce else None, lse_ptr="fp32", row_scale_ptr=dtype if row_scale else None,
        all_target_ptr=target_dtype if mean else None, col_start=0 if compute_loss else 4096, stride_logits_row=width,
        stride_logits_col=1 if width != 2 else 8, stride_grad_row=width, stride_grad_col=1 if compute_grad else 0,
        stride_target=1, stride_row_scale=1 if width % 3 else 0, n_rows=4096, n_cols=width,
        n_classes=width if compute_loss else 50304,
        n_targets=16384 if mean else 0, ignore_index=-100, label_smoothing=0.1, lse_square_scale=1e-4, softcap=30.0,
        grad_scale=0.5,
    )  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype, mean, z_loss", [("fp32", True, True), ("bf16", False, False), ("fp16", True, False)])
def test_loss_finalize_kernel_compiles(dtype, mean, z_loss, arch):
    _spec(
        ce_kernels._loss_finalize_kernel, arch, 4,
        {"MEAN": mean, "STORE_Z_LOSS": z_loss, "BLOCK_P": FINALIZE_BLOCK},
        partial_ptr="fp64", loss_ptr=dtype, z_loss_ptr=dtype if z_loss else None, n_partials=264,
    )  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "dtype, target_dtype, row_targets",
    [("fp32", "i64", True), ("bf16", "i32", True), ("fp16", "i64", True), ("fp32", "i64", False),
     ("bf16", "i32", False)],
)  # fmt: skip
def test_scale_kernel_compiles(dtype, target_dtype, row_targets, arch):
    """Both modes: the rows of a logits or hidden-state gradient (a target per row), a weight or
    bias gradient (left as it is when no target is valid)."""
    block_m, block_n = SCALE_TILE
    _spec(
        ce_kernels._scale_kernel, arch, 8, {"ROW_TARGETS": row_targets, "BLOCK_M": block_m, "BLOCK_N": block_n},
        x_ptr=dtype, scale_ptr=dtype, target_ptr=target_dtype, stride_x_row=4096,
        stride_x_col=1 if dtype != "fp16" else 2, stride_target=1, n_rows=64, n_cols=4096,
        n_targets=0 if row_targets else 16384, ignore_index=-100,
    )  # fmt: skip


def _softmax_cases():
    for i, width in enumerate(SOFTMAX_WIDTHS):
        yield pytest.param(width, _cycle(DTYPES, i), i % 2 == 1, id=f"cols{width}-{_cycle(DTYPES, i)}")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("width, dtype, log", list(_softmax_cases()))
def test_softmax_kernels_compile(width, dtype, log, arch):
    cfg = launch_config(width)
    sizes = {"n_cols": width} if cfg.chunked else {"n_rows": 512, "n_cols": width}
    consts = {"LOG": log, "BLOCK_N": cfg.block_n} if cfg.chunked else {"LOG": log, "BLOCK_M": cfg.block_m,
                                                                       "BLOCK_N": cfg.block_n}  # fmt: skip
    fwd, bwd = (
        (softmax_kernels._softmax_fwd_chunked_kernel, softmax_kernels._softmax_bwd_chunked_kernel)
        if cfg.chunked
        else (softmax_kernels._softmax_fwd_kernel, softmax_kernels._softmax_bwd_kernel)
    )
    _spec(fwd, arch, cfg.num_warps, consts, x_ptr=dtype, y_ptr=dtype, stride_x_row=width * 2, stride_x_col=2 - log,
          stride_y_row=width, **sizes)  # fmt: skip
    _spec(bwd, arch, cfg.num_warps, consts, y_ptr=dtype, dy_ptr=dtype, dx_ptr=dtype, stride_y_row=width,
          stride_dy_row=width, stride_dy_col=1 + log, stride_dx_row=width, **sizes)  # fmt: skip


def test_the_covering_sets_cover_every_configuration():
    """Each launch configuration a launcher can pick, for any width, is in the sets above."""
    widths = list(range(1, 20000, 37)) + [2**k for k in range(18)] + [2**k + 1 for k in range(18)]
    for config, covered in (
        (lambda w: norm_config(w, False), NORM_WIDTHS), (lambda w: norm_config(w, True), NORM_WIDTHS),
        (cross_entropy_config, CE_WIDTHS), (launch_config, SOFTMAX_WIDTHS),
    ):  # fmt: skip
        assert {config(w) for w in widths} <= {config(w) for w in covered}
    assert list(itertools.chain(_norm_cases(), _cross_entropy_cases(), _softmax_cases()))
