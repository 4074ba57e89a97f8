"""Launches of an autotuned kernel that go through Triton's autotuner once per key, then directly.

Every launch of this package is one autotuned kernel, and Triton's autotuner plus its JIT spend
100-170 us of host time per launch on an H100 machine's host (the forward's launch takes 166 us
of a 290 us call at x 8192 x 1024 -> 3072, whose kernel takes 176 us), so small SwiGLUs would be
host-bound. A launch here passes the kernel's positional arguments and its flags.
The first launch with a given key goes through the autotuner (which tunes on a new problem) and
keeps the compiled kernel of the config it chose; later launches with that key fill in the
config's block sizes and the heuristics' values, run the config's pre-hook (the TMA descriptors'
block shapes) and call the compiled kernel directly (`_compat.direct_launcher`, Triton 3.4-3.9).

The key: every integer and flag by value, every tensor by dtype and 16-byte alignment, every TMA
descriptor by its base's dtype and alignment, shape and strides. What Triton specializes a
compile on and what the autotuner keys its choice on are functions of these. A kernel whose
config list is replaced (the tests pin one config by monkeypatching it) goes through the
autotuner again.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch
import triton
from triton.runtime.autotuner import Heuristics

from .._compat import DIRECT_LAUNCH, TensorDescriptor, direct_launcher

# Keys kept per kernel before the table is cleared (a training run meets a handful).
MAX_KEYS = 256


def _key_of(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if TensorDescriptor is not None and isinstance(arg, TensorDescriptor):
        return arg.base.dtype, arg.base.data_ptr() % 16 == 0, tuple(arg.shape), tuple(arg.strides)
    return arg


class TunedLaunches:
    """Launches of `tuner` (a triton.autotune kernel, over triton.heuristics or not)."""

    __slots__ = ("tuner", "names", "heuristics", "entries")

    def __init__(self, tuner) -> None:
        self.tuner = tuner
        self.heuristics: Dict[str, Callable] = {}
        fn = tuner.fn
        while isinstance(fn, Heuristics):
            self.heuristics.update(fn.values)
            fn = fn.fn
        self.names: Tuple[str, ...] = tuple(getattr(fn, "arg_names", ()))  # the JIT function's
        self.entries: Dict[Tuple[Any, ...], Tuple[Any, ...]] = {}

    def __call__(self, grid: Callable, *args: Any, **flags: Any) -> triton.Config:
        """Launches over grid(meta) and returns the config that ran."""
        if not DIRECT_LAUNCH:
            self.tuner[grid](*args, **flags)
            return self.tuner.best_config
        key = (*[_key_of(arg) for arg in args], *flags.items())
        entry = self.entries.get(key)
        if entry is not None and entry[0] is self.tuner.configs:
            _, config, launch, fixed = entry
            named = dict(zip(self.names, args))
            named.update(flags)
            named.update(fixed)
            if config.pre_hook is not None:
                config.pre_hook(named)
            if launch(grid(named), [named[name] for name in self.names]):
                return config
        compiled = self.tuner[grid](*args, **flags)
        config = self.tuner.best_config
        if entry is None or entry[0] is not self.tuner.configs:
            self._keep(key, compiled, config, args, flags)
        return config

    def _keep(self, key, compiled, config: triton.Config, args, flags) -> None:
        """The entry of `key`: the config, the compiled kernel's launcher and the constexprs the
        call does not pass (the config's blocks, the heuristics' values, computed as Triton does)."""
        named = {**dict(zip(self.names, args)), **flags, **config.kwargs}
        fixed = dict(config.kwargs)
        for name, heuristic in self.heuristics.items():
            fixed[name] = named[name] = heuristic(named)
        launch = direct_launcher(compiled)
        if launch is None or any(name not in named for name in self.names):
            return  # this kernel always goes through the JIT
        if len(self.entries) >= MAX_KEYS:
            self.entries.clear()
        self.entries[key] = (self.tuner.configs, config, launch, fixed)
