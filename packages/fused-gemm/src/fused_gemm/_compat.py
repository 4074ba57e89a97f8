"""Every Triton-, torch- and device-version difference this package meets, in one place."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Optional

import torch
import triton
import triton.testing

TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])

# Triton decides at decoration time whether @triton.jit kernels are interpreted; so do we.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Interpreted kernels take CPU tensors; compiled kernels take CUDA tensors.
KERNEL_DEVICE_TYPE = "cpu" if INTERPRETING else "cuda"

# Host-side tensor descriptors (TMA) arrived in Triton 3.4 as triton.tools.tensor_descriptor; the
# persistent TMA kernel needs them. Triton 2.2 (and 3.0-3.3) run the portable kernel only.
try:  # pragma: no cover - depends on the installed Triton
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton < 3.4
    TensorDescriptor = None
HAS_TENSOR_DESCRIPTORS = TensorDescriptor is not None and TRITON_VERSION >= (3, 4)
# The descriptor's optional fields and their defaults in this Triton (3.4: padding; later also
# round_f32_to_tf32), for tensor_descriptor below.
_DESCRIPTOR_DEFAULTS = (
    {f.name: f.default for f in dataclasses.fields(TensorDescriptor) if f.default is not dataclasses.MISSING}
    if TensorDescriptor is not None
    else {}
)


def tensor_descriptor(base: torch.Tensor, shape, strides, block_shape):
    """triton.tools.tensor_descriptor.TensorDescriptor(base, shape, strides, block_shape), built
    without its __post_init__ (assertions only, in every version that has it: about a microsecond
    a descriptor, four per launch): the launcher checked alignment and strides once per problem."""
    desc = object.__new__(TensorDescriptor)
    desc.__dict__.update(_DESCRIPTOR_DEFAULTS, base=base, shape=shape, strides=strides, block_shape=block_shape)
    return desc


# Autotuning times each candidate config over ~40 ms of repetitions after ~10 ms of warm-up
# (Triton's defaults: 100 and 25), so a new problem size costs less to tune, while a GEMM of a
# millisecond is still timed ~40 times. Triton >= 3.1 takes a do_bench callable; older versions
# take warmup / rep.
def _autotune_bench(kernel_call, quantiles):
    return triton.testing.do_bench(kernel_call, warmup=10, rep=40, quantiles=quantiles)


AUTOTUNE_TIMING = {"do_bench": _autotune_bench} if TRITON_VERSION >= (3, 1) else {"warmup": 10, "rep": 40}


def _launch_errors() -> tuple:
    """What a config that does not fit the GPU raises at its first launch (too much shared memory,
    registers, a failed ptxas or static assertion), as Triton's autotuner skips it."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime import errors

    return tuple(
        error
        for error in (
            getattr(errors, "OutOfResources", None),
            getattr(errors, "PTXASError", None),
            CompileTimeAssertionFailure,
        )  # fmt: skip
        if error is not None
    )


LAUNCH_ERRORS = _launch_errors()


def config_launch_kwargs(config: triton.Config) -> dict:
    """The keywords the autotuner launches `config` with (meta-parameters and compile options), so
    that a direct launch with them finds the kernel it compiled: Config.all_kwargs (Triton >= 3.0)
    or, on Triton 2.2, the meta-parameters with num_warps and num_stages."""
    if hasattr(config, "all_kwargs"):
        return config.all_kwargs()
    return dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)  # pragma: no cover


# Programs of the persistent kernel when interpreting: a few, so that each runs several tiles.
INTERPRETER_PROGRAMS = 3

# autocast decorators for autograd Functions: torch.amp.custom_fwd (torch >= 2.4) or the older
# torch.cuda.amp one (torch 2.2, the pair of Triton 2.2).
if hasattr(torch.amp, "custom_fwd"):
    custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
    _torch_custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - torch < 2.4
    custom_fwd = torch.cuda.amp.custom_fwd
    _torch_custom_bwd = torch.cuda.amp.custom_bwd

# True while torch.compile traces (torch >= 2.3 spells it torch.compiler.is_compiling; older
# torch cannot trace these Functions without a graph break, so it always runs them eagerly).
is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def custom_bwd(bwd: Callable) -> Callable:
    """torch's custom_bwd (the backward runs under the forward's autocast state), entered only
    when the forward ran under autocast (or while torch.compile traces).

    torch's decorator enters an autocast context on every call; with autocast off in the forward
    that context only disables autocast, which this backward (allocations and Triton launches,
    nothing autocast changes) does not need.
    """
    with_autocast = _torch_custom_bwd(bwd)

    @functools.wraps(bwd)
    def call(ctx, *grads):
        if getattr(ctx, "_fwd_used_autocast", True) or is_compiling():
            return with_autocast(ctx, *grads)
        return bwd(ctx, *grads)

    return call


# torch.library.custom_op (torch >= 2.4): the launchers become opaque ops with fake
# implementations, so torch.compile(fullgraph=True) traces through matmul/bmm without a break.
HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_fake")


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast casts matmuls to on `device_type`, or None where autocast is off."""
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cuda":  # pragma: no cover - torch < 2.4
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None


def tf32_allowed_by_torch() -> bool:
    """torch's global opt-in to TF32 matmuls (torch.backends.cuda.matmul.allow_tf32)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


@functools.cache
def _properties_of(index: int):
    return torch.cuda.get_device_properties(index)


def _device_properties(device: torch.device):
    return _properties_of(device.index if device.index is not None else torch.cuda.current_device())


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device`: the persistent kernel launches one program per SM."""
    if INTERPRETING:
        return INTERPRETER_PROGRAMS
    return _device_properties(device).multi_processor_count


# The H100's opt-in shared memory per block, for torch builds whose device properties lack it
# (a config that still does not fit fails to launch, and the autotuner skips it).
H100_SHARED_MEMORY_PER_BLOCK = 227 * 1024


def max_shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one block may use on `device` (the opt-in maximum)."""
    if INTERPRETING:
        return H100_SHARED_MEMORY_PER_BLOCK
    return getattr(_device_properties(device), "shared_memory_per_block_optin", None) or H100_SHARED_MEMORY_PER_BLOCK


# Direct launches (Triton 3.4 to 3.9, compiled): after a plan's first launch through the JIT, the
# plan calls the compiled kernel's launcher itself, as torch Inductor does, skipping the JIT's
# per-call argument binding, specialization and cache lookup (the plan's key fixes every
# specialization: dtypes, strides, sizes that are specialized, 16-byte alignment). The launcher's
# signature is (grid x, y, z, stream, function, packed metadata, launch metadata, enter hook,
# exit hook, *every kernel argument), constexprs included, in these versions; outside them the
# JIT runs every launch.
DIRECT_LAUNCH = not INTERPRETING and (3, 4) <= TRITON_VERSION <= (3, 9)


def _hook_active(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def direct_launcher(compiled) -> Optional[Callable]:
    """launch(grid, args) -> bool for a kernel the JIT compiled and launched, or None.

    It launches `compiled` over `grid` (all three dims) on the current stream with every kernel
    argument `args` and returns True; or launches nothing and returns False (the caller then goes
    through the JIT) when the current device is not the one the kernel was loaded on, or a launch
    hook is installed (a profiler wants the launch metadata the JIT computes).
    """
    if not DIRECT_LAUNCH or compiled is None:
        return None
    run = getattr(compiled, "run", None)
    function = getattr(compiled, "function", None)
    metadata = getattr(compiled, "packed_metadata", None)
    knobs = getattr(triton, "knobs", None)
    if run is None or function is None or metadata is None or knobs is None:
        return None
    runtime = knobs.runtime
    device = torch._C._cuda_getDevice()
    get_device = torch._C._cuda_getDevice
    get_stream = torch._C._cuda_getCurrentRawStream

    def launch(grid, args) -> bool:
        if get_device() != device or _hook_active(runtime.launch_enter_hook) or _hook_active(runtime.launch_exit_hook):
            return False
        run(grid[0], grid[1], grid[2], get_stream(device), function, metadata, None, None, None, *args)
        return True

    return launch


def _has_gluon_ws() -> bool:
    """kernels.matmul_ws is written against Triton 3.6's Gluon API (later versions renamed its TMA
    copies, earlier ones lack warp specialization on Hopper); elsewhere the TMA kernel runs every
    product. Never under the interpreter (Gluon has none)."""
    if INTERPRETING or TRITON_VERSION != (3, 6):
        return False
    try:  # pragma: no cover - depends on the installed Triton
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


HAS_GLUON_WS = _has_gluon_ws()


def supports_tma(device: torch.device) -> bool:
    """The persistent TMA kernel runs here: Triton has tensor descriptors and the GPU is a Hopper (sm_90).

    Its configs are sized for Hopper's 228 KB of shared memory per SM; other GPUs run the portable
    kernel. Under the interpreter (Triton >= 3.4) the descriptors are emulated, so it is tested too.
    """
    if not HAS_TENSOR_DESCRIPTORS:
        return False
    if INTERPRETING:
        return True
    return _device_properties(device).major == 9
