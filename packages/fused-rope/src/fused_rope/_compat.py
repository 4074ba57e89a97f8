"""Every Triton- and torch-version difference this package meets, in one place."""

from __future__ import annotations

import functools
import inspect
import os
from typing import Callable

import torch
import triton

TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])

# Triton decides at decoration time whether @triton.jit kernels are interpreted; so do we.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Interpreted kernels take CPU tensors; compiled kernels take CUDA tensors.
KERNEL_DEVICE_TYPE = "cpu" if INTERPRETING else "cuda"

# autocast decorators for autograd Functions: torch.amp.custom_fwd (torch >= 2.4) or the older
# torch.cuda.amp one (torch 2.2, the pair of Triton 2.2).
if hasattr(torch.amp, "custom_fwd"):
    custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
    _torch_custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - torch < 2.4
    custom_fwd = torch.cuda.amp.custom_fwd
    _torch_custom_bwd = torch.cuda.amp.custom_bwd


def custom_bwd(bwd: Callable) -> Callable:
    """torch's custom_bwd (the backward runs under the forward's autocast state), entered only
    when the forward ran under autocast.

    torch's decorator enters an autocast context on every call (about half a Function.apply
    on the host); with autocast off in the forward that context only disables autocast,
    which these backwards (output allocations and Triton launches, nothing autocast changes)
    do not need. Under autocast, or while torch.compile traces, torch's decorator runs as is.
    """
    with_autocast = _torch_custom_bwd(bwd)

    @functools.wraps(bwd)
    def call(ctx, *grads):
        if is_compiling() or ctx._fwd_used_autocast:
            return with_autocast(ctx, *grads)
        return bwd(ctx, *grads)

    return call


# True while torch.compile traces (torch >= 2.3 spells it torch.compiler.is_compiling; older
# torch cannot trace these Functions without a graph break, so it always runs them eagerly).
is_compiling = getattr(torch.compiler, "is_compiling", None) or (lambda: False)

# torch.library.custom_op (torch >= 2.4) makes a launcher an operator that torch.compile treats
# as opaque (its fake implementation gives the output's metadata), so fullgraph=True traces
# through the autograd Functions without a graph break. Older torch calls the launchers directly.
HAS_CUSTOM_OP = hasattr(torch.library, "custom_op")


def custom_op(name: str, fake: Callable, mutates_args: tuple = ()) -> Callable[[Callable], Callable]:
    """Decorator: register `fn` as the operator `name` (fake implementation `fake`).

    The decorated function calls the operator while torch.compile traces, and `fn` itself in
    eager mode: the dispatcher costs several microseconds a call, which small launches feel.
    Eagerly, the version counters of the mutated arguments are bumped as the operator would.
    The operator is the wrapper's `.op`. Without torch.library.custom_op, `fn` is returned.
    """

    def register(fn: Callable) -> Callable:
        if not HAS_CUSTOM_OP:  # pragma: no cover - torch < 2.4
            return fn
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        op.register_fake(fake)
        mutated = [list(inspect.signature(fn).parameters).index(arg) for arg in mutates_args]

        @functools.wraps(fn)
        def call(*args):
            if is_compiling():
                return op(*args)
            out = fn(*args)
            for index in mutated:
                torch.autograd.graph.increment_version(args[index])
            return out

        call.op = op
        return call

    return register


# tl.split / tl.join (Triton >= 3.0): interleaved pairs are separated in registers.
HAS_SPLIT_JOIN = TRITON_VERSION >= (3, 0)


# Direct launches (Triton 3.4 to 3.9, compiled): after a call's first launch through the JIT,
# later launches with the same specialization call the compiled kernel's launcher itself, as
# torch Inductor does, skipping the JIT's per-call argument binding, specialization and cache
# lookup (a few tens of microseconds on the host, as long as the whole forward kernel of a
# small RoPE). The launcher's signature is (grid x, y, z, stream, function, packed metadata,
# launch metadata, enter hook, exit hook, *every kernel argument), constexprs included, in these
# versions; outside them the JIT runs every launch.
DIRECT_LAUNCH = not INTERPRETING and (3, 4) <= TRITON_VERSION <= (3, 9)


def _hook_active(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def direct_launcher(compiled) -> Callable | None:
    """launch(grid, args) -> bool for a kernel the JIT compiled and launched, or None.

    It launches `compiled` on the current stream with `args` (every kernel argument in order,
    constexprs included) over the 2-D `grid` and returns True; or launches nothing and returns
    False (the caller then goes through the JIT) when the current device is not the one the
    kernel was loaded on, or a launch hook is installed (a profiler wants the launch metadata
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
        run(grid[0], grid[1], 1, get_stream(device), function, metadata, None, None, None, *args)
        return True

    return launch
