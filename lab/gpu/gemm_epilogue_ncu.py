"""The TMA gemm kernel's epilogue under Nsight Compute: where a two-program config's GELU goes.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats python3 lab/gpu/gemm_epilogue_ncu.py

Run 91 measured the bias + GELU epilogue at +2.8 % over the plain product on the one-program
128x256 config and +12-15 % on the two-program 128x128 ones (16384x8192x2048), far more than its
math. This launches, configs pinned, the plain and the bias + GELU forward of that product on
both kinds of config, each once inside the profiled range (after an unprofiled warm-up that
compiles it), in the order printed. A lab tool for the GPU runs recorded in NOTES.md.
"""

from __future__ import annotations

import torch
from gemm_kernel_ab import _config, _pinned_launch

from fused_gemm.kernels import matmul_tma
from fused_gemm.kernels.common import ACTIVATION_CODES

M, K, N = 16384, 8192, 2048
CONFIGS = [(128, 128, 4, 3, 2), (128, 256, 8, 3, 1)]


def main() -> None:
    kernel = matmul_tma._matmul_tma_kernel
    all_configs = list(kernel.configs)
    a = torch.randn(1, M, K, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(N, K, device="cuda") / K**0.5).to(torch.bfloat16).t().unsqueeze(0)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
    calls = []
    for shape in CONFIGS:
        for label, kwargs in (
            ("plain", dict(bias=None, activation=0, z=None, split=1)),
            ("+bias gelu", dict(bias=bias, activation=ACTIVATION_CODES["gelu"], z=None, split=1)),
        ):
            kernel.configs = all_configs
            calls.append(
                (
                    "{}x{} w{} s{} p{}".format(*shape) + f" {label}",
                    _pinned_launch(kernel, _config(kernel, *shape), a, b, c, kwargs),
                )
            )
    for _, call in calls:
        call()
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, call in calls:
        print("profiled:", name, flush=True)
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    kernel.configs = all_configs


if __name__ == "__main__":
    main()
