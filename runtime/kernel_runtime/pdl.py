"""Programmatic dependent launch (PDL): a kernel starts while the one before it finishes.

On Hopper and later GPUs a kernel launched with PDL may be scheduled as soon as every program of
the kernel before it on the stream has signalled, instead of after that kernel has drained; it
then waits, on the GPU, for that kernel's writes before it reads or writes memory. What that
hides is the gap between two kernels (launch latency and the ragged end of the last wave), a
microsecond or less each: it matters where kernels are that short, as in a decode step.

A kernel takes part by declaring `PDL: tl.constexpr = False` and calling `pdl_entry(PDL)` before
it touches memory; its launcher fixes `PDL=pdl_supported()`, and a Launch with PDL fixed true
launches with the attribute. A kernel that takes part must wait in every program (a dependent
that never waited could outrun its predecessor's predecessor). Kernels without the parameter, and
torch's, launch as before: the stream orders them as usual.

Off under the interpreter, on GPUs before sm_90, with a Triton that lacks it (2.2), and when the
environment sets TRITONFORMER_PDL=0 before the first call.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .compat import INTERPRETING

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_PDL = True
except ImportError:  # pragma: no cover - Triton < 3.4
    HAS_PDL = False

    @triton.jit
    def gdc_launch_dependents():
        pass

    @triton.jit
    def gdc_wait():
        pass


@functools.lru_cache(maxsize=1)
def pdl_supported() -> bool:
    """Whether kernels that take part launch with PDL in this process: a Triton with it, compiled
    kernels, every visible GPU sm_90 or later (plans do not key on the device), not turned off."""
    if INTERPRETING or not HAS_PDL or os.environ.get("TRITONFORMER_PDL", "1") == "0":
        return False
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    count = torch.cuda.device_count()
    return count > 0 and all(torch.cuda.get_device_capability(i) >= (9, 0) for i in range(count))


@triton.jit
def pdl_entry(PDL: tl.constexpr):
    """A kernel's first statement: let the next kernel launch, then wait for the previous one's writes."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
