"""Launch: one kernel's launch as a plan fixes it, through the compiled kernel after the first call.

Triton's JIT spends tens of microseconds of host time on every launch (binding the arguments,
computing their specialization, hashing the cache key, building launch metadata), as long as a
small kernel runs on the GPU. A plan (what an op computes once per shape, stride and dtype key)
knows all of that in advance, so a Launch built by the plan does the JIT's work once per
specialization and then calls the compiled kernel's launcher itself, as torch Inductor does:

    launch = Launch(_norm_fwd_kernel, grid, stride_x_row=..., n_cols=..., BLOCK_N=..., num_warps=4)
    launch(x, w, y, rstd, n_rows)        # the parameters not fixed above, in signature order

The fixed arguments are given by name (ints, floats and constexprs the plan decided; a parameter
with a default takes it unless named); the others are given per call in signature order. Per call,
the only things the JIT would still specialize on are each tensor's dtype and 16-byte alignment
(and None), and the device: they key the table of compiled kernels. A per-call scalar must be
a parameter the kernel declares `do_not_specialize` (it then only specializes on its integer
width, which the key checks too); anything else the kernel specializes on belongs in the plan's
key and is fixed here.

Direct calls need Triton 3.4 to 3.9 (the compiled launcher's signature is known there), a
compiled kernel (not the interpreter), and no launch hooks installed (profilers want the
metadata the JIT computes); otherwise every call goes through the JIT, which is always correct.
The table is filled by whole entries only, so concurrent threads either find a complete entry or
compile through the JIT themselves.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Dict, Tuple

import torch
import triton

from .compat import INTERPRETING, TRITON_VERSION

DIRECT_LAUNCH = not INTERPRETING and (3, 4) <= TRITON_VERSION <= (3, 9) and hasattr(torch._C, "_cuda_getDevice")

_INTERPRETER_LOCK = threading.RLock()

# Compiled kernels kept per Launch before its table is cleared (alignments times devices).
MAX_ENTRIES = 64
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

if DIRECT_LAUNCH:
    _runtime_knobs = triton.knobs.runtime
    _current_device = torch._C._cuda_getDevice
    _current_stream = torch._C._cuda_getCurrentRawStream


def launch_options(config) -> dict:
    """The compile options of a triton.Config, as Launch takes them."""
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    for name in ("num_ctas", "maxnreg"):
        if getattr(config, name, None) is not None:
            options[name] = getattr(config, name)
    return options


def _make_context_current(device: int) -> None:
    """Make `device`'s primary CUDA context current on this thread: a stream query is a runtime
    call, and the runtime makes the context current before it answers. A stream being captured
    into a CUDA graph must not be queried, and a capturing thread has its context current."""
    if not torch.cuda.is_current_stream_capturing():
        torch.cuda.current_stream(device).query()


def _hooks_installed() -> bool:
    enter, leave = _runtime_knobs.launch_enter_hook, _runtime_knobs.launch_exit_hook
    return (enter is not None and bool(getattr(enter, "calls", True))) or (
        leave is not None and bool(getattr(leave, "calls", True))
    )


def _parameters(kernel) -> Tuple[Tuple[str, Any, bool], ...]:
    """(name, default or inspect.Parameter.empty, do_not_specialize) per parameter of `kernel`."""
    signature = inspect.signature(kernel.fn)
    params = getattr(kernel, "params", None)
    if params is not None:
        dns = [bool(getattr(p, "do_not_specialize", False)) for p in params]
    else:  # the interpreter's functions keep the decorator's keywords instead
        listed = getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize")
        listed = set(listed or ())
        dns = [i in listed or name in listed for i, name in enumerate(signature.parameters)]
    return tuple((p.name, p.default, dns[i]) for i, p in enumerate(signature.parameters.values()))


class Launch:
    """One kernel over one grid with its fixed arguments and compile options; call it with the rest."""

    __slots__ = ("kernel", "grid", "options", "_template", "_slots", "_tensor_slots", "_scalar_slots", "_prefix",
                 "_tail", "_compiled")  # fmt: skip

    def __init__(
        self, kernel, grid, *, num_warps: int = 4, num_stages: int = None, num_ctas: int = 1, maxnreg: int = None,
        enable_fp_fusion: bool = None, **fixed: Any,
    ) -> None:  # fmt: skip
        """kernel: a @triton.jit function; grid: 1 to 3 ints; the compile options; fixed: arguments by
        parameter name. `launch_options(config)` gives a triton.Config's compile options."""
        self.kernel = kernel
        self.grid = (*grid, 1, 1)[:3]
        self.options = {"num_warps": num_warps}
        optional = {"num_stages": num_stages, "maxnreg": maxnreg, "enable_fp_fusion": enable_fp_fusion}
        self.options.update({name: value for name, value in optional.items() if value is not None})
        if num_ctas != 1:
            self.options["num_ctas"] = num_ctas
        params = _parameters(kernel)
        unknown = set(fixed) - {name for name, _, _ in params}
        if unknown:
            raise TypeError(f"{kernel.fn.__name__} has no parameter {', '.join(sorted(unknown))}")
        template, slots, scalar_slots = [], [], []
        for index, (name, default, dns) in enumerate(params):
            if name in fixed:
                template.append(fixed[name])
            elif default is not inspect.Parameter.empty:
                template.append(default)
            else:
                template.append(None)
                if dns:
                    scalar_slots.append(len(slots))
                slots.append(index)
        self._template = template
        self._slots = tuple(slots)
        self._scalar_slots = tuple(scalar_slots)
        self._tensor_slots = tuple(i for i in range(len(slots)) if i not in scalar_slots)
        # Per-call arguments that lead the signature (pointers first, the usual order) join the
        # fixed tail by concatenation instead of a fill.
        self._prefix = self._slots == tuple(range(len(slots)))
        self._tail = tuple(template[len(slots) :]) if self._prefix else ()
        self._compiled: Dict[Tuple, Any] = {}

    def arguments(self, per_call: Tuple) -> Tuple:
        """Every kernel argument in signature order: the fixed ones with `per_call` in their slots."""
        if len(per_call) != len(self._slots):
            raise TypeError(f"{self.kernel.fn.__name__} launch takes {len(self._slots)} arguments, got {len(per_call)}")
        if self._prefix:
            return (*per_call, *self._tail)
        full = list(self._template)
        for slot, value in zip(self._slots, per_call):
            full[slot] = value
        return tuple(full)

    def __call__(self, *per_call) -> None:
        args = self.arguments(per_call)
        if not DIRECT_LAUNCH:
            if INTERPRETING:
                # The interpreter patches triton.language for the kernel it runs: one at a time.
                with _INTERPRETER_LOCK:
                    self.kernel[self.grid](*args, **self.options)
            else:
                self.kernel[self.grid](*args, **self.options)
            return
        key = self._key(per_call)
        entry = self._compiled.get(key)
        if entry is not None and not _hooks_installed():
            run, function, metadata = entry
            grid, stream = self.grid, _current_stream(key[0])
            try:
                run(grid[0], grid[1], grid[2], stream, function, metadata, None, None, None, *args)
            except RuntimeError:
                # A thread's first launch may find no CUDA context current (torch's caching allocator
                # need not have called the driver on it), which TMA descriptor arguments need: make
                # the device's context current and try once more; a real launch error raises again.
                _make_context_current(key[0])
                run(grid[0], grid[1], grid[2], stream, function, metadata, None, None, None, *args)
            return
        if key is not None:
            _make_context_current(key[0])
        compiled = self.kernel[self.grid](*args, **self.options)
        if entry is None and key is not None:
            self._keep(key, compiled)

    def _key(self, per_call: Tuple):
        """(device, per tensor its dtype and 16-byte alignment, per other argument what the JIT
        specializes it on); None where a do_not_specialize scalar needs 64 bits (the JIT then
        handles every such call)."""
        key = [_current_device()]
        for slot in self._tensor_slots:
            value = per_call[slot]
            if isinstance(value, torch.Tensor):
                key.append((value.dtype, value.data_ptr() & 15 == 0))
            else:
                key.append(_scalar_key(value))
        for slot in self._scalar_slots:
            value = per_call[slot]
            if isinstance(value, int) and not _INT32_MIN <= value <= _INT32_MAX:
                return None
        return tuple(key)

    def _keep(self, key: Tuple, compiled) -> None:
        run = getattr(compiled, "run", None)
        function = getattr(compiled, "function", None)
        metadata = getattr(compiled, "packed_metadata", None)
        if run is None or function is None or metadata is None:
            return
        if len(self._compiled) >= MAX_ENTRIES:
            self._compiled = {}
        self._compiled[key] = (run, function, metadata)


def _scalar_key(value):
    """What Triton specializes a per-call scalar on: an int's value being 1, its divisibility by 16
    and its width; a float's type; None as None."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, _INT32_MIN <= value <= _INT32_MAX)
    return type(value)
