"""Every Triton- and torch-version difference this package meets, in one place.

Nothing here touches a GPU at import time: device properties are read (and cached) on the
first launch, through `device_capability`.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Optional

import torch
import triton

TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])

# Triton decides at decoration time whether @triton.jit kernels are interpreted; so do we.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Interpreted kernels take CPU tensors; compiled kernels take CUDA tensors.
KERNEL_DEVICE_TYPE = "cpu" if INTERPRETING else "cuda"

# The interpreter computes bf16 arithmetic and bf16/fp16 tl.dot on raw bits: kernels upcast their
# dot operands to fp32 when interpreting (a constexpr, so compiled kernels never see the branch).
UPCAST_DOTS = INTERPRETING

# Host-side TMA tensor descriptors (Triton >= 3.4): on Hopper (sm_90+) the fully visible K/V tiles
# (Q/dO in the dK/dV kernel) are copied by the tensor memory accelerator into shared memory,
# multi-buffered with mbarriers, instead of per-thread pointer loads. Not used here: automatic warp
# specialization (`tl.range(..., warp_specialize=True)`): Triton 3.6 and 3.9 leave the attention
# loop unpartitioned on sm_90 at 8 warps and fail to compile it at 4 (checked ahead of time), so
# it cannot pay; and persistent scheduling, which without warp specialization only replaces the
# hardware block scheduler (the grids walk the longest causal rows first instead).
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton < 3.4
    TensorDescriptor = None
HAS_TENSOR_DESCRIPTOR = TensorDescriptor is not None

# torch.library.custom_op (torch >= 2.4): the launchers become custom ops with fake
# implementations and registered autograd, so torch.compile(fullgraph=True) traces through.
HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")

# autocast decorators for autograd Functions: torch.amp.custom_fwd (torch >= 2.4) or the older
# torch.cuda.amp one (torch 2.2, the pair of Triton 2.2).
if hasattr(torch.amp, "custom_fwd"):
    custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
    _torch_custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - torch < 2.4
    custom_fwd = torch.cuda.amp.custom_fwd
    _torch_custom_bwd = torch.cuda.amp.custom_bwd

# True while torch.compile traces (torch >= 2.3 spells it torch.compiler.is_compiling; older torch
# cannot trace these Functions without a graph break, so it always runs them eagerly).
is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def custom_bwd(bwd: Callable) -> Callable:
    """torch's custom_bwd (the backward runs under the forward's autocast state), entered only
    when the forward ran under autocast.

    torch's decorator enters an autocast context on every call (a sizeable part of a backward's
    host time); with autocast off in the forward that context only disables autocast, which
    these backwards (allocations and Triton launches) do not need. Under autocast, or while
    torch.compile traces, torch's decorator runs as is.
    """
    with_autocast = _torch_custom_bwd(bwd)

    @functools.wraps(bwd)
    def call(ctx, *grads):
        if ctx._fwd_used_autocast or is_compiling():
            return with_autocast(ctx, *grads)
        return bwd(ctx, *grads)

    return call


def autocast_dtype(device_type: str):
    """The dtype autocast casts to on `device_type`, or None when autocast is off there (or the
    device is one the kernels never run on, such as meta)."""
    if device_type not in ("cuda", "cpu"):
        return None
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4 takes no device argument (CUDA only)
        if device_type != "cuda":
            return None
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return torch.get_autocast_dtype(device_type) if enabled else None


@functools.cache
def device_capability(index: int) -> tuple:
    """(major, minor) compute capability of CUDA device `index`; (0, 0) when interpreting."""
    if INTERPRETING:
        return (0, 0)
    return torch.cuda.get_device_capability(index)


# Direct launches (Triton 3.4 to 3.9, compiled): after a launch plan's first launch through the
# JIT, the plan calls the compiled kernel's launcher itself, as torch Inductor does, skipping the
# JIT's per-call argument binding, specialization and cache lookup (the plan's key already fixes
# every specialization: strides, sizes, dtypes, 16-byte alignment). The launcher's signature is
# (grid x, y, z, stream, function, packed metadata, launch metadata, enter hook, exit hook,
# *every kernel argument), constexprs included, in these versions; outside them the JIT runs
# every launch.
DIRECT_LAUNCH = not INTERPRETING and (3, 4) <= TRITON_VERSION <= (3, 9)


@functools.cache
def multiprocessor_count(index: int) -> int:
    """SMs of CUDA device `index`; 0 when interpreting."""
    if INTERPRETING:
        return 0
    return torch.cuda.get_device_properties(index).multi_processor_count


def current_device_index() -> Optional[int]:
    """The current CUDA device (what Triton's JIT compiles and launches for); None when interpreting."""
    if INTERPRETING:
        return None
    return torch._C._cuda_getDevice()


def _hook_active(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def direct_launcher(compiled) -> Optional[Callable]:
    """launch(grid, tensors, trailing) -> bool for a kernel the JIT compiled and launched, or None.

    It launches `compiled` over the 3-D `grid` on the current stream with the arguments tensors +
    trailing and returns True; or launches nothing and returns False (the caller then goes
    through the JIT) when the current device is not the one the kernel was loaded on, or a launch
    hook is installed (a profiler wants the launch metadata the JIT computes).
    """
    if not DIRECT_LAUNCH or compiled is None:
        return None
    run = getattr(compiled, "run", None)
    function = getattr(compiled, "function", None)
    metadata = getattr(compiled, "packed_metadata", None)
    if run is None or function is None or metadata is None:
        return None
    runtime = triton.knobs.runtime
    device = torch._C._cuda_getDevice()
    get_device = torch._C._cuda_getDevice
    get_stream = torch._C._cuda_getCurrentRawStream

    def launch(grid, tensors, trailing) -> bool:
        if get_device() != device or _hook_active(runtime.launch_enter_hook) or _hook_active(runtime.launch_exit_hook):
            return False
        run(grid[0], grid[1], grid[2], get_stream(device), function, metadata, None, None, None, *tensors, *trailing)
        return True

    return launch


def descriptor_like(template, tensor: torch.Tensor):
    """A TensorDescriptor of `template`'s shape, strides and block over `tensor`'s data.

    The launch plan made and validated `template` for tensors of this shape, strides and
    alignment; the copy skips the dataclass' validation (a sizeable host cost per launch).
    """
    desc = object.__new__(type(template))
    desc.__dict__.update(template.__dict__)
    desc.base = tensor
    return desc
