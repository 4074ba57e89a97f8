"""Where the SwiGLU MLP's epilogue time goes, at the headline (x 16384 x 2048 -> 5632, bf16, H100).

Lab tool (GPU only; not part of the package): variants of the two kernels whose epilogues cost
the most, each checked against torch and timed beside the shipped kernel in interleaved rounds.

Forward (persistent, TMA operand loads), with g and u saved for the backward:
  tma3     the shipped scheme: h, g, u each by TMA store (Triton gives the three stores one
           staging buffer and waits for each store's shared-memory read before the next)
  ptr_gu   h by TMA store, g and u by pointer stores from registers (no staging waits)
  ptr3     all three by pointer stores
  h_only   h alone by TMA store (what the forward costs without saving g and u)
  flat3    tma3 with the (tile, k) loop flattened by hand (not yet run on a GPU)
Down-projection backward (dh = dy @ w_down^T, the SwiGLU backward as its epilogue):
  shipped  the package's pointer kernel, autotuned
  tma_ld   operand tiles by TMA, the shipped epilogue (dh parked in h, then row slices)
  tma_reg  operand tiles by TMA, g and u loaded before the main loop, one pass from registers
Weight gradients (dw_gate, dw_up = x^T @ (d_gate, d_up), the shipped last-wave split):
  shipped  the package's pointer kernel, autotuned
  tma      operand tiles by TMA (x's tile transposed in shared memory), the same split

    PYTHONPATH=... python lab/gpu/swiglu_epilogue_diag.py
"""

import itertools
import statistics
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

from fused_swiglu.kernels.activation import SILU, _swiglu, _swiglu_backward_tile, _swiglu_grads
from fused_swiglu.kernels.backward import _weight_grad_reduce_kernel, _weight_grad_work
from fused_swiglu.kernels.configs import weight_grad_split
from fused_swiglu.kernels.matmul import _grouped_tile
from fused_swiglu.ops.launchers import launch_forward, mlp_down_grad_, swiglu_weight_grad, use_tma_forward

M, K, N = 16384, 2048, 5632
SMS = torch.cuda.get_device_properties(0).multi_processor_count


@triton.jit
def fwd_variant(x_desc, wg_desc, wu_desc, h_desc, g_desc, u_desc, h_ptr, g_ptr, u_ptr, M, N, K,
                MODE: tl.constexpr, NUM_SMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS):
        pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, tl.cdiv(K, BLOCK_K)):
            off_k = step * BLOCK_K
            x = x_desc.load([off_m, off_k])
            acc_g = tl.dot(x, wg_desc.load([off_k, off_n]), acc_g)
            acc_u = tl.dot(x, wu_desc.load([off_k, off_n]), acc_u)
        h = _swiglu(acc_g, acc_u, SILU)
        if MODE == 0:  # tma3
            h_desc.store([off_m, off_n], h.to(h_desc.dtype))
            g_desc.store([off_m, off_n], acc_g.to(g_desc.dtype))
            u_desc.store([off_m, off_n], acc_u.to(u_desc.dtype))
        elif MODE == 3:  # h_only
            h_desc.store([off_m, off_n], h.to(h_desc.dtype))
        else:
            rows = off_m + tl.arange(0, BLOCK_M)
            cols = off_n + tl.arange(0, BLOCK_N)
            mask = (rows[:, None] < M) & (cols[None, :] < N)
            offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
            if MODE == 1:  # ptr_gu
                h_desc.store([off_m, off_n], h.to(h_desc.dtype))
            else:  # ptr3
                tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=mask)
            tl.store(g_ptr + offs, acc_g.to(h_ptr.dtype.element_ty), mask=mask)
            tl.store(u_ptr + offs, acc_u.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fwd_flat_variant(x_desc, wg_desc, wu_desc, h_desc, g_desc, u_desc, M, N, K, NUM_SMS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr):  # fmt: skip
    """tma3 with the (tile, k) loop flattened by hand, as fused-gemm 0.2.2's TMA kernel: the next
    tile's operand loads can then be in flight while this tile's epilogue runs."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    pid = tl.program_id(0)
    zero = pid * 0
    tile = pid - NUM_SMS
    ki = zero - 1
    off_m = zero
    off_n = zero
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, tl.cdiv(num_tiles - pid, NUM_SMS) * k_tiles):
        ki = tl.where(ki == k_tiles - 1, 0, ki + 1)
        if ki == 0:
            tile += NUM_SMS
            pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
        off_k = ki * BLOCK_K
        x = x_desc.load([off_m, off_k])
        acc_g = tl.dot(x, wg_desc.load([off_k, off_n]), acc_g)
        acc_u = tl.dot(x, wu_desc.load([off_k, off_n]), acc_u)
        if ki == k_tiles - 1:
            h_desc.store([off_m, off_n], _swiglu(acc_g, acc_u, SILU).to(h_desc.dtype))
            g_desc.store([off_m, off_n], acc_g.to(g_desc.dtype))
            u_desc.store([off_m, off_n], acc_u.to(u_desc.dtype))
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def down_variant(dy_desc, wd_desc, g_ptr, u_ptr, h_ptr, M, N, D, MODE: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_M: tl.constexpr,
                 EPILOGUE_M: tl.constexpr):  # fmt: skip
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    if MODE == 1:  # tma_reg: g, u issued before the main loop
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        u = tl.load(u_ptr + offs, mask=mask, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, tl.cdiv(D, BLOCK_D)):
        off_d = step * BLOCK_D
        acc = tl.dot(dy_desc.load([off_m, off_d]), wd_desc.load([off_n, off_d]).T, acc)
    if MODE == 1:
        d_gate, d_up, h = _swiglu_grads(acc, g.to(tl.float32), u.to(tl.float32), SILU)
        tl.store(g_ptr + offs, d_gate.to(h_ptr.dtype.element_ty), mask=mask)
        tl.store(u_ptr + offs, d_up.to(h_ptr.dtype.element_ty), mask=mask)
        tl.store(h_ptr + offs, h.to(h_ptr.dtype.element_ty), mask=mask)
    else:  # tma_ld: the shipped epilogue
        tl.store(h_ptr + offs, acc.to(h_ptr.dtype.element_ty), mask=mask)
        tl.debug_barrier()
        for start in tl.static_range(0, BLOCK_M, EPILOGUE_M):
            offs_slice = off_m + start + tl.arange(0, EPILOGUE_M)
            _swiglu_backward_tile(h_ptr, g_ptr, u_ptr, h_ptr, N, 1, N, offs_slice, offs_n, M, N, True, False, SILU)


@triton.jit
def wgrad_variant(x_desc, dg_desc, du_desc, dwg_ptr, dwu_ptr, ws_ptr, M, N, K, split, NUM_SMS: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                  GROUP_K: tl.constexpr):  # fmt: skip
    tile, r_begin, r_end, part_program = _weight_grad_work(
        tl.program_id(0), M, K, N, split, NUM_SMS, BLOCK_K, BLOCK_N, BLOCK_M
    )
    pid_k, pid_n = _grouped_tile(tile, K, N, BLOCK_K, BLOCK_N, GROUP_K)
    off_k = pid_k * BLOCK_K
    off_n = pid_n * BLOCK_N
    acc_g = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for off_m in range(r_begin, r_end, BLOCK_M):
        xt = x_desc.load([off_m, off_k]).T
        acc_g = tl.dot(xt, dg_desc.load([off_m, off_n]), acc_g)
        acc_u = tl.dot(xt, du_desc.load([off_m, off_n]), acc_u)
    if part_program < 0:
        offs_k = off_k + tl.arange(0, BLOCK_K)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
        offs = offs_k.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(dwg_ptr + offs, acc_g.to(dwg_ptr.dtype.element_ty), mask=mask)
        tl.store(dwu_ptr + offs, acc_u.to(dwu_ptr.dtype.element_ty), mask=mask)
    else:
        tile_offs = tl.arange(0, BLOCK_K)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        ws_tile = ws_ptr + part_program.to(tl.int64) * (2 * BLOCK_K * BLOCK_N) + tile_offs
        tl.store(ws_tile, acc_g)
        tl.store(ws_tile + BLOCK_K * BLOCK_N, acc_u)


def rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def timed_rounds(fns, rounds=5):
    """name -> median over rounds of do_bench medians; providers interleaved each round."""
    times = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in order:
            times[name].append(do_bench(fns[name], warmup=25, rep=100, return_mode="median"))
    return {name: statistics.median(t) for name, t in times.items()}


def admit_if_correct(fns, name, run, prepare, checks):
    """Runs `run` once after `prepare()` (poisons outputs, restores inputs), compares each (out,
    ref) of `checks` by rel_err, and adds it to `fns` (to be timed) only when every error is under
    1e-2; a config that fails to launch, or computes wrong, is reported and left out."""
    prepare()
    try:
        run()
        torch.cuda.synchronize()
    except Exception as error:  # a config that does not fit: report and go on
        print(f"{name}: {type(error).__name__}: {str(error)[:200]}")
        return
    errs = [rel_err(out, ref) for out, ref in checks]
    print(f"{name}: errors {[format(e, '.2e') for e in errs]}")
    if max(errs) > 1e-2 or any(e != e for e in errs):
        print(f"{name}: WRONG, not timed")
        return
    fns[name] = run


def forward_section(x, wg, wu):
    h, g, u = (torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref_g, ref_u = (x.float() @ wg.float()), (x.float() @ wu.float())
    ref_h = torch.nn.functional.silu(ref_g) * ref_u
    fns = {"shipped (autotuned)": lambda: launch_forward(x, wg, wu, None, None, h, g, u, True, False, True)}
    fns["shipped (autotuned)"]()
    print("shipped forward error h/g/u", rel_err(h, ref_h), rel_err(g, ref_g), rel_err(u, ref_u))
    names = {0: "tma3", 1: "ptr_gu", 2: "ptr3", 3: "h_only", 4: "flat3"}
    for mode, (bm, bn, bk, stages) in itertools.product(
        (0, 1, 2, 3, 4), [(128, 128, 64, 3), (128, 128, 64, 4), (128, 128, 32, 5)]
    ):
        blocks = ((x, [bm, bk]), (wg, [bk, bn]), (wu, [bk, bn]), (h, [bm, bn]), (g, [bm, bn]), (u, [bm, bn]))
        descs = [TensorDescriptor.from_tensor(t, block) for t, block in blocks]
        grid = (min(SMS, triton.cdiv(M, bm) * triton.cdiv(N, bn)),)

        def run(descs=descs, grid=grid, mode=mode, bm=bm, bn=bn, bk=bk, stages=stages):
            if mode == 4:
                fwd_flat_variant[grid](*descs, M, N, K, NUM_SMS=grid[0], BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                       GROUP_M=8, num_warps=8, num_stages=stages)  # fmt: skip
                return
            fwd_variant[grid](*descs, h, g, u, M, N, K, MODE=mode, NUM_SMS=grid[0], BLOCK_M=bm, BLOCK_N=bn,
                              BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=stages)  # fmt: skip

        checks = [(h, ref_h)] + ([] if mode == 3 else [(g, ref_g), (u, ref_u)])
        poison = lambda: [t.fill_(float("nan")) for t in (h, g, u)]  # noqa: E731
        admit_if_correct(fns, f"{names[mode]} {bm}x{bn}x{bk} s{stages}", run, poison, checks)
    return fns


def down_section(dy, wd):
    g0, u0 = (torch.randn(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dh_ref = dy.float() @ wd.float().t()
    sig = torch.sigmoid(g0.float())
    silu = g0.float() * sig
    ref = (dh_ref * u0.float() * sig * (1 + g0.float() * (1 - sig)), dh_ref * silu, silu * u0.float())
    g, u = g0.clone(), u0.clone()
    h = mlp_down_grad_(dy, wd, g, u, SILU)
    print("shipped down errors", [f"{rel_err(a, b):.2e}" for a, b in zip((g, u, h), ref)])
    fns = {"shipped (autotuned)": lambda: mlp_down_grad_(dy, wd, g, u, SILU)}
    hbuf = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for mode, (bm, bn, bd, stages, warps, epi) in itertools.product(
        (0, 1),
        [(128, 128, 64, 3, 8, 32), (128, 128, 64, 3, 8, 16), (128, 128, 64, 3, 8, 64), (128, 128, 64, 3, 4, 32),
         (128, 128, 64, 2, 8, 32), (256, 128, 64, 3, 8, 32), (128, 256, 64, 4, 8, 32)],
    ):  # fmt: skip
        if mode == 1 and (bn == 256 or bm == 256 or epi != 32):
            continue  # g, u and a 128x256 accumulator do not fit in registers
        dy_desc = TensorDescriptor.from_tensor(dy, [bm, bd])
        wd_desc = TensorDescriptor.from_tensor(wd, [bn, bd])
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)

        def run(dy_desc=dy_desc, wd_desc=wd_desc, grid=grid, mode=mode, bm=bm, bn=bn, bd=bd, stages=stages,
                warps=warps, epi=epi):  # fmt: skip
            down_variant[grid](dy_desc, wd_desc, g, u, hbuf, M, N, dy.shape[1], MODE=mode, BLOCK_M=bm, BLOCK_N=bn,
                               BLOCK_D=bd, GROUP_M=8, EPILOGUE_M=epi, num_warps=warps, num_stages=stages)  # fmt: skip

        name = f"{'tma_reg' if mode else 'tma_ld'} {bm}x{bn}x{bd} s{stages} w{warps} e{epi}"
        restore = lambda: (g.copy_(g0), u.copy_(u0), hbuf.fill_(float("nan")))  # noqa: E731
        admit_if_correct(fns, name, run, restore, list(zip((g, u, hbuf), ref)))
    cublas = lambda: torch.mm(dy, wd.t())  # noqa: E731
    fns["cuBLAS dy @ w_down^T"] = cublas
    return fns


def wgrad_section(x, dg, du):
    ref_g, ref_u = x.float().t() @ dg.float(), x.float().t() @ du.float()
    dwg, dwu = swiglu_weight_grad(x, dg, du, x.dtype)
    print("shipped wgrad errors", rel_err(dwg, ref_g), rel_err(dwu, ref_u))
    fns = {"shipped (autotuned)": lambda: swiglu_weight_grad(x, dg, du, x.dtype)}
    dwg, dwu = (torch.empty(K, N, device="cuda", dtype=x.dtype) for _ in range(2))
    for bk, bn, bm, stages, warps, use_split in [
        (128, 128, 64, 3, 8, True), (128, 128, 64, 3, 8, False), (128, 128, 64, 4, 8, True),
        (128, 128, 32, 5, 8, True), (128, 64, 64, 4, 4, True),
    ]:  # fmt: skip
        tiles = triton.cdiv(K, bk) * triton.cdiv(N, bn)
        split = weight_grad_split(tiles, SMS, triton.cdiv(M, bm)) if use_split else 1
        ws = torch.empty(max((tiles % SMS) * split * 2 * bk * bn, 1), device="cuda", dtype=torch.float32)
        descs = [TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(dg, [bm, bn]),
                 TensorDescriptor.from_tensor(du, [bm, bn])]  # fmt: skip
        grid = (tiles + (tiles % SMS) * (split - 1),)

        def run(descs=descs, grid=grid, ws=ws, split=split, bk=bk, bn=bn, bm=bm, stages=stages, warps=warps,
                tails=tiles % SMS):  # fmt: skip
            wgrad_variant[grid](*descs, dwg, dwu, ws, M, N, K, split, NUM_SMS=SMS, BLOCK_K=bk, BLOCK_N=bn,
                                BLOCK_M=bm, GROUP_K=8, num_warps=warps, num_stages=stages)  # fmt: skip
            if split > 1:
                reduce = _weight_grad_reduce_kernel[(tails, 2)]
                reduce(ws, dwg, dwu, N, N, K, split, UPCAST=False, NUM_SMS=SMS, BLOCK_K=bk, BLOCK_N=bn, GROUP_K=8,
                       ROWS=32, num_warps=4)  # fmt: skip

        poison = lambda: (dwg.fill_(float("nan")), dwu.fill_(float("nan")))  # noqa: E731
        admit_if_correct(fns, f"tma {bk}x{bn}x{bm} s{stages} w{warps} split{split}", run, poison,
                         [(dwg, ref_g), (dwu, ref_u)])  # fmt: skip
    dcat = torch.cat([dg, du], 1)
    fns["cuBLAS x^T @ [dg|du]"] = lambda: torch.mm(x.t(), dcat)
    return fns


def main():
    """Every section, or those named on the command line (forward, down-projection, weight)."""
    torch.manual_seed(0)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(M, K, **bf16)
    only = sys.argv[1:]
    sections = []
    if not only or "forward" in only:
        wg, wu = (torch.randn(K, N, **bf16) * K**-0.5 for _ in range(2))
        assert use_tma_forward(x, wg, wu)
        wcat = torch.cat([wg, wu], 1)
        fwd = forward_section(x, wg, wu)
        fwd["cuBLAS x @ [wg|wu]"] = lambda: torch.mm(x, wcat)
        sections.append(("forward", fwd, 4 * M * K * N))
    if not only or "down-projection" in only:
        dy = torch.randn(M, K, **bf16)
        wd = torch.randn(N, K, **bf16) * N**-0.5
        sections.append(("down-projection backward", down_section(dy, wd), 2 * M * K * N))
    if not only or "weight" in only:
        dg, du = (torch.randn(M, N, **bf16) for _ in range(2))
        sections.append(("weight gradients", wgrad_section(x, dg, du), 4 * M * K * N))
    for title, fns, flops in sections:
        times = timed_rounds(fns)
        print(f"\n{title} (ms, median of 5 interleaved do_bench medians; TFLOP/s)")
        for name, ms in sorted(times.items(), key=lambda kv: kv[1]):
            print(f"  {name:40s} {ms:.4f}  {flops / ms / 1e9:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
