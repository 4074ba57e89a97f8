"""cross_entropy and CrossEntropyLoss against the float64 reference, forward and backward, every
option and dtype; NaN/inf and ignored rows as torch."""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import assert_close_to_reference
from tritonformer_testkit.dtypes import dtype_name

from fused_norm_xent import CrossEntropyLoss, _compat, cross_entropy
from fused_norm_xent.reference import cross_entropy_reference

pytestmark = [
    pytest.mark.kernels,
    # Interpreted kernels also evaluate the padding rows of a tile, whose sum of exponentials is 0.
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
]


def torch_twin(
    logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, lse_square_scale=0.0, softcap=0.0
):
    """F.cross_entropy plus the z-loss on low-precision logits, as PyTorch's CUDA kernels compute it:
    fp32 inside, results rounded to the logits' dtype. (Its CPU fp16 kernel accumulates the
    label-smoothing sum in fp16 and overflows to inf, which would leave no baseline at all.) The
    softcap, if any, in fp32 too (stricter than Gemma-2's cap in the logits' dtype)."""
    x = logits.float()
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    loss = F.cross_entropy(
        x, target.long(), ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )
    valid = target != ignore_index
    z_rows = torch.where(valid, lse_square_scale * torch.logsumexp(x, -1).square(), 0.0)
    z = {"none": z_rows, "sum": z_rows.sum(), "mean": z_rows.sum() / valid.sum()}[reduction]
    return (loss + z).to(logits.dtype), z.to(logits.dtype)


def check(helpers, logits, target, *, upstream=None, inplace=False, **options):
    """Loss, z-loss and the logits gradient against the reference; our allocations poisoned."""
    reduction = options.get("reduction", "mean")
    if upstream is None:
        shape = target.shape if reduction == "none" else ()
        upstream = torch.randn(shape, device=logits.device)
    (leaf,) = helpers.leaves(logits)

    def ours(x):
        # In place, the kernel writes into a copy (a non-leaf): the gradient reaches the leaf through it.
        return cross_entropy(x.clone() if inplace else x, target, return_z_loss=True, inplace_backward=inplace,
                             **options)  # fmt: skip

    (loss, z_loss), (grad,) = helpers.forward_backward(ours, [leaf], [upstream], poison=True)
    assert loss.dtype == logits.dtype and grad.dtype == logits.dtype and grad.shape == logits.shape
    (loss_ref, z_ref), (grad_ref,) = helpers.forward_backward(
        lambda x: cross_entropy_reference(x, target, **options), helpers.as_float64(leaf), [upstream.double()]
    )
    (loss_low, z_low), (grad_low,) = helpers.forward_backward(
        lambda x: torch_twin(x, target, **options), helpers.leaves(logits), [upstream]
    )
    helpers.assert_all_close(
        {"loss": (loss, loss_ref, loss_low), "z_loss": (z_loss, z_ref, z_low), "dlogits": (grad, grad_ref, grad_low)}
    )


def _inputs(n_rows, n_cols, dtype, device, ignored_every=4, scale=3.0):
    logits = (scale * torch.randn(n_rows, n_cols, device=device)).to(dtype)
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    target[::ignored_every] = -100
    return logits, target


# Every width and dtype, not their cross product (each pair compiles its own kernels on a GPU).
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
WIDTH_CASES = [(37, 1, FP32), (37, 1, BF16), (37, 127, FP16), (19, 1000, FP32), (19, 1000, BF16), (3, 4097, FP16)]


@pytest.mark.parametrize(
    "n_rows, n_cols, dtype", [pytest.param(*c, id=f"{c[0]}-{c[1]}-{dtype_name(c[2])}") for c in WIDTH_CASES]
)
def test_widths_dtypes(helpers, n_rows, n_cols, dtype, device):
    check(helpers, *_inputs(n_rows, n_cols, dtype, device), label_smoothing=0.1, lse_square_scale=1e-3)


@pytest.mark.parametrize("smoothing, z", [(0.0, 0.0), (0.2, 0.0), (0.0, 1e-2), (0.1, 1e-3)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reductions_and_options(helpers, reduction, smoothing, z, device):
    check(helpers, *_inputs(21, 300, torch.float32, device), reduction=reduction, label_smoothing=smoothing,
          lse_square_scale=z)  # fmt: skip


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_upstream_gradient_of_one(helpers, reduction, device):
    """loss.backward() hands the backward a 1: the scaling kernel then leaves the gradient as is."""
    check(helpers, *_inputs(10, 70, torch.float32, device), reduction=reduction, upstream=torch.tensor(1.0))


@pytest.mark.parametrize("dtype", [pytest.param(FP32, id="fp32"), pytest.param(BF16, id="bf16")])
def test_rows_wider_than_a_block(helpers, dtype, device):
    """20000 classes: three 8192-wide chunks per row, the online log-sum-exp across them."""
    check(helpers, *_inputs(3, 20000, dtype, device, ignored_every=3), label_smoothing=0.05, lse_square_scale=1e-4)


@pytest.mark.parametrize("n_cols", [100, 20000])
def test_loops_without_prefetch(helpers, monkeypatch, n_cols, device):
    """The loop shape used under Triton 2.2 (each chunk loaded where it is used) gives the same results."""
    monkeypatch.setattr(_compat, "PREFETCH_CHUNKS", False)
    check(helpers, *_inputs(5, n_cols, torch.bfloat16, device), label_smoothing=0.1, lse_square_scale=1e-3)
    check(helpers, *_inputs(5, n_cols, torch.float32, device), reduction="none")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_inplace_backward(helpers, reduction, device):
    check(helpers, *_inputs(9, 500, torch.bfloat16, device), reduction=reduction, inplace=True, label_smoothing=0.1)


def test_inplace_writes_the_gradient_into_the_logits(device):
    logits, target = _inputs(6, 50, torch.float32, device)
    (leaf,) = [logits.clone().requires_grad_(True)]
    buffer = leaf * 1.0
    cross_entropy(buffer, target, inplace_backward=True)
    expected = torch.autograd.grad(F.cross_entropy(leaf, target), leaf)[0]
    assert_close_to_reference(buffer.detach(), expected.double(), expected, name="logits buffer")
    other, saved = _inputs(2, 5, torch.float32, device)[0].requires_grad_(True), None
    saved = other.exp()  # exp saves its output: overwriting it in place must not go unnoticed
    cross_entropy(saved, torch.tensor([1, 2], device=device), inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_inplace_gradient_is_the_logits_buffer(reduction, device):
    """In place, a leaf's .grad is the logits buffer itself: autograd hands the gradient on
    without copying the (N, V) tensor."""
    logits, target = _inputs(6, 50, torch.float32, device)
    leaf = logits.clone().requires_grad_(True)
    loss = cross_entropy(leaf, target, reduction=reduction, inplace_backward=True)
    loss.sum().backward()
    assert leaf.grad.data_ptr() == leaf.data_ptr()
    expected_leaf = logits.double().requires_grad_(True)
    (expected,) = torch.autograd.grad(F.cross_entropy(expected_leaf, target, reduction=reduction).sum(), expected_leaf)
    low_leaf = logits.clone().requires_grad_(True)
    (low,) = torch.autograd.grad(F.cross_entropy(low_leaf, target, reduction=reduction).sum(), low_leaf)
    assert_close_to_reference(leaf.grad, expected, low, name="dlogits")


def test_non_contiguous_logits(helpers, device):
    logits, target = _inputs(8, 300, torch.float32, device)
    check(helpers, torch.randn(300, 8, device=device).t(), target, label_smoothing=0.1)  # column stride 8
    check(helpers, torch.randn(16, 600, device=device)[::2, ::2], target, reduction="none")
    check(helpers, torch.randn(8, 300, device=device).t().contiguous().t(), target, inplace=True)


@pytest.mark.parametrize("ignore_index", [-100, 0, 5])
def test_ignored_rows(helpers, ignore_index, device):
    logits, _ = _inputs(12, 40, torch.float32, device)
    target = torch.randint(0, 40, (12,), device=device)
    target[[0, 3, 4, 11]] = ignore_index
    for reduction in ("mean", "none"):
        check(helpers, logits, target, ignore_index=ignore_index, reduction=reduction, label_smoothing=0.1,
              lse_square_scale=1e-3)  # fmt: skip


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_rows_ignored(reduction, device):
    """The mean of nothing is 0 / 0 = NaN, as in torch; sum and none give zeros; gradients are 0."""
    logits = torch.randn(5, 30, device=device, requires_grad=True)
    target = torch.full((5,), -100, device=device)
    loss = cross_entropy(logits, target, reduction=reduction, label_smoothing=0.1)
    expected = F.cross_entropy(logits.detach(), target, reduction=reduction, label_smoothing=0.1)
    assert torch.equal(loss.isnan(), expected.isnan()) and (reduction == "mean") == bool(loss.isnan().all())
    assert_close_to_reference(loss.detach(), expected.double(), expected)
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    assert torch.equal(grad, torch.zeros_like(grad))


def test_empty_batch(device):
    logits = torch.randn(0, 10, device=device, requires_grad=True)
    target = torch.zeros(0, dtype=torch.int64, device=device)
    assert cross_entropy(logits, target).isnan() and cross_entropy(logits, target, reduction="sum") == 0
    assert cross_entropy(logits, target, reduction="none").shape == (0,)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("n_cols", [50, 20000])
def test_non_finite_logits_propagate_like_torch(smoothing, n_cols, device):
    logits = torch.randn(7, n_cols, device=device)
    logits[0, 1] = float("inf")  # + inf: NaN row
    logits[1, 2] = float("nan")
    logits[2, :] = -float("inf")  # all -inf: NaN row
    logits[3, 0] = -float("inf")  # -inf target logit: loss +inf
    logits[4, 5] = -float("inf")  # a -inf elsewhere: finite
    logits[5, 3] = float("nan")  # ignored row with a NaN: loss 0, gradient NaN (as torch)
    target = torch.tensor([1, 0, 0, 0, 1, -100, 2], device=device)
    leaf = logits.clone().requires_grad_(True)
    loss = cross_entropy(leaf, target, reduction="none", label_smoothing=smoothing)
    (grad,) = torch.autograd.grad(loss, leaf, torch.ones_like(loss))
    ref_leaf = logits.double().requires_grad_(True)
    expected = F.cross_entropy(ref_leaf, target, reduction="none", label_smoothing=smoothing)
    (expected_grad,) = torch.autograd.grad(expected, ref_leaf, torch.ones_like(expected))
    assert_close_to_reference(loss.detach(), expected.detach(), name="loss")
    assert_close_to_reference(grad, expected_grad, name="dlogits")


def test_int32_targets_and_unbatched_input(helpers, device):
    logits, target = _inputs(11, 90, torch.float32, device)
    check(helpers, logits, target.to(torch.int32), label_smoothing=0.1)
    one = torch.randn(90, device=device)
    for reduction in ("mean", "none"):
        ours = cross_entropy(one, torch.tensor(4, device=device), reduction=reduction)
        expected = F.cross_entropy(one.double(), torch.tensor(4, device=device), reduction=reduction)
        assert ours.shape == expected.shape == ()
        assert_close_to_reference(ours, expected, F.cross_entropy(one, torch.tensor(4, device=device)))


def test_module_is_a_drop_in(device):
    logits, target = _inputs(13, 64, torch.float32, device)
    target[target == 3] = 4
    for kwargs in ({}, {"reduction": "sum", "label_smoothing": 0.2}, {"ignore_index": 3, "reduction": "none"}):
        target = target.masked_fill(target == -100, 3) if kwargs.get("ignore_index") == 3 else target
        theirs = torch.nn.CrossEntropyLoss(**kwargs)
        expected = theirs(logits.double(), target)
        assert_close_to_reference(CrossEntropyLoss(**kwargs)(logits, target), expected, theirs(logits, target))
    loss, z_loss = CrossEntropyLoss(lse_square_scale=1e-2, return_z_loss=True)(logits, target)
    assert_close_to_reference(z_loss, cross_entropy_reference(logits, target, lse_square_scale=1e-2)[1])


# A covering set of (rows, cols, dtype, logit scale, softcap, options): every dtype and reduction,
# smoothing and z-loss, in place, odd widths, a multi-chunk row, the loops without prefetching;
# logit scales that put the logits / softcap on both sides of the kernel's polynomial/exp switch.
SOFTCAP_CASES = [
    (37, 301, FP32, 3.0, 5.0, dict(label_smoothing=0.1, lse_square_scale=1e-3)),
    (19, 127, FP16, 30.0, 30.0, dict(reduction="none", lse_square_scale=1e-2)),
    (13, 1000, BF16, 30.0, 30.0, dict(reduction="sum", label_smoothing=0.1, inplace=True)),
    (11, 33, FP32, 10.0, 2.0, dict(reduction="none", label_smoothing=0.2, inplace=True, ignore_index=0)),
    (3, 9000, BF16, 10.0, 15.0, dict(label_smoothing=0.05, lse_square_scale=1e-4)),
    (5, 333, FP16, 10.0, 7.0, dict(reduction="none", label_smoothing=0.1, prefetch=False)),
]


@pytest.mark.parametrize(
    "n_rows, n_cols, dtype, scale, softcap, options",
    [pytest.param(*c, id=f"{c[0]}-{c[1]}-{dtype_name(c[2])}-{c[5].get('reduction', 'mean')}") for c in SOFTCAP_CASES],
)
def test_softcap(helpers, monkeypatch, n_rows, n_cols, dtype, scale, softcap, options, device):
    """Loss, z-loss and gradient on softcap * tanh(logits / softcap), against the float64 reference."""
    options = dict(options)
    if not options.pop("prefetch", True):
        monkeypatch.setattr(_compat, "PREFETCH_CHUNKS", False)
    logits, target = _inputs(n_rows, n_cols, dtype, device, scale=scale)
    if "ignore_index" in options:
        target[target == -100] = options["ignore_index"]
    check(helpers, logits, target, softcap=softcap, **options)


@pytest.mark.parametrize("dtype", [pytest.param(FP32, id="fp32"), pytest.param(BF16, id="bf16")])
def test_softcap_saturated_logits(helpers, dtype, device):
    """Logits up to |1e4| (tanh saturates: the cap's derivative underflows to 0) and +-inf (capped at
    +-softcap, as the reference): finite losses and gradients, no NaN."""
    logits, target = _inputs(12, 200, dtype, device, ignored_every=5, scale=3e3)
    logits[0, :] = 1e4
    logits[1, 7], logits[2, 9] = float("inf"), -float("inf")
    logits[3, target[3]] = -1e4
    for reduction in ("mean", "none"):
        check(helpers, logits, target, reduction=reduction, softcap=30.0, label_smoothing=0.1, lse_square_scale=1e-3)
    loss = CrossEntropyLoss(reduction="none", softcap=30.0)(logits.requires_grad_(True), target)
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    assert loss.isfinite().all() and grad.isfinite().all()


def require_free_gpu_memory(gib: float) -> None:
    """Skip, saying how much is missing, when the GPU has less than `gib` GiB free."""
    free, total = (size / 2**30 for size in torch.cuda.mem_get_info())
    if free < gib:
        pytest.skip(f"needs {gib:.1f} GiB of free GPU memory; {torch.cuda.get_device_name()} has {free:.1f} of "
                    f"{total:.1f} GiB free")  # fmt: skip


@pytest.mark.gpu(reason="N * V past 2^31 elements: 4.3 GB of bf16 logits")
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_int64_offsets_past_2_31_elements(reduction):
    require_free_gpu_memory(4.5)  # the logits (their own gradient, in place) and a few rows of reference
    n_cols = 50304
    n_rows = 2**31 // n_cols + 8
    logits = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, n_cols, (n_rows,), device="cuda")
    tail = slice(n_rows - 4, n_rows)
    tail_logits = logits[tail].clone()
    leaf = logits.requires_grad_(True)
    buffer = leaf.detach().requires_grad_(True)
    loss = cross_entropy(buffer, target, reduction=reduction, inplace_backward=True)
    upstream = torch.ones_like(loss)
    (grad,) = torch.autograd.grad(loss, buffer, upstream)
    ref_leaf = tail_logits.double().requires_grad_(True)
    divisor = n_rows if reduction == "mean" else 1
    ref = cross_entropy_reference(ref_leaf, target[tail], reduction="none")[0]
    (ref_grad,) = torch.autograd.grad(ref.sum() / divisor, ref_leaf)
    low_leaf = tail_logits.clone().requires_grad_(True)
    low = F.cross_entropy(low_leaf, target[tail], reduction="none")
    (low_grad,) = torch.autograd.grad(low.sum() / divisor, low_leaf)
    if reduction == "none":
        assert_close_to_reference(loss[tail], ref, low, name="loss")
    assert_close_to_reference(grad[tail], ref_grad, low_grad, name="dlogits")


@pytest.mark.gpu(reason="N * V past 2^31 elements: 4.3 GB of bf16 logits and 4.3 GB of gradient")
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_int64_column_offsets_of_column_major_logits_past_2_31_elements(reduction):
    """(V, N).t() logits, N * V past 2^31: a row's last columns lie past 2^31 elements (column
    offset times a column stride of N), in the loss pass, the gradient pass and the scaling of the
    gradient by an upstream gradient other than 1; the gradient buffer is column-major too."""
    require_free_gpu_memory(12.0)  # logits, their gradient and float64 references of 4096 rows
    n_rows, n_cols = 2**16 + 5, 33000  # 2.16e9 elements: the columns from 32766 on lie past 2^31
    logits = torch.randn(n_cols, n_rows, device="cuda", dtype=torch.bfloat16).t()
    target = torch.randint(0, n_cols, (n_rows,), device="cuda")
    target[-3:] = n_cols - 1 - torch.arange(3, device="cuda")  # target logits past 2^31 elements as well
    target[1::7] = -100
    leaf = logits.requires_grad_(True)
    loss = cross_entropy(leaf, target, reduction=reduction)
    upstream = torch.randn_like(loss) if reduction == "none" else torch.tensor(0.5, device="cuda")
    (grad,) = torch.autograd.grad(loss, leaf, upstream)
    assert grad.stride() == logits.stride()
    rows = torch.tensor([0, 1, 2, n_rows // 2, n_rows - 3, n_rows - 2, n_rows - 1], device="cuda")
    divisor = 1 if reduction == "none" else int((target != -100).sum())
    some_logits, some_target = logits.detach()[rows], target[rows]
    ref_leaf = some_logits.double().requires_grad_(True)
    ref = cross_entropy_reference(ref_leaf, some_target, reduction="none")[0]
    row_upstream = upstream[rows] if reduction == "none" else upstream.expand(len(rows))
    (ref_grad,) = torch.autograd.grad(ref, ref_leaf, row_upstream.double() / divisor)
    low_leaf = some_logits.clone().requires_grad_(True)
    low = F.cross_entropy(low_leaf.float(), some_target, reduction="none")
    (low_grad,) = torch.autograd.grad(low, low_leaf, row_upstream / divisor)
    if reduction == "none":
        assert_close_to_reference(loss[rows], ref, low.to(loss.dtype), name="loss")
    else:  # the mean over every row, its references summed over blocks of rows
        ref_sum = low_sum = 0.0
        for start in range(0, n_rows, 4096):
            block, block_target = logits.detach()[start : start + 4096], target[start : start + 4096]
            ref_sum += cross_entropy_reference(block, block_target, reduction="sum")[0]
            low_sum += F.cross_entropy(block.float(), block_target, reduction="sum")
        assert_close_to_reference(loss, ref_sum / divisor, (low_sum / divisor).to(loss.dtype), name="loss")
    assert_close_to_reference(grad[rows], ref_grad, low_grad, name="dlogits")


@pytest.mark.gpu(reason="GPT-2 and 256k vocabularies are too wide for the interpreter")
@pytest.mark.parametrize(
    "shape, reduction",
    [((4096, 50257), "mean"), ((4096, 50257), "none"), ((64, 262144), "mean"), ((1000, 128256), "none")],
    ids=str,
)  # fmt: skip
def test_large_vocabularies(helpers, shape, reduction):
    check(helpers, *_inputs(*shape, torch.bfloat16, "cuda"), reduction=reduction, label_smoothing=0.1,
          lse_square_scale=1e-4)  # fmt: skip


@pytest.mark.gpu(reason="CUDA graphs need a CUDA device")
def test_forward_and_backward_capture_in_a_cuda_graph():
    """Under capture there is no host read (no label check): the step replays with the mean's
    divisor read on the device, as a CUDA-graph training step needs."""
    logits, target = _inputs(64, 1000, torch.float32, "cuda")
    leaf = logits.clone().requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile) outside the capture, as torch requires
        for _ in range(2):
            leaf.grad = None
            cross_entropy(leaf, target).backward()
    torch.cuda.current_stream().wait_stream(side)
    leaf.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = cross_entropy(leaf, target)
        loss.backward()
    target.copy_(_inputs(64, 1000, torch.float32, "cuda")[1])  # new labels, replayed
    graph.replay()
    torch.cuda.synchronize()
    ref_leaf = logits.double().requires_grad_(True)
    ref = F.cross_entropy(ref_leaf, target)
    (ref_grad,) = torch.autograd.grad(ref, ref_leaf)
    low_leaf = logits.clone().requires_grad_(True)
    low = F.cross_entropy(low_leaf, target)
    (low_grad,) = torch.autograd.grad(low, low_leaf)
    assert_close_to_reference(loss.detach(), ref.detach(), low.detach(), name="loss")
    assert_close_to_reference(leaf.grad, ref_grad, low_grad, name="dlogits")


def test_autocast_gives_an_fp32_loss(device):
    """As F.cross_entropy under autocast: the loss is fp32, the logits keep their dtype and
    gradient dtype (torch.autocast("cpu") takes the same path when interpreting)."""
    logits = torch.randn(8, 300, device=device, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 300, (8,), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = cross_entropy(logits, target)
        expected = F.cross_entropy(logits, target)
    loss.backward()
    assert loss.dtype == expected.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
