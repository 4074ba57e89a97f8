"""Programmatic dependent launch: the kernel entry compiles to the grid-dependency instructions only
where asked, Launch adds the launch attribute with it, and on a Hopper GPU a dependent kernel reads
what its predecessor wrote, eagerly and from a CUDA graph."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from tritonformer_testkit.aot import compile_to_asm, pdl_constexprs

from kernel_runtime import pdl
from kernel_runtime.launch import Launch
from kernel_runtime.pdl import pdl_entry, pdl_supported


@triton.jit
def slow_write_kernel(out_ptr, n_steps, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[i] = i + 1 after a dependent chain of n_steps multiply-adds (long enough that a reader
    which did not wait would see the old values)."""
    pdl_entry(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = offs.to(tl.float32)
    for _ in range(n_steps):
        x = x * 0.5 + offs.to(tl.float32) * 0.5
    tl.store(out_ptr + offs, x + 1.0)


@triton.jit
def read_kernel(src_ptr, dst_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_entry(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs) * 2.0)


def test_launch_adds_the_attribute_only_with_pdl_fixed_true():
    assert Launch(read_kernel, (1,), BLOCK=8, PDL=True).options.get("launch_pdl") is True
    assert "launch_pdl" not in Launch(read_kernel, (1,), BLOCK=8, PDL=False).options
    assert "launch_pdl" not in Launch(read_kernel, (1,), BLOCK=8).options


def test_not_supported_without_a_compiled_hopper_gpu(monkeypatch):
    """Off under the interpreter, where the instructions cannot run, and when the environment turns it off."""
    pdl_supported.cache_clear()
    try:
        monkeypatch.setattr(pdl, "INTERPRETING", True)
        assert pdl_supported() is False
        pdl_supported.cache_clear()
        monkeypatch.setattr(pdl, "INTERPRETING", False)
        monkeypatch.setenv("TRITONFORMER_PDL", "0")
        assert pdl_supported() is False
        pdl_supported.cache_clear()
        monkeypatch.delenv("TRITONFORMER_PDL")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        capabilities = {0: (9, 0), 1: (8, 0)}
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: capabilities[i])
        monkeypatch.setattr(torch.version, "hip", None)
        assert pdl_supported() is False  # an sm_80 beside the sm_90: plans do not key on the device
        pdl_supported.cache_clear()
        capabilities[1] = (9, 0)
        assert pdl_supported() is pdl.HAS_PDL
    finally:
        pdl_supported.cache_clear()


@pytest.mark.aot
@pytest.mark.parametrize("enabled", [False, True])
def test_the_entry_compiles_to_the_grid_dependency_instructions_only_when_asked(enabled):
    if not pdl.HAS_PDL:
        pytest.skip("this Triton has no grid dependency control (griddepcontrol arrived after Triton 2.2)")
    assert pdl_constexprs(90) == {"PDL": True} and pdl_constexprs(80) == {"PDL": False}
    ptx = compile_to_asm(
        read_kernel, signature={"src_ptr": "*fp32", "dst_ptr": "*fp32"}, constexprs={"BLOCK": 128, "PDL": enabled},
        arch=90,
    )["ptx"]  # fmt: skip
    assert ("griddepcontrol.wait" in ptx) is enabled
    assert ("griddepcontrol.launch_dependents" in ptx) is enabled


@pytest.mark.gpu("programmatic dependent launch needs a Hopper GPU")
@pytest.mark.parametrize("graphed", [False, True])
def test_a_dependent_kernel_reads_its_predecessors_writes(graphed):
    if not pdl_supported():
        pytest.skip("needs sm_90 or later and a Triton with programmatic dependent launch")
    n, block = 132 * 8 * 128, 128
    grid = (n // block,)
    writes = Launch(slow_write_kernel, grid, BLOCK=block, PDL=True)
    reads = Launch(read_kernel, grid, BLOCK=block, PDL=True)
    src = torch.zeros(n, device="cuda")
    dst = torch.full((n,), float("nan"), device="cuda")

    def chain():
        src.zero_()
        writes(src, 4000)
        reads(src, dst)

    chain()  # compiles both
    torch.cuda.synchronize()
    if graphed:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain()
        dst.fill_(float("nan"))
        graph.replay()
    else:
        dst.fill_(float("nan"))
        chain()
    torch.cuda.synchronize()
    expected = (torch.arange(n, device="cuda", dtype=torch.float32) + 1.0) * 2.0
    torch.testing.assert_close(dst, expected, rtol=1e-6, atol=1e-3)
