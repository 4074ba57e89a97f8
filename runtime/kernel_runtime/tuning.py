"""Autotuned kernels launched through plans: Triton's autotuner picks a config once per plan, a
Launch of that config runs every later call.

Triton's autotuner keeps the call it is tuning and the config it ran last on itself (`nargs`,
`best_config`), so two threads inside it at once can prune with each other's arguments, and a
thread that reads `best_config` after its launch can get another thread's config (and launch a
follow-up kernel with another config's block sizes). Here the autotuner runs only under its
kernel's lock, for a plan's first call: the config it chose is read inside the lock, and a Launch
of the JIT kernel with that config's block sizes, heuristics and grid is published with it,
whole, in a PublishedCache keyed by the plan. Every later call launches through that Launch.

The tuning policy is the autotuner's own (its configs, pruning, timing and restore_value). A
kernel whose config list is replaced (tests pin one by monkeypatching it) starts a new table, so
that each plan is tuned again over the new list.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

import triton
from triton.runtime.autotuner import Heuristics

from .cache import PublishedCache
from .compat import descriptor_like, tensor_descriptor
from .launch import Launch, launch_options

# Entries kept per kernel before its table starts over (a training run meets a handful of plans).
MAX_ENTRIES = 1024

# The tile of the descriptors handed to the autotuner: each config's pre_hook sets its own.
PLACEHOLDER_TILE = (16, 16)

# (shape, strides) of the TMA descriptor a per-call parameter takes, or None for a pointer.
DescriptorSpec = Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]


@dataclasses.dataclass(frozen=True, eq=False)
class TunedPlan:
    """One launch of an autotuned kernel as a plan fixes it; its tensors come per call.

    fixed: every other argument of the call (sizes, strides, flags), as (name, value) pairs.
    tensors: the per-call parameters, in signature order.
    grid: grid(meta) from the arguments, the config's block sizes and the heuristics' values.
    descriptors: per tensor parameter, the (shape, strides) of the TMA descriptor it takes, or
        None for a pointer; None for a kernel without descriptors.
    follow: follow(meta) -> what the launcher needs to know of the chosen config (or None).
    Compared by identity: plans come from lru_cache'd builders.
    """

    kernel: TunedKernel
    fixed: Tuple[Tuple[str, Any], ...]
    tensors: Tuple[str, ...]
    grid: Callable[[dict], Tuple[int, ...]]
    descriptors: Optional[Tuple[DescriptorSpec, ...]] = None
    follow: Optional[Callable[[dict], Any]] = None


class Tuned(NamedTuple):
    """A plan's chosen config, the Launch made of it, the descriptors' templates (their tiles
    set by the config; None for a kernel without descriptors) and what plan.follow made of it."""

    config: triton.Config
    launch: Launch
    descriptors: Optional[Tuple[Any, ...]]
    extra: Any


class TunedKernel:
    """A triton.autotune kernel (over triton.heuristics or not), tuned once per plan."""

    __slots__ = ("tuner", "jit", "heuristics", "names", "_lock", "_table")

    def __init__(self, tuner) -> None:
        self.tuner = tuner
        self.heuristics = {}
        fn = tuner.fn
        while isinstance(fn, Heuristics):
            self.heuristics.update(fn.values)
            fn = fn.fn
        self.jit = fn
        self.names: Tuple[str, ...] = tuple(fn.arg_names)
        self._lock = threading.Lock()
        # (the config list the entries were tuned over, the entries by plan, the same in order of
        # publication), replaced whole under the lock.
        self._table = (None, PublishedCache(MAX_ENTRIES), ())

    def __call__(self, plan: TunedPlan, *tensors) -> Tuned:
        """Launches `plan` on `tensors` (its per-call arguments, in order); returns its entry."""
        entry = self.entry(plan)
        if entry is None:
            return self.tune(plan, tensors)
        self.run(entry, tensors)
        return entry

    def entry(self, plan: TunedPlan) -> Optional[Tuned]:
        """The published entry of `plan`, or None while it is untuned."""
        configs, entries, _ = self._table
        return entries.get(plan) if configs is self.tuner.configs else None

    @staticmethod
    def run(entry: Tuned, tensors: Sequence) -> None:
        """Launches a published entry: its descriptors made over `tensors` from their templates."""
        if entry.descriptors is None:
            entry.launch(*tensors)
        else:
            entry.launch(*[t if d is None else descriptor_like(d, t) for d, t in zip(entry.descriptors, tensors)])

    def tune(self, plan: TunedPlan, tensors: Sequence) -> Tuned:
        """The first call of `plan`: the autotuner chooses (timing the candidates on `tensors`)
        and launches, under the lock; or, where another thread has just tuned `plan`, its entry
        launches."""
        with self._lock:
            configs = self.tuner.configs
            if self._table[0] is not configs:
                self._table = (configs, PublishedCache(MAX_ENTRIES), ())
            _, entries, published = self._table
            entry = entries.get(plan)
            if entry is None:
                named = dict(plan.fixed)
                for name, spec, tensor in zip(plan.tensors, plan.descriptors or [None] * len(tensors), tensors):
                    named[name] = tensor if spec is None else tensor_descriptor(tensor, *spec, list(PLACEHOLDER_TILE))
                config = self._autotune(plan, named, configs)
                entry = entries.publish(plan, self._entry(plan, named, config))
                # The cache starts over as it passes MAX_ENTRIES; so does the list.
                self._table = (configs, entries, (*published, entry) if len(published) < MAX_ENTRIES else (entry,))
                return entry
        self.run(entry, tensors)
        return entry

    def _autotune(self, plan: TunedPlan, named: dict, configs) -> triton.Config:
        """One launch through the autotuner; the config it chose for it. The arguments before the
        first one a config or heuristic sets go positionally (what early_config_prune sees)."""
        tuned = set(configs[0].kwargs) | set(self.heuristics)
        cut = next(i for i, name in enumerate(self.names) if name in tuned)
        positional = [named[name] for name in self.names[:cut]]
        keywords = {name: named[name] for name in self.names[cut:] if name in named}
        self.tuner[plan.grid](*positional, **keywords)
        return self.tuner.best_config

    def _entry(self, plan: TunedPlan, named: dict, config: triton.Config) -> Tuned:
        """The Launch of `config` for `plan`: its block sizes, the heuristics' values computed as
        Triton does, its grid, and the descriptors' templates with the tiles its pre_hook sets."""
        fixed = dict(plan.fixed, **config.kwargs)
        meta = {**named, **fixed}
        for name, heuristic in self.heuristics.items():
            fixed[name] = meta[name] = heuristic(meta)
        templates = None
        if plan.descriptors is not None:
            by_name = {
                name: tensor_descriptor(None, *spec, list(PLACEHOLDER_TILE))
                for name, spec in zip(plan.tensors, plan.descriptors)
                if spec is not None
            }
            if config.pre_hook is not None:
                config.pre_hook({**meta, **by_name})
            templates = tuple(by_name.get(name) for name in plan.tensors)
        launch = Launch(self.jit, plan.grid(meta), **launch_options(config), **fixed)
        return Tuned(config, launch, templates, plan.follow(meta) if plan.follow is not None else None)

    def entries(self) -> Tuple[Tuned, ...]:
        """The entries published over the current config list, in order."""
        configs, _, published = self._table
        return published if configs is self.tuner.configs else ()

    def clear(self) -> None:
        """Forget every plan's choice (the autotuner keeps its own cache of timings)."""
        with self._lock:
            self._table = (None, PublishedCache(MAX_ENTRIES), ())

    def __len__(self) -> int:
        """Plans tuned over the current config list."""
        return len(self.entries())


# Products of at most SKINNY_ROWS rows (a decode step's tokens) read each weight element for a few
# multiply-adds: the weights' bytes bound them, not the tensor cores. Kernels give them tiles of
# their own, SKINNY_ROWS tall, and time only those there.
SKINNY_ROWS = 16


def skinny_problem(rows: int, element_size: int) -> bool:
    """A product those tiles serve: at most SKINNY_ROWS rows of 16-bit operands (fp32 keeps the
    other tiles, whose K steps the kernels' two-level fp32 sums were sized for)."""
    return rows <= SKINNY_ROWS and element_size == 2


def configs_for_rows(configs: Sequence[triton.Config], rows: int, element_size: int, block: str = "BLOCK_M") -> list:
    """The skinny tiles (`block` == SKINNY_ROWS) for a skinny problem, the others for the rest; the
    whole list where it has none of that kind (a test's pinned config)."""
    skinny = skinny_problem(rows, element_size)
    return [c for c in configs if (c.kwargs[block] == SKINNY_ROWS) == skinny] or list(configs)
