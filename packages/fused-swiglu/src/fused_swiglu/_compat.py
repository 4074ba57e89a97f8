"""Every Triton- and torch-version difference this package meets, in one place.

Kernels: one code path for every Triton from 2.2 on. Its builtins (tl.dot with acc/out_dtype/
allow_tf32, tl.static_range, tl.debug_barrier, tl.where, autotune restore_value and
early_config_prune, jit do_not_specialize) exist in 2.2 and 3.x alike; on an H100, Triton 3.x
pipelines its pointer loads with cp.async into wgmma (checked in the sm_90 PTX of compiles with
aligned operands: one wgmma group in flight per main-loop step, no spills at the configs kept,
except the pointer forward's 24 bytes at 128x128).

Hopper fast path, chosen here: the forward kernel in a persistent variant whose x and weight
tiles come by TMA through host tensor descriptors (Triton >= 3.4, for the descriptors; sm_90;
16-bit operands whose rows are unit-stride with 16-byte aligned
strides and base, which the launcher checks per call; everything else takes the portable
kernel). Why the forward: its two accumulators put the pointer kernel at ptxas' 255-register
limit with spills at 128x128 (the addresses of three operand tiles); the TMA variant compiles to
186 registers and no spills (cuobjdump, sm_90, Triton 3.9). Its tile loop is not flattened (a
flattened one runs slower on an H100, Triton 3.6), so the next tile's loads wait for the epilogue.
The weight-gradient and down-projection backward kernels have TMA variants too; the backward
kernels compile at 102-228 registers without spills on the pointer path.
"""

from __future__ import annotations

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

# tl.dot(..., input_precision=...) (Triton >= 3.0) states an fp32 dot's precision outright; Triton
# 2.2 has only allow_tf32. (On 3.x, allow_tf32=False yields to a TRITON_F32_DEFAULT setting.)
HAS_INPUT_PRECISION = TRITON_VERSION >= (3, 0)


# Autotuning times each config over ~40 ms after 10 ms of warm-up (Triton's default: 25 + 100 ms):
# every config still runs ~40 times at the headline size (~1 ms a call), and a new problem size
# costs a third of the time. Triton >= 3.1 takes a do_bench callable; older versions warmup/rep.
def _autotune_bench(kernel_call, quantiles):
    return triton.testing.do_bench(kernel_call, warmup=10, rep=40, quantiles=quantiles)


AUTOTUNE_TIMING = {"do_bench": _autotune_bench} if TRITON_VERSION >= (3, 1) else {"warmup": 10, "rep": 40}

# autocast decorators for autograd Functions: torch.amp.custom_fwd (torch >= 2.4) or the older
# torch.cuda.amp one (torch 2.2, the pair of Triton 2.2).
if hasattr(torch.amp, "custom_fwd"):
    custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
    custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - torch < 2.4
    custom_fwd = torch.cuda.amp.custom_fwd
    custom_bwd = torch.cuda.amp.custom_bwd


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast computes matmuls in on `device_type`, or None where autocast is off."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    if device_type == "cuda":  # pragma: no cover - torch < 2.4
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    if device_type == "cpu":  # pragma: no cover - torch < 2.4
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return None  # pragma: no cover


# Host-side TMA descriptors (triton.tools.tensor_descriptor, Triton >= 3.4), compiled kernels only:
# the Hopper forward and input-gradient kernels.
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton < 3.4
    TensorDescriptor = None
HOPPER_TMA = TensorDescriptor is not None and TRITON_VERSION >= (3, 4) and not INTERPRETING


@functools.cache
def is_hopper(device_index: Optional[int]) -> bool:
    """sm_90 (H100/H200), where the TMA forward runs."""
    return torch.cuda.get_device_capability(device_index)[0] == 9


# Programs that run at once when interpreting: small, so that the CPU tests' few tiles still
# leave a partial last wave and take the weight gradient's split path (ops/launchers.py).
INTERPRETER_MULTIPROCESSORS = 5


@functools.cache
def _multiprocessors(device_index: Optional[int]) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (132 on an H100 SXM); the interpreter's stand-in on the CPU."""
    if INTERPRETING:
        return INTERPRETER_MULTIPROCESSORS
    return _multiprocessors(device.index)


# torch.compile: where torch has torch.library.custom_op (>= 2.4), the launchers are registered as
# custom ops with fake implementations, so that torch.compile(fullgraph=True) sees one opaque node
# per launch instead of breaking the graph. Older torch calls the launchers directly.
HAS_CUSTOM_OP = hasattr(torch.library, "custom_op")


def library_op(name: str, mutates_args: tuple = ()):
    """Decorator: `fn` as the custom op fused_swiglu::`name` (torch >= 2.4), else `fn` itself.

    Either way the result has `.register_fake(fake_fn)`; on older torch it does nothing. Eager
    calls go straight to `fn` (no dispatcher on the hot path); `torch.compile` traces the op.
    """

    def wrap(fn):
        if not HAS_CUSTOM_OP:  # pragma: no cover - torch < 2.4
            fn.register_fake = lambda fake: fake
            return fn
        op = torch.library.custom_op(f"fused_swiglu::{name}", mutates_args=mutates_args)(fn)

        @functools.wraps(fn)
        def call(*args):
            if torch.compiler.is_compiling():
                return op(*args)
            return fn(*args)

        call.register_fake = op.register_fake
        call.op = op
        return call

    return wrap


# Direct launches (Triton 3.4 to 3.9, compiled; see ops/direct.py): after a launch through the
# autotuner and the JIT, later launches of the same specialization call the compiled kernel's
# launcher itself, as torch Inductor does. Its signature in these versions: (grid x, y, z,
# stream, function, packed metadata, launch metadata, enter hook, exit hook, *every kernel
# argument), constexprs included, TMA descriptors as host TensorDescriptor objects (the launcher
# encodes them). Outside these versions the JIT runs every launch.
DIRECT_LAUNCH = not INTERPRETING and (3, 4) <= TRITON_VERSION <= (3, 9)


def _hook_active(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def direct_launcher(compiled) -> Optional[Callable]:
    """launch(grid, args) -> bool for a kernel the JIT compiled and launched, or None.

    It launches `compiled` on the current stream with `args` (every kernel argument in order,
    constexprs included) over `grid` (1 to 3 dims) and returns True; or launches nothing and
    returns False (the caller then goes through the JIT) when the current device is not the one
    the kernel was loaded on, or a launch hook is installed (a profiler wants the launch metadata
    the JIT computes).
    """
    if not DIRECT_LAUNCH or compiled is None:
        return None
    run = getattr(compiled, "run", None)
    function = getattr(compiled, "function", None)
    metadata = getattr(compiled, "packed_metadata", None)
    if run is None or function is None or metadata is None:
        return None
    runtime = triton.knobs.runtime
    get_device = torch._C._cuda_getDevice
    get_stream = torch._C._cuda_getCurrentRawStream
    device = get_device()

    def launch(grid, args) -> bool:
        if get_device() != device or _hook_active(runtime.launch_enter_hook) or _hook_active(runtime.launch_exit_hook):
            return False
        x, y, z = (*grid, 1, 1)[:3]
        run(x, y, z, get_stream(device), function, metadata, None, None, None, *args)
        return True

    return launch
