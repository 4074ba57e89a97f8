"""Every Triton- and torch-version difference the kernel packages meet, and device facts.

Nothing here touches a GPU at import time: device properties are read, and cached, on first use.
"""

from __future__ import annotations

import dataclasses
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

# autocast decorators for autograd Functions: torch.amp's (torch >= 2.4) or the older torch.cuda.amp ones
# (torch 2.2, the pair of Triton 2.2).
if hasattr(torch.amp, "custom_fwd"):
    _torch_custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
    _torch_custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - torch < 2.4
    _torch_custom_fwd = torch.cuda.amp.custom_fwd
    _torch_custom_bwd = torch.cuda.amp.custom_bwd

# True while torch.compile traces (torch >= 2.3 spells it torch.compiler.is_compiling; older torch
# cannot trace these Functions without a graph break, so it always runs them eagerly).
is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def _cuda_autocast_enabled() -> bool:
    try:
        return torch.is_autocast_enabled("cuda")
    except TypeError:  # pragma: no cover - torch < 2.4 takes no device (CUDA)
        return torch.is_autocast_enabled()


def custom_fwd(fwd: Callable) -> Callable:
    """torch's custom_fwd (records the autocast state for custom_bwd), entered only when autocast
    is on or torch.compile traces; otherwise the same record is made directly, which saves most
    of the decorator's cost on a grad-enabled eager forward."""
    with_autocast = _torch_custom_fwd(fwd)

    @functools.wraps(fwd)
    def call(ctx, *args, **kwargs):
        if _cuda_autocast_enabled() or is_compiling():
            return with_autocast(ctx, *args, **kwargs)
        ctx._fwd_used_autocast = False
        ctx._dtype = None
        return fwd(ctx, *args, **kwargs)

    return call


def custom_bwd(bwd: Callable) -> Callable:
    """torch's custom_bwd (the backward runs under the forward's autocast state), entered only when
    the forward ran under autocast or torch.compile traces.

    torch's decorator enters an autocast context on every call, a sizeable part of a small
    backward's host time; with autocast off in the forward that context only keeps autocast off,
    which backwards made of allocations and Triton launches do not need.
    """
    with_autocast = _torch_custom_bwd(bwd)

    @functools.wraps(bwd)
    def call(ctx, *grads):
        if getattr(ctx, "_fwd_used_autocast", True) or is_compiling():
            return with_autocast(ctx, *grads)
        return bwd(ctx, *grads)

    return call


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast casts to on `device_type`, or None when autocast is off there (or the
    device is one the kernels never run on, such as meta)."""
    if device_type not in ("cuda", "cpu"):
        return None
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cuda":  # pragma: no cover - torch < 2.4
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None  # pragma: no cover


def mark_modified(tensor: torch.Tensor) -> None:
    """Bump the autograd version counter of a tensor written in place behind autograd's back, so
    that any backward which saved it raises instead of reading overwritten values."""
    if hasattr(torch.autograd.graph, "increment_version"):
        torch.autograd.graph.increment_version(tensor)


# torch.library.custom_op (torch >= 2.4): launchers become opaque operators with fake
# implementations, so torch.compile(fullgraph=True) traces through the autograd Functions.
HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")


# Host-side TMA tensor descriptors (Triton >= 3.4).
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton < 3.4
    TensorDescriptor = None
HAS_TENSOR_DESCRIPTORS = TensorDescriptor is not None and TRITON_VERSION >= (3, 4)
_DESCRIPTOR_DEFAULTS = (
    {f.name: f.default for f in dataclasses.fields(TensorDescriptor) if f.default is not dataclasses.MISSING}
    if TensorDescriptor is not None
    else {}
)


def _has_gluon_hopper() -> bool:
    """Gluon's Hopper API as this project's Gluon kernels are written against it: Triton 3.6 (later
    versions renamed its TMA copies, earlier ones lack parts of it). Never under the interpreter,
    which cannot run Gluon."""
    if INTERPRETING or TRITON_VERSION != (3, 6):
        return False
    try:  # pragma: no cover - depends on the installed Triton
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


HAS_GLUON_HOPPER = _has_gluon_hopper()


def tensor_descriptor(base: torch.Tensor, shape, strides, block_shape):
    """TensorDescriptor(base, shape, strides, block_shape) without its __post_init__ (assertions
    only, a microsecond each): the caller checked alignment and strides once per plan."""
    desc = object.__new__(TensorDescriptor)
    desc.__dict__.update(_DESCRIPTOR_DEFAULTS, base=base, shape=shape, strides=strides, block_shape=block_shape)
    return desc


def gluon_descriptor_template(shape, strides, block_shape, dtype: torch.dtype):
    """A Gluon TMA descriptor (HAS_GLUON_HOPPER only) of a view of `shape` and `strides` in blocks
    of `block_shape`, fp16/bf16 with Gluon's default NVMMA shared layout, and no base: a plan makes
    it once and descriptor_like puts each call's tensor in (the plan checked alignment and strides)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    element = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}[dtype]
    layout = gl.NVMMASharedLayout.get_default_for(list(block_shape), element)
    desc = object.__new__(GluonTensorDescriptor)
    desc.__dict__.update(base=None, shape=list(shape), strides=list(strides), block_shape=list(block_shape),
                         layout=layout, padding="zero")  # fmt: skip
    return desc


def descriptor_like(template, tensor: torch.Tensor):
    """A descriptor with `template`'s shape, strides and block over `tensor`'s data (same checks)."""
    desc = object.__new__(type(template))
    desc.__dict__.update(template.__dict__)
    desc.base = tensor
    return desc


def _autotune_bench(kernel_call, quantiles):
    return triton.testing.do_bench(kernel_call, warmup=10, rep=40, quantiles=quantiles)


# Autotuning times each candidate over ~40 ms after ~10 ms of warm-up (Triton's defaults: 100 and
# 25), so a new problem size costs less to tune. Triton >= 3.1 takes a do_bench callable.
AUTOTUNE_TIMING = {"do_bench": _autotune_bench} if TRITON_VERSION >= (3, 1) else {"warmup": 10, "rep": 40}


def _launch_errors() -> tuple:
    """What a config that does not fit the GPU raises at its first launch (too much shared memory,
    registers, a failed ptxas or static assertion), as Triton's autotuner skips it."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime import errors

    found = (getattr(errors, "OutOfResources", None), getattr(errors, "PTXASError", None), CompileTimeAssertionFailure)
    return tuple(error for error in found if error is not None)


LAUNCH_ERRORS = _launch_errors()


def config_launch_kwargs(config: triton.Config) -> dict:
    """The keywords a triton.Config launches with (meta-parameters and compile options)."""
    if hasattr(config, "all_kwargs"):
        return config.all_kwargs()
    return dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)  # pragma: no cover


# Streaming multiprocessors reported while interpreting: a few, so that persistent kernels still
# loop over several tiles per program in CPU tests.
INTERPRETER_MULTIPROCESSORS = 3


@functools.cache
def device_properties(index: int):
    return torch.cuda.get_device_properties(index)


def device_index(device: Optional[torch.device] = None) -> int:
    """The CUDA device index of `device` (the current device when None or index-less)."""
    if device is not None and device.index is not None:
        return device.index
    return torch.cuda.current_device()


def multiprocessor_count(device: Optional[torch.device] = None) -> int:
    """SMs of `device` (the current CUDA device when None); a few when interpreting."""
    if INTERPRETING:
        return INTERPRETER_MULTIPROCESSORS
    return device_properties(device_index(device)).multi_processor_count


def device_capability(device: Optional[torch.device] = None) -> tuple:
    """(major, minor) compute capability of `device`; (0, 0) when interpreting."""
    if INTERPRETING:
        return (0, 0)
    props = device_properties(device_index(device))
    return (props.major, props.minor)


# Hopper's opt-in shared memory per block, for torch builds whose device properties lack it.
HOPPER_SHARED_MEMORY_PER_BLOCK = 227 * 1024


def max_shared_memory(device: Optional[torch.device] = None) -> int:
    """Bytes of shared memory one block may use on `device` (the opt-in maximum)."""
    if INTERPRETING:
        return HOPPER_SHARED_MEMORY_PER_BLOCK
    props = device_properties(device_index(device))
    return getattr(props, "shared_memory_per_block_optin", None) or HOPPER_SHARED_MEMORY_PER_BLOCK
